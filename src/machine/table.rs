//! The transition table, derived from `step` itself by exploring every state reachable from
//! `Unjoined` under a representative set of inputs. `docs/design.md` embeds the diagram this
//! renders, and a test fails when they differ.

use super::input::{
    Claim, ClaimKind, GoalObservation, Input, JoinRequest, MachineObservation, NodeObservation,
};
use super::policy::Policy;
use super::state::{AgentBuild, FinishedOps, Goal, InstallMode, NodeState, OpRef, Slot};
use super::step::step;
use super::time::Timestamp;
use super::validate::{Arch, Sha256Hex};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Start of the sample clock; `LATE` is past every deadline set at `EARLY`.
pub const EARLY: Timestamp = Timestamp::from_millis(1_785_578_400_000);
pub const LATE: Timestamp = Timestamp::from_millis(1_785_578_400_000 + 86_400_000);

pub const DIGEST_INSTALLED: &str =
    "1111111111111111111111111111111111111111111111111111111111111111";
pub const DIGEST_UPGRADE: &str = "2222222222222222222222222222222222222222222222222222222222222222";

fn digest(hex: &str) -> Sha256Hex {
    Sha256Hex::parse(hex).unwrap_or_else(|| unreachable!("sample digests are valid"))
}

fn claim(uid: &str, kind: ClaimKind) -> Input {
    Input::OperationClaimed(Claim {
        op: OpRef {
            name: format!("op-{uid}"),
            uid: uid.to_string(),
        },
        kind,
        machine_generation: 1,
    })
}

fn upgrade(url: &str) -> ClaimKind {
    ClaimKind::AgentUpgrade {
        parameters: BTreeMap::from([
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), DIGEST_UPGRADE.to_string()),
        ]),
    }
}

/// Representative inputs with the time each arrives at.
pub fn sample_inputs() -> Vec<(Input, Timestamp)> {
    let goal = |generation| Goal {
        generation,
        kubernetes_version: "v1.34.2".into(),
    };
    let join = |mode, agent| {
        Input::Join(JoinRequest {
            node_name: "edge-07".into(),
            mode,
            arch: Arch::Amd64,
            goal: goal(1),
            agent,
        })
    };
    let observed = |node, machine| Input::GoalObserved(GoalObservation { node, machine });
    let inputs = vec![
        join(InstallMode::Host, AgentBuild::Slot { slot: Slot::Blue }),
        join(
            InstallMode::Container,
            AgentBuild::Image {
                digest: digest(DIGEST_INSTALLED),
            },
        ),
        claim("reboot", ClaimKind::NodeReboot),
        claim("reset", ClaimKind::AgentReset),
        claim(
            "upgrade-archive",
            upgrade("https://artifacts.example/flexnode.tar.gz?sig=s3cr3t"),
        ),
        claim(
            "upgrade-image",
            upgrade("oci://registry.example/flexnode:v2"),
        ),
        claim(
            "upgrade-invalid",
            upgrade("ftp://artifacts.example/flexnode.tar.gz"),
        ),
        claim(
            "host-reboot",
            ClaimKind::Unsupported {
                kind: "HostReboot".into(),
            },
        ),
        observed(
            NodeObservation::Present {
                deletion_taint: true,
            },
            MachineObservation::Missing,
        ),
        observed(
            NodeObservation::Absent,
            MachineObservation::Present(goal(2)),
        ),
        observed(
            NodeObservation::Present {
                deletion_taint: false,
            },
            MachineObservation::Present(goal(1)),
        ),
        Input::EffectsDone,
        Input::EffectsFailed {
            message: "effect failed".into(),
        },
        Input::DaemonStarted {
            running: AgentBuild::Slot { slot: Slot::Blue },
        },
        Input::DaemonStarted {
            running: AgentBuild::Slot { slot: Slot::Green },
        },
        Input::DaemonStarted {
            running: AgentBuild::Image {
                digest: digest(DIGEST_INSTALLED),
            },
        },
        Input::DaemonStarted {
            running: AgentBuild::Image {
                digest: digest(DIGEST_UPGRADE),
            },
        },
        Input::RecoveryRequested {
            message: "upgraded daemon failed repeatedly; restored last-good agent".into(),
        },
        Input::ResetRequested,
    ];
    let mut timed: Vec<(Input, Timestamp)> = inputs.into_iter().map(|i| (i, EARLY)).collect();
    timed.push((Input::Tick, EARLY));
    timed.push((Input::Tick, LATE));
    timed
}

