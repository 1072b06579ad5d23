//! What a rollout is and where it stands, without the cluster: the waves `--max-unavailable`
//! makes of its nodes, the record kept in the cluster (so a stopped rollout resumes from any
//! terminal), and the name of each node's operation.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `--max-unavailable`: a count, or a percent of the nodes (rounded up, at least one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaxUnavailable {
    Count(usize),
    Percent(u8),
}

impl MaxUnavailable {
    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        match raw.strip_suffix('%') {
            Some(p) => p
                .parse()
                .ok()
                .filter(|p| (1..=100).contains(p))
                .map(Self::Percent),
            None => raw.parse().ok().filter(|n| *n > 0).map(Self::Count),
        }
    }

    /// Nodes per wave for `nodes` nodes.
    pub fn wave_size(self, nodes: usize) -> usize {
        let size = match self {
            Self::Count(n) => n,
            Self::Percent(p) => (nodes * usize::from(p)).div_ceil(100),
        };
        size.clamp(1, nodes.max(1))
    }
}

impl std::fmt::Display for MaxUnavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// Where a rollout stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// A terminal drives it (or did, until it was closed: `--resume` takes over).
    Running,
    /// A node failed or a wave timed out; `--resume` goes on from there.
    Stopped,
    Complete,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "Running",
            Self::Stopped => "Stopped",
            Self::Complete => "Complete",
        }
    }
}

/// Why a rollout stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Stop {
    pub node: String,
    pub operation: String,
    pub why: String,
    /// Its operation failed (a resume gives the node a new one); false: it was still going
    /// when the wave timed out (a resume waits for it again).
    pub failed: bool,
}

/// The rollout as kept in the cluster (a labelled ConfigMap). Nothing secret: an upgrade's
/// parameters stay in the operations it created, where a resume reads them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    pub name: String,
    /// `k=v[,k2=v2]`, as typed.
    pub selector: String,
    /// The operation kind, as a MachineOperation spells it.
    pub kind: String,
    pub max_unavailable: MaxUnavailable,
    /// Every node the selector matched when the rollout began, in the order they go.
    pub nodes: Vec<String>,
    pub phase: Phase,
    /// Nodes whose operation completed.
    pub done: Vec<String>,
    /// The attempt each node is at (1 when absent): a resumed node gets a new operation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attempts: BTreeMap<String, u32>,
    /// Why it stopped: the wave's failed nodes (a timeout's node first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stopped: Vec<Stop>,
    /// The terminal driving it (host and PID), for whoever looks at it.
    pub driver: String,
}

impl Record {
    pub fn new(
        name: &str,
        selector: &str,
        kind: &str,
        max: MaxUnavailable,
        mut nodes: Vec<String>,
    ) -> Self {
        nodes.sort();
        nodes.dedup();
        Self {
            name: name.to_string(),
            selector: selector.to_string(),
            kind: kind.to_string(),
            max_unavailable: max,
            nodes,
            phase: Phase::Running,
            done: Vec::new(),
            attempts: BTreeMap::new(),
            stopped: Vec::new(),
            driver: String::new(),
        }
    }

    /// The waves still to go: the nodes not done, in order, `max_unavailable` at a time.
    pub fn waves(&self) -> Vec<Vec<String>> {
        let size = self.max_unavailable.wave_size(self.nodes.len());
        let left: Vec<String> = self
            .nodes
            .iter()
            .filter(|n| !self.done.contains(n))
            .cloned()
            .collect();
        left.chunks(size).map(<[String]>::to_vec).collect()
    }

    /// The operation `node` runs at its current attempt: `<rollout>-<node>-<attempt>`.
    pub fn operation(&self, node: &str) -> String {
        let attempt = self.attempts.get(node).copied().unwrap_or(1);
        format!("{}-{node}-{attempt}", self.name)
    }

    /// Resuming: each node whose operation failed gets a new one.
    pub fn resume(&mut self, driver: &str) {
        for stop in std::mem::take(&mut self.stopped) {
            if stop.failed {
                *self.attempts.entry(stop.node).or_insert(1) += 1;
            }
        }
        self.phase = Phase::Running;
        self.driver = driver.to_string();
    }
}

/// A ConfigMap's name for the rollouts of `selector`: one at a time per selector, so the
/// API server's refusal to create a second object of one name refuses a second rollout.
pub fn lock_name(selector: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut labels: Vec<&str> = selector.split(',').map(str::trim).collect();
    labels.sort_unstable();
    let digest = Sha256::digest(labels.join(",").as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    format!("flexnode-rollout-{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<String> {
        (1..=n).map(|i| format!("edge-{i}")).collect()
    }

    #[test]
    fn max_unavailable_is_a_count_or_a_percent_rounded_up() {
        assert_eq!(MaxUnavailable::parse("2"), Some(MaxUnavailable::Count(2)));
        assert_eq!(
            MaxUnavailable::parse("40%"),
            Some(MaxUnavailable::Percent(40))
        );
        for bad in ["0", "0%", "101%", "-1", "two", "", "%"] {
            assert_eq!(MaxUnavailable::parse(bad), None, "{bad}");
        }
        assert_eq!(MaxUnavailable::Percent(40).wave_size(5), 2);
        assert_eq!(MaxUnavailable::Percent(10).wave_size(5), 1);
        assert_eq!(MaxUnavailable::Percent(100).wave_size(5), 5);
        assert_eq!(MaxUnavailable::Count(9).wave_size(5), 5);
    }

    #[test]
    fn waves_skip_done_nodes_and_a_resume_retries_the_stopped_one() {
        let mut r = Record::new("r1", "tier=edge", "NodeReboot", MaxUnavailable::Count(2), {
            let mut n = nodes(5);
            n.reverse();
            n
        });
        assert_eq!(
            r.waves(),
            [
                vec!["edge-1".to_string(), "edge-2".into()],
                vec!["edge-3".into(), "edge-4".into()],
                vec!["edge-5".into()]
            ]
        );
        r.done = vec!["edge-1".into(), "edge-2".into(), "edge-3".into()];
        r.phase = Phase::Stopped;
        r.stopped = vec![
            Stop {
                node: "edge-3".into(),
                operation: r.operation("edge-3"),
                why: "the wave did not finish within 60s".into(),
                failed: false,
            },
            Stop {
                node: "edge-4".into(),
                operation: r.operation("edge-4"),
                why: "ExecutionFailed".into(),
                failed: true,
            },
        ];
        r.done.retain(|n| n != "edge-3");
        assert_eq!(r.operation("edge-4"), "r1-edge-4-1");
        r.resume("host/2");
        assert_eq!(r.phase, Phase::Running);
        assert_eq!(r.operation("edge-4"), "r1-edge-4-2");
        assert_eq!(
            r.operation("edge-3"),
            "r1-edge-3-1",
            "still going: waited for again"
        );
        assert_eq!(r.operation("edge-5"), "r1-edge-5-1");
        assert!(r.stopped.is_empty());
        assert_eq!(
            r.waves(),
            [
                vec!["edge-3".to_string(), "edge-4".into()],
                vec!["edge-5".into()]
            ]
        );
    }

    #[test]
    fn one_lock_per_selector_whatever_the_label_order() {
        assert_eq!(lock_name("a=1,b=2"), lock_name("b=2, a=1"));
        assert_ne!(lock_name("a=1"), lock_name("a=2"));
        assert!(lock_name("a=1").len() <= 63);
    }
}
