//! Drains: the policy an operation's drain follows, and which of the node's pods an eviction
//! moves (kubectl drain's rules). The executor (`src/exec/drain.rs`) runs the evictions.

use super::validate::InvalidParameter;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const PARAM_DRAIN: &str = "drain";
pub const PARAM_TIMEOUT: &str = "drainTimeout";
pub const PARAM_ON_TIMEOUT: &str = "drainOnTimeout";
pub const PARAM_EMPTYDIR: &str = "drainDeleteEmptyDirData";

/// The longest drain an operation may ask for.
const MAX_TIMEOUT_SECS: i64 = 24 * 3600;

/// What a drain does when its time is up with pods left.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OnTimeout {
    /// The operation fails, naming the pods left and the budgets that hold them; nothing is
    /// disrupted.
    Fail,
    /// The disruption goes ahead with the pods left on the node.
    Proceed,
}

impl OnTimeout {
    /// `Fail` or `Proceed`, as the configuration and the parameters spell them.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "Fail" => Some(Self::Fail),
            "Proceed" => Some(Self::Proceed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fail => "Fail",
            Self::Proceed => "Proceed",
        }
    }
}

/// How a node is drained before a disruption: the configuration's `drain` (defaults a
/// cautious operator would choose), overridden per operation by its parameters.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainPolicy {
    pub enabled: bool,
    pub timeout_secs: i64,
    pub on_timeout: OnTimeout,
    /// Pods with `emptyDir` volumes lose that data when evicted.
    pub delete_emptydir_data: bool,
    /// Pods no controller owns are gone for good when evicted.
    pub evict_unmanaged: bool,
}

impl Default for DrainPolicy {
    fn default() -> Self {
        Self {
            enabled: true,
            timeout_secs: 600,
            on_timeout: OnTimeout::Fail,
            delete_emptydir_data: false,
            evict_unmanaged: false,
        }
    }
}

impl DrainPolicy {
    /// No drain (`flexnode reset`, the operator's own command).
    pub fn off() -> Self {
        Self {
            enabled: false,
            ..Self::default()
        }
    }

    /// The same drain, going on at its timeout: for pods whose fate a Node's deletion has
    /// settled already (the deletion signal, a repave after the Node's deletion).
    pub fn going_on(&self) -> Self {
        Self {
            on_timeout: OnTimeout::Proceed,
            ..self.clone()
        }
    }

    /// This policy with an operation's overrides (`spec.parameters`); a value it cannot read
    /// is refused with a fixed message (it never echoes the value).
    pub fn with_parameters(
        &self,
        params: &BTreeMap<String, String>,
    ) -> Result<Self, InvalidParameter> {
        let flag = |key: &str, invalid: InvalidParameter| -> Result<Option<bool>, _> {
            match params.get(key).map(|v| v.trim()) {
                None => Ok(None),
                Some("true") => Ok(Some(true)),
                Some("false") => Ok(Some(false)),
                Some(_) => Err(invalid),
            }
        };
        let mut policy = self.clone();
        if let Some(enabled) = flag(PARAM_DRAIN, InvalidParameter::DrainNotBoolean)? {
            policy.enabled = enabled;
        }
        if let Some(delete) = flag(PARAM_EMPTYDIR, InvalidParameter::DrainEmptyDirNotBoolean)? {
            policy.delete_emptydir_data = delete;
        }
        if let Some(raw) = params.get(PARAM_TIMEOUT) {
            policy.timeout_secs =
                parse_timeout(raw).ok_or(InvalidParameter::DrainTimeoutInvalid)?;
        }
        if let Some(raw) = params.get(PARAM_ON_TIMEOUT) {
            policy.on_timeout =
                OnTimeout::parse(raw).ok_or(InvalidParameter::DrainOnTimeoutInvalid)?;
        }
        Ok(policy)
    }
}

/// A drain's timeout: a duration of at least a second and at most a day.
pub fn parse_timeout(text: &str) -> Option<i64> {
    parse_duration_secs(text.trim()).filter(|s| (1..=MAX_TIMEOUT_SECS).contains(s))
}

/// A Go-style duration of whole hours, minutes and seconds (`90s`, `10m`, `1h30m`).
pub fn parse_duration_secs(text: &str) -> Option<i64> {
    let mut total: i64 = 0;
    let mut digits = String::new();
    let mut units = 0;
    for c in text.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        let n: i64 = digits.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        digits.clear();
        units += 1;
    }
    (digits.is_empty() && units > 0).then_some(total)
}

/// Who holds the node's cordon: the Node carries it in an annotation, the store records it
/// before the cordon (`src/store/cordon.rs`), and only its holder lifts it.
pub fn holder_for_operation(uid: &str) -> String {
    format!("operation/{uid}")
}

/// The holder of a repave's cordon, for the goal it applies.
pub fn holder_for_repave(generation: i64) -> String {
    format!("repave/{generation}")
}

pub const HOLDER_DELETION: &str = "deletion-signal";

/// A repave's drain tells its progress on the Machine (it has no operation).
pub fn is_repave(holder: &str) -> bool {
    holder.starts_with("repave/")
}

