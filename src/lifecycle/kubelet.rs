//! What the machines' kubelet is told beyond its credential: the node's kubelet settings
//! (the configuration's `kubelet:`) and the Machine's labels and taints, with the rules a
//! kubelet and the NodeRestriction admission hold them to. Checked here, before a tree is
//! built, so that a bad value fails the join or the repave with its name instead of a kubelet
//! that never starts.

use super::state::NodeSettings;
use super::validate::is_dns_subdomain;
use core::net::IpAddr;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The taint that tells the agent its node is being deleted (`src/reconcile/owner.rs`; the
/// key the AKS Flex Node agent uses): a Node registered with it would reset itself.
pub const DELETION_TAINT: &str = "kubernetes.azure.com/flex-node-deleting";

/// The kubelet's settings from the node's configuration, rendered into its
/// `KubeletConfiguration` (`src/effects/host/kubelet.rs`); the names are the kubelet's own.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct KubeletTuning {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pods: Option<u32>,
    /// `cpu`, `memory`, `ephemeral-storage`, `pid` → a quantity.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub system_reserved: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kube_reserved: BTreeMap<String, String>,
    /// A signal (`memory.available`, `nodefs.available`, …) → a quantity or a percentage.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub eviction_hard: BTreeMap<String, String>,
    #[serde(
        default,
        rename = "imageGCHighThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub image_gc_high_threshold_percent: Option<u8>,
    #[serde(
        default,
        rename = "imageGCLowThresholdPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub image_gc_low_threshold_percent: Option<u8>,
    /// The Node's address (`--node-ip`); absent: the host's address towards the API server.
    #[serde(default, rename = "nodeIP", skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<IpAddr>,
    #[serde(default, rename = "clusterDNS", skip_serializing_if = "Vec::is_empty")]
    pub cluster_dns: Vec<IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_domain: Option<String>,
}

/// The cluster domain when none is configured.
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// The kubelet's own defaults for the image GC thresholds.
const GC_HIGH_DEFAULT: u8 = 85;
const GC_LOW_DEFAULT: u8 = 80;
const RESERVABLE: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pid"];
const EVICTION_SIGNALS: [&str; 8] = [
    "memory.available",
    "nodefs.available",
    "nodefs.inodesFree",
    "imagefs.available",
    "imagefs.inodesFree",
    "containerfs.available",
    "containerfs.inodesFree",
    "pid.available",
];

impl KubeletTuning {
    /// The first setting that cannot work: its name under `kubelet.` and why.
    pub fn check(&self) -> Result<(), (String, String)> {
        let bad = |key: &str, why: String| Err((format!("kubelet.{key}"), why));
        if let Some(n) = self.max_pods
            && !(1..=2048).contains(&n)
        {
            return bad("maxPods", format!("{n} is not between 1 and 2048"));
        }
        for (setting, map) in [
            ("systemReserved", &self.system_reserved),
            ("kubeReserved", &self.kube_reserved),
        ] {
            for (resource, amount) in map {
                if !RESERVABLE.contains(&resource.as_str()) {
                    return bad(
                        setting,
                        format!(
                            "{resource:?} is not a resource a kubelet reserves ({})",
                            RESERVABLE.join(", ")
                        ),
                    );
                }
                if !is_quantity(amount) {
                    return bad(
                        &format!("{setting}.{resource}"),
                        format!("{amount:?} is not a quantity like 500m, 1Gi or 100"),
                    );
                }
            }
        }
        for (signal, threshold) in &self.eviction_hard {
            if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                return bad(
                    "evictionHard",
                    format!(
                        "{signal:?} is not an eviction signal ({})",
                        EVICTION_SIGNALS.join(", ")
                    ),
                );
            }
            if !is_quantity(threshold) && !is_percentage(threshold) {
                return bad(
                    &format!("evictionHard.{signal}"),
                    format!(
                        "{threshold:?} is neither a quantity like 100Mi nor a percentage like 10%"
                    ),
                );
            }
        }
        for (key, v) in [
            (
                "imageGCHighThresholdPercent",
                self.image_gc_high_threshold_percent,
            ),
            (
                "imageGCLowThresholdPercent",
                self.image_gc_low_threshold_percent,
            ),
        ] {
            if let Some(p) = v
                && p > 100
            {
                return bad(key, format!("{p} is not a percentage (0-100)"));
            }
        }
        let high = self
            .image_gc_high_threshold_percent
            .unwrap_or(GC_HIGH_DEFAULT);
        let low = self
            .image_gc_low_threshold_percent
            .unwrap_or(GC_LOW_DEFAULT);
        if low >= high {
            return bad(
                "imageGCLowThresholdPercent",
                format!(
                    "{low} must be below the high threshold ({high}{})",
                    if self.image_gc_high_threshold_percent.is_none() {
                        ", the kubelet's default"
                    } else {
                        ""
                    }
                ),
            );
        }
        if let Some(domain) = &self.cluster_domain
            && !is_dns_subdomain(domain)
        {
            return bad(
                "clusterDomain",
                format!("{domain:?} is not a DNS name like cluster.local"),
            );
        }
        Ok(())
    }
}