/// A state's label in the diagram: phase, plus sub-phase where there is one.
pub fn label(state: &NodeState) -> String {
    match state.step_name() {
        Some(step) => format!("{}_{step}", state.phase_name()),
        None => state.phase_name().to_string(),
    }
}

/// The reachable state graph: concrete states and the accepted edges between them.
pub struct Graph {
    pub states: Vec<NodeState>,
    /// (from index, input index, to index, whether the step emitted effects)
    pub edges: Vec<(usize, usize, usize, bool)>,
    pub inputs: Vec<(Input, Timestamp)>,
}

pub fn explore() -> Graph {
    let policy = Policy::default();
    let inputs = sample_inputs();
    let mut states: Vec<NodeState> = vec![NodeState::default()];
    let mut ids: HashMap<String, usize> = HashMap::from([(key(&states[0]), 0)]);
    let mut edges = Vec::new();
    let mut queue = VecDeque::from([0usize]);
    while let Some(i) = queue.pop_front() {
        for (k, (input, now)) in inputs.iter().enumerate() {
            let Ok(s) = step(&states[i], input, &policy, *now) else {
                continue;
            };
            let next = forget_finished(s.next);
            let to = *ids.entry(key(&next)).or_insert_with(|| {
                states.push(next.clone());
                queue.push_back(states.len() - 1);
                states.len() - 1
            });
            edges.push((i, k, to, !s.effects.is_empty()));
        }
    }
    Graph {
        states,
        edges,
        inputs,
    }
}

/// The finished-operation memory only turns repeated claims into refusals (no edge), so the
/// graph forgets it; otherwise every ordering of finished UIDs would be a separate state.
fn forget_finished(mut state: NodeState) -> NodeState {
    match &mut state {
        NodeState::Unjoined { finished } => *finished = FinishedOps::default(),
        NodeState::Joining { node, .. }
        | NodeState::Ready { node }
        | NodeState::Rebooting { node, .. }
        | NodeState::Upgrading { node, .. }
        | NodeState::Repaving { node, .. }
        | NodeState::Resetting { node, .. } => node.finished = FinishedOps::default(),
    }
    state
}

fn key(state: &NodeState) -> String {
    serde_json::to_string(state).unwrap_or_default()
}

/// Label-level transitions `(from, input, to)`, without "nothing happened" self-loops.
pub fn transitions(graph: &Graph) -> BTreeSet<(String, String, String)> {
    graph
        .edges
        .iter()
        .filter(|(from, _, to, effects)| *effects || graph.states[*from] != graph.states[*to])
        .map(|(from, k, to, _)| {
            let input = match (&graph.inputs[*k].0, graph.inputs[*k].1) {
                (Input::Tick, t) if t == LATE => "deadline".to_string(),
                (input, _) => input.name().to_string(),
            };
            (
                label(&graph.states[*from]),
                input,
                label(&graph.states[*to]),
            )
        })
        .collect()
}

/// The Mermaid state diagram embedded in `docs/design.md`.
pub fn mermaid() -> String {
    let graph = explore();
    let mut by_edge: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (from, input, to) in transitions(&graph) {
        by_edge.entry((from, to)).or_default().insert(input);
    }
    let mut out = String::from("```mermaid\nstateDiagram-v2\n    [*] --> Unjoined\n");
    for ((from, to), inputs) in by_edge {
        let inputs: Vec<String> = inputs.into_iter().collect();
        out.push_str(&format!("    {from} --> {to}: {}\n", inputs.join(", ")));
    }
    out.push_str("```\n");
    out
}
