//! `drain`: how the node is drained before a disruption (docs/config.md). Each operation may
//! override it in its parameters (`src/lifecycle/drain.rs`).

use super::{ConfigError, bad};
use crate::lifecycle::drain::{DrainPolicy, OnTimeout, parse_timeout};
use serde::{Deserialize, Serialize};

/// The configuration's `drain` as written; every key optional (the defaults a cautious
/// operator would choose: on, 10 minutes, fail at the timeout, keep emptyDir data and pods
/// without a controller).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DrainFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// `90s`, `10m`, `1h30m`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<String>,
    /// `Fail` or `Proceed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delete_empty_dir_data: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evict_unmanaged: Option<bool>,
}

impl DrainFile {
    pub fn validate(self) -> Result<DrainPolicy, ConfigError> {
        let base = DrainPolicy::default();
        let timeout_secs = match self.timeout.as_deref() {
            None => base.timeout_secs,
            Some(text) => parse_timeout(text).ok_or_else(|| {
                bad(
                    "drain.timeout",
                    "must be a duration such as 90s, 10m or 1h30m, at most 24h",
                )
            })?,
        };
        let on_timeout = match self.on_timeout.as_deref() {
            None => base.on_timeout,
            Some(text) => OnTimeout::parse(text)
                .ok_or_else(|| bad("drain.onTimeout", "must be \"Fail\" or \"Proceed\""))?,
        };
        Ok(DrainPolicy {
            enabled: self.enabled.unwrap_or(base.enabled),
            timeout_secs,
            on_timeout,
            delete_emptydir_data: self
                .delete_empty_dir_data
                .unwrap_or(base.delete_emptydir_data),
            evict_unmanaged: self.evict_unmanaged.unwrap_or(base.evict_unmanaged),
        })
    }

    /// The installed configuration's `drain`: only what differs from the defaults.
    pub fn of(policy: &DrainPolicy) -> Option<Self> {
        let base = DrainPolicy::default();
        let differs = |a: bool, b: bool| (a != b).then_some(a);
        let file = Self {
            enabled: differs(policy.enabled, base.enabled),
            timeout: (policy.timeout_secs != base.timeout_secs)
                .then(|| format!("{}s", policy.timeout_secs)),
            on_timeout: (policy.on_timeout != base.on_timeout)
                .then(|| policy.on_timeout.as_str().to_string()),
            delete_empty_dir_data: differs(policy.delete_emptydir_data, base.delete_emptydir_data),
            evict_unmanaged: differs(policy.evict_unmanaged, base.evict_unmanaged),
        };
        (file != Self::default()).then_some(file)
    }
}