/// The Machine's labels and taints as a kubelet may register them: well-formed, no label in
/// the `kubernetes.io`/`k8s.io` namespaces except those a kubelet may set (the kubelet refuses
/// to start with any other, and the NodeRestriction admission would refuse the Node), and
/// not the deletion taint.
/// The refusal names the Machine's field.
pub fn check_node_settings(s: &NodeSettings) -> Result<(), String> {
    for (key, value) in &s.labels {
        if !is_label_key(key) {
            return Err(format!(
                "spec.kubernetes.nodeLabels: {key:?} is not a label key ([prefix/]name, the \
                 name at most 63 characters of letters, digits, '-', '_' and '.')"
            ));
        }
        if !is_label_value(value) {
            return Err(format!(
                "spec.kubernetes.nodeLabels.{key}: {value:?} is not a label value (at most 63 \
                 characters of letters, digits, '-', '_' and '.', starting and ending with a \
                 letter or digit)"
            ));
        }
        if !kubelet_may_set(key) {
            return Err(format!(
                "spec.kubernetes.nodeLabels: a kubelet may not set {key:?}: the NodeRestriction \
                 admission refuses labels in the kubernetes.io and k8s.io namespaces other than \
                 the kubelet's own (kubelet.kubernetes.io/, node.kubernetes.io/, the topology \
                 and instance-type labels); set it on the Node from the cluster instead"
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for taint in &s.taints {
        let shape = || {
            format!(
                "spec.kubernetes.registerWithTaints: {taint:?} is not key[=value]:Effect with \
                 Effect NoSchedule, PreferNoSchedule or NoExecute"
            )
        };
        let (key, value, effect) = taint_parts(taint).ok_or_else(shape)?;
        if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
            || !is_label_key(key)
            || !is_label_value(value)
        {
            return Err(shape());
        }
        if key == DELETION_TAINT {
            return Err(format!(
                "spec.kubernetes.registerWithTaints: {DELETION_TAINT} is the signal that the \
                 node is being deleted; a Node registered with it would reset itself"
            ));
        }
        if !seen.insert((key, effect)) {
            return Err(format!(
                "spec.kubernetes.registerWithTaints: {key}:{effect} is named twice (the API \
                 server refuses a Node with two taints of one key and effect)"
            ));
        }
    }
    Ok(())
}

/// A taint of `registerWithTaints` as the kubelet's configuration has it; `None` when it is
/// not `key[=value]:Effect` ([`check_node_settings`] refuses those first).
pub fn taint_parts(taint: &str) -> Option<(&str, &str, &str)> {
    let (kv, effect) = taint.rsplit_once(':')?;
    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
    Some((key, value, effect))
}

/// The labels a kubelet may set in the reserved namespaces (the kubelet's own list).
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
];

fn kubelet_may_set(key: &str) -> bool {
    let Some((prefix, _)) = key.split_once('/') else {
        return true;
    };
    let within = |ns: &str| prefix == ns || prefix.ends_with(&format!(".{ns}"));
    let reserved = within("kubernetes.io") || within("k8s.io");
    !reserved
        || KUBELET_LABELS.contains(&key)
        || within("kubelet.kubernetes.io")
        || within("node.kubernetes.io")
}

fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    prefix.is_none_or(is_dns_subdomain) && !name.is_empty() && is_label_value(name)
}

/// At most 63 characters of `[A-Za-z0-9_.-]`, starting and ending with a letter or digit;
/// empty is a value.
fn is_label_value(v: &str) -> bool {
    v.is_empty()
        || (v.len() <= 63
            && v.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && v.as_bytes()
                .first()
                .is_some_and(|b| b.is_ascii_alphanumeric())
            && v.as_bytes()
                .last()
                .is_some_and(|b| b.is_ascii_alphanumeric()))
}

/// A Kubernetes quantity as these settings use it: digits, an optional fraction, an
/// optional suffix (`m`, decimal `k M G T P E`, binary `Ki Mi Gi Ti Pi Ei`).
fn is_quantity(q: &str) -> bool {
    const SUFFIXES: [&str; 14] = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E", "",
    ];
    SUFFIXES.iter().any(|s| {
        q.strip_suffix(s).is_some_and(|n| {
            let (whole, frac) = n.split_once('.').unwrap_or((n, "0"));
            !whole.is_empty()
                && !frac.is_empty()
                && whole.len() <= 18
                && whole.bytes().all(|b| b.is_ascii_digit())
                && frac.bytes().all(|b| b.is_ascii_digit())
        })
    })
}

fn is_percentage(p: &str) -> bool {
    p.strip_suffix('%')
        .and_then(|n| n.parse::<f64>().ok())
        .is_some_and(|n| n.is_finite() && (0.0..=100.0).contains(&n) && !p.starts_with('+'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(labels: &[(&str, &str)], taints: &[&str]) -> NodeSettings {
        NodeSettings {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints: taints.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn labels_a_kubelet_may_set_pass_and_the_others_are_named() {
        for ok in [
            ("team", "blue"),
            ("example.com/pool", "gpu-a"),
            (
                "node.kubernetes.io/exclude-from-external-load-balancers",
                "",
            ),
            ("kubelet.kubernetes.io/managed", "true"),
            ("topology.kubernetes.io/zone", "lab-1"),
        ] {
            assert_eq!(check_node_settings(&settings(&[ok], &[])), Ok(()), "{ok:?}");
        }
        for (label, why) in [
            (("node-role.kubernetes.io/worker", ""), "may not set"),
            (("node-restriction.kubernetes.io/pool", "a"), "may not set"),
            (("kubernetes.io/role", "x"), "may not set"),
            (("k8s.io/x", "y"), "may not set"),
            (("Bad Key", "v"), "not a label key"),
            (("team", "-blue"), "not a label value"),
        ] {
            let refusal = check_node_settings(&settings(&[label], &[]))
                .err()
                .unwrap_or_else(|| panic!("{label:?} passed"));
            assert!(refusal.contains(why), "{label:?}: {refusal}");
            assert!(refusal.contains("spec.kubernetes.nodeLabels"), "{refusal}");
        }
    }

    #[test]
    fn taints_are_key_value_effect_and_never_the_deletion_signal() {
        let ok = settings(&[], &["dedicated=gpu:NoSchedule", "spot:PreferNoSchedule"]);
        assert_eq!(check_node_settings(&ok), Ok(()));
        assert_eq!(
            taint_parts("dedicated=gpu:NoSchedule"),
            Some(("dedicated", "gpu", "NoSchedule"))
        );
        assert_eq!(
            taint_parts("spot:NoExecute"),
            Some(("spot", "", "NoExecute"))
        );
        let twice = settings(&[], &["a=1:NoSchedule", "a=2:NoSchedule"]);
        assert!(check_node_settings(&twice).is_err_and(|e| e.contains("named twice")));
        for bad in ["dedicated=gpu", "a:Sometimes", "=x:NoSchedule"] {
            let r = check_node_settings(&settings(&[], &[bad]));
            assert!(
                r.as_ref().is_err_and(|e| e.contains("key[=value]:Effect")),
                "{bad}: {r:?}"
            );
        }
        let deletion = format!("{DELETION_TAINT}=true:NoSchedule");
        let r = check_node_settings(&settings(&[], &[&deletion]));
        assert!(r.is_err_and(|e| e.contains("reset itself")));
    }

    #[test]
    fn kubelet_settings_are_checked_by_name() {
        assert_eq!(KubeletTuning::default().check(), Ok(()));
        let good = KubeletTuning {
            max_pods: Some(50),
            system_reserved: [
                ("cpu".into(), "100m".into()),
                ("memory".into(), "256Mi".into()),
            ]
            .into(),
            eviction_hard: [
                ("memory.available".into(), "100Mi".into()),
                ("nodefs.available".into(), "10%".into()),
            ]
            .into(),
            image_gc_high_threshold_percent: Some(90),
            image_gc_low_threshold_percent: Some(70),
            cluster_domain: Some("cluster.local".into()),
            ..KubeletTuning::default()
        };
        assert_eq!(good.check(), Ok(()));
        let key = |t: KubeletTuning| t.check().err().map(|(k, _)| k);
        assert_eq!(
            key(KubeletTuning {
                max_pods: Some(0),
                ..good.clone()
            }),
            Some("kubelet.maxPods".into())
        );
        assert_eq!(
            key(KubeletTuning {
                kube_reserved: [("gpu".into(), "1".into())].into(),
                ..good.clone()
            }),
            Some("kubelet.kubeReserved".into())
        );
        assert_eq!(
            key(KubeletTuning {
                system_reserved: [("memory".into(), "lots".into())].into(),
                ..good.clone()
            }),
            Some("kubelet.systemReserved.memory".into())
        );
        assert_eq!(
            key(KubeletTuning {
                eviction_hard: [("memory.available".into(), "200%".into())].into(),
                ..good.clone()
            }),
            Some("kubelet.evictionHard.memory.available".into())
        );
        assert_eq!(
            key(KubeletTuning {
                image_gc_high_threshold_percent: None,
                image_gc_low_threshold_percent: Some(85),
                ..good.clone()
            }),
            Some("kubelet.imageGCLowThresholdPercent".into())
        );
        assert_eq!(
            key(KubeletTuning {
                cluster_domain: Some("Cluster Local".into()),
                ..good
            }),
            Some("kubelet.clusterDomain".into())
        );
        for q in ["1", "100m", "1.5Gi", "64Ki", "2G"] {
            assert!(is_quantity(q), "{q}");
        }
        for q in ["", "Mi", "1.Gi", "-1", "1 Gi", "1gi"] {
            assert!(!is_quantity(q), "{q}");
        }
    }
}