/// A pod bound to the node, as the drain reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    /// `namespace/name`.
    pub name: String,
    pub owner: PodOwner,
    /// A static pod's mirror (`kubernetes.io/config.mirror`): the kubelet owns it.
    pub mirror: bool,
    /// `Succeeded` or `Failed`: nothing runs.
    pub finished: bool,
    pub emptydir: bool,
    /// Deleted already (an eviction accepted, or someone else): the drain waits for it.
    pub terminating: bool,
    /// What budgets select it by.
    pub labels: BTreeMap<String, String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOwner {
    DaemonSet,
    /// Another controller (ReplicaSet, StatefulSet, Job…) makes it again elsewhere.
    Controller,
    None,
}

/// What the drain does with a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodPlan {
    /// It stays (and does not hold the drain up).
    Keep,
    /// Deleted already: wait until it is gone.
    Wait,
    Evict,
    /// The policy forbids evicting it: the drain cannot finish while it runs.
    Refuse(&'static str),
}

/// kubectl drain's rules: DaemonSet pods and mirror pods stay (their controller or the
/// kubelet would put them back), finished pods hold nothing up, pods with `emptyDir` data and
/// pods without a controller only when the policy allows.
pub fn plan(pod: &PodFacts, policy: &DrainPolicy) -> PodPlan {
    if pod.mirror || pod.finished || pod.owner == PodOwner::DaemonSet {
        return PodPlan::Keep;
    }
    if pod.terminating {
        return PodPlan::Wait;
    }
    if pod.owner == PodOwner::None && !policy.evict_unmanaged {
        return PodPlan::Refuse(
            "no controller would make it again (the configuration's drain.evictUnmanaged)",
        );
    }
    if pod.emptydir && !policy.delete_emptydir_data {
        return PodPlan::Refuse("its emptyDir data would be lost (drainDeleteEmptyDirData)");
    }
    PodPlan::Evict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(owner: PodOwner) -> PodFacts {
        PodFacts {
            name: "default/web".into(),
            owner,
            mirror: false,
            finished: false,
            emptydir: false,
            terminating: false,
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn parameters_override_the_configuration() {
        let base = DrainPolicy::default();
        let params = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(base.with_parameters(&params(&[])), Ok(base.clone()));
        let set = base
            .with_parameters(&params(&[
                ("drain", "false"),
                ("drainTimeout", "1h30m"),
                ("drainOnTimeout", "Proceed"),
                ("drainDeleteEmptyDirData", "true"),
                ("downloadURL", "ignored by a drain"),
            ]))
            .expect("valid");
        assert!(!set.enabled && set.delete_emptydir_data);
        assert_eq!(
            (set.timeout_secs, set.on_timeout),
            (5400, OnTimeout::Proceed)
        );
        for (key, value, want) in [
            ("drain", "yes", InvalidParameter::DrainNotBoolean),
            ("drainTimeout", "7", InvalidParameter::DrainTimeoutInvalid),
            ("drainTimeout", "0h", InvalidParameter::DrainTimeoutInvalid),
            ("drainTimeout", "25h", InvalidParameter::DrainTimeoutInvalid),
            ("drainTimeout", "-5m", InvalidParameter::DrainTimeoutInvalid),
            (
                "drainTimeout",
                "99999999999999999999h",
                InvalidParameter::DrainTimeoutInvalid,
            ),
            (
                "drainOnTimeout",
                "fail",
                InvalidParameter::DrainOnTimeoutInvalid,
            ),
            (
                "drainDeleteEmptyDirData",
                "1",
                InvalidParameter::DrainEmptyDirNotBoolean,
            ),
        ] {
            let refused = base.with_parameters(&params(&[(key, value)]));
            assert_eq!(refused, Err(want), "{key}={value}");
            assert!(
                !want.message().contains(value),
                "the message never echoes the value"
            );
        }
    }

    #[test]
    fn kubectl_drain_rules() {
        let cautious = DrainPolicy::default();
        let bold = DrainPolicy {
            delete_emptydir_data: true,
            evict_unmanaged: true,
            ..DrainPolicy::default()
        };
        assert_eq!(plan(&pod(PodOwner::Controller), &cautious), PodPlan::Evict);
        assert_eq!(plan(&pod(PodOwner::DaemonSet), &bold), PodPlan::Keep);
        let mirror = PodFacts {
            mirror: true,
            ..pod(PodOwner::None)
        };
        assert_eq!(plan(&mirror, &bold), PodPlan::Keep);
        let done = PodFacts {
            finished: true,
            ..pod(PodOwner::None)
        };
        assert_eq!(plan(&done, &cautious), PodPlan::Keep);
        let going = PodFacts {
            terminating: true,
            ..pod(PodOwner::None)
        };
        assert_eq!(plan(&going, &cautious), PodPlan::Wait);
        assert!(matches!(
            plan(&pod(PodOwner::None), &cautious),
            PodPlan::Refuse(_)
        ));
        assert_eq!(plan(&pod(PodOwner::None), &bold), PodPlan::Evict);
        let scratch = PodFacts {
            emptydir: true,
            ..pod(PodOwner::Controller)
        };
        assert!(matches!(plan(&scratch, &cautious), PodPlan::Refuse(_)));
        assert_eq!(plan(&scratch, &bold), PodPlan::Evict);
    }
}
