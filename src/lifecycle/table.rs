//! The transition table, derived from `step` itself: every state reachable from `Unjoined`
//! under an input alphabet that covers every input variant. `docs/design.md` embeds the
//! diagram and the counts this renders, and a test fails when they differ.
//!
//! Time only moves forward: each input arrives either at once or when the state's deadline is
//! due. A state is kept relative to the moment it was reached (every timestamp in it shifted
//! by `-now`), because `step` only compares times and adds durations to `now`: shifting the
//! state and `now` alike shifts the result alike (`tests/core/lifecycle_props.rs` checks this), so
//! two states equal after the shift have the same edges. Nothing else is merged.

use super::effect::Effect;

use super::agent::{AgentBuild, InstallMode, Slot};
use super::agent::{Arch, Sha256Hex};
use super::input::{
    Claim, ClaimKind, GoalObservation, Input, JoinRequest, MachineObservation, NodeObservation,
};
use super::policy::Policy;
use super::result::OpResult;
use super::state::{Goal, NodeState, OpRef, OpRun, RepavePhase, UpgradePhase};
use super::step::step;
use super::time::Timestamp;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// The moment every explored state is relative to.
pub const BASE: Timestamp = Timestamp::from_millis(1_785_578_400_000);

pub const DIGEST_INSTALLED: &str =
    "1111111111111111111111111111111111111111111111111111111111111111";
pub const DIGEST_UPGRADE: &str = "2222222222222222222222222222222222222222222222222222222222222222";

/// Operation UIDs the alphabet claims each kind with: more than one, so a finished
/// operation's UID and a new one of the same kind both occur. The same UIDs serve every
/// kind: the order of finished UIDs is part of the state, and a UID per kind and slot would
/// multiply it by every ordering of twelve.
pub const UIDS: [&str; 2] = ["a", "b"];

/// Goal generations observed, beyond the joined generation 1.
pub const GENERATIONS: [i64; 3] = [1, 2, 3];

fn digest(hex: &str) -> Sha256Hex {
    Sha256Hex::parse(hex).unwrap_or_else(|| unreachable!("sample digests are valid"))
}

fn upgrade(url: &str) -> ClaimKind {
    ClaimKind::AgentUpgrade {
        parameters: BTreeMap::from([
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), DIGEST_UPGRADE.to_string()),
        ]),
    }
}

fn goal(generation: i64) -> Goal {
    Goal::new(generation, &format!("v1.3{}.0", 3 + generation))
}

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The claim kinds the alphabet uses: every variant (NodeReboot and AgentReset drained as
/// configured, not drained, and with a drain parameter refused), and AgentUpgrade with a
/// valid archive, a valid image and an invalid URL.
pub fn claim_kinds() -> Vec<ClaimKind> {
    vec![
        ClaimKind::NodeReboot {
            parameters: params(&[]),
        },
        ClaimKind::NodeReboot {
            parameters: params(&[("drain", "false")]),
        },
        ClaimKind::NodeReboot {
            parameters: params(&[("drainTimeout", "soon")]),
        },
        ClaimKind::AgentReset {
            parameters: params(&[]),
        },
        ClaimKind::AgentReset {
            parameters: params(&[("drain", "false")]),
        },
        upgrade("https://artifacts.example/flexnode.tar.gz?sig=s3cr3t"),
        upgrade("oci://registry.example/flexnode:v2"),
        upgrade("ftp://artifacts.example/flexnode.tar.gz"),
    ]
}

/// The input alphabet: every variant of `Input`, and within it every claim kind under each
/// of [`UIDS`], every Node × Machine observation (generations [`GENERATIONS`]), every build a
/// daemon can start as, selected or not.
pub fn sample_inputs() -> Vec<Input> {
    let join = |mode, agent| {
        Input::Join(JoinRequest {
            node_name: "edge-07".into(),
            mode,
            arch: Arch::Amd64,
            goal: goal(1),
            agent,
        })
    };
    let installed = AgentBuild::Image {
        digest: digest(DIGEST_INSTALLED),
    };
    let mut inputs = vec![
        join(InstallMode::Host, AgentBuild::Slot { slot: Slot::Blue }),
        join(InstallMode::Container, installed.clone()),
    ];
    for uid in UIDS {
        for kind in claim_kinds() {
            inputs.push(Input::OperationClaimed(Claim {
                op: OpRef {
                    name: format!("op-{uid}"),
                    uid: uid.to_string(),
                },
                kind,
                machine_generation: 1,
            }));
        }
    }
    let nodes = [
        NodeObservation::Absent,
        NodeObservation::Present {
            deletion_taint: false,
        },
        NodeObservation::Present {
            deletion_taint: true,
        },
    ];
    let mut machines = vec![MachineObservation::Missing, MachineObservation::Unknown];
    machines.extend(GENERATIONS.map(|g| MachineObservation::Present(goal(g))));
    for node in nodes {
        for machine in &machines {
            inputs.push(Input::GoalObserved(GoalObservation {
                node,
                machine: machine.clone(),
            }));
        }
    }
    inputs.push(Input::EffectsDone);
    inputs.push(Input::EffectsFailed {
        message: "effect failed".into(),
    });
    let builds = [
        AgentBuild::Slot { slot: Slot::Blue },
        AgentBuild::Slot { slot: Slot::Green },
        installed,
        AgentBuild::Image {
            digest: digest(DIGEST_UPGRADE),
        },
    ];
    // Each build running as the host selects it, and (the selection unknown or another
    // build) not.
    for (i, running) in builds.iter().enumerate() {
        let other = &builds[i ^ 1];
        for selected in [Some(running), None, Some(other)] {
            inputs.push(Input::DaemonStarted {
                running: running.clone(),
                selected: selected.cloned(),
            });
        }
    }
    inputs.push(Input::RecoveryRequested {
        message: "upgraded daemon failed repeatedly; restored last-good agent".into(),
    });
    inputs.push(Input::ResetRequested);
    inputs.push(Input::Tick);
    inputs
}

/// Which variant of `Input` this is, numbered; with no wildcard, a new variant fails to
/// compile here until the alphabet covers it.
pub fn input_variant(input: &Input) -> usize {
    match input {
        Input::Join(_) => 0,
        Input::OperationClaimed(_) => 1,
        Input::GoalObserved(_) => 2,
        Input::EffectsDone => 3,
        Input::EffectsFailed { .. } => 4,
        Input::DaemonStarted { .. } => 5,
        Input::RecoveryRequested { .. } => 6,
        Input::ResetRequested => 7,
        Input::Tick => 8,
    }
}

/// The number of `Input` variants [`input_variant`] knows.
pub const INPUT_VARIANTS: usize = 9;

/// A state's label in the diagram: phase, plus sub-phase where there is one.
pub fn label(state: &NodeState) -> String {
    match state.step_name() {
        Some(step) => format!("{}_{step}", state.phase_name()),
        None => state.phase_name().to_string(),
    }
}

/// When an input arrives, relative to the moment its state was reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// At once.
    Now,
    /// When the state's deadline is due (only for states with a deadline still ahead).
    AtDeadline,
}

/// One accepted step between two explored states.
#[derive(Clone, Debug)]
pub struct Edge {
    pub from: usize,
    pub input: usize,
    pub arrival: Arrival,
    pub to: usize,
    /// The step changed the state or emitted effects (not "nothing happened").
    pub changed: bool,
}

/// The reachable state graph: states relative to [`BASE`], and the accepted edges.
pub struct Graph {
    pub states: Vec<NodeState>,
    pub edges: Vec<Edge>,
    pub inputs: Vec<Input>,
}

/// How far after the state was reached `arrival` is, if that arrival exists for it.
fn delay(state: &NodeState, arrival: Arrival) -> Option<i64> {
    match arrival {
        Arrival::Now => Some(0),
        Arrival::AtDeadline => {
            let ahead = state.deadline()?.millis() - BASE.millis();
            (ahead > 0).then_some(ahead)
        }
    }
}

pub fn explore() -> Graph {
    let policy = Policy::default();
    let inputs = sample_inputs();
    let mut states: Vec<NodeState> = vec![NodeState::default()];
    let mut ids: HashMap<NodeState, usize> = HashMap::from([(control(&states[0]), 0)]);
    let mut edges = Vec::new();
    let mut queue = VecDeque::from([0usize]);
    while let Some(i) = queue.pop_front() {
        for arrival in [Arrival::Now, Arrival::AtDeadline] {
            let Some(dt) = delay(&states[i], arrival) else {
                continue;
            };
            let now = Timestamp::from_millis(BASE.millis() + dt);
            for (k, input) in inputs.iter().enumerate() {
                let Ok(s) = step(&states[i], input, &policy, now) else {
                    continue;
                };
                let next = shift_state(&s.next, -dt);
                let to = *ids.entry(control(&next)).or_insert_with(|| {
                    states.push(next.clone());
                    queue.push_back(states.len() - 1);
                    states.len() - 1
                });
                edges.push(Edge {
                    from: i,
                    input: k,
                    arrival,
                    to,
                    changed: !s.effects.is_empty() || s.next != states[i],
                });
            }
        }
    }
    Graph {
        states,
        edges,
        inputs,
    }
}

/// The state without the data `step` only carries into results and messages: an operation's
/// start time and a rollback's message. Two states with equal projections accept the same
/// inputs into states with equal projections, with the same effects but for that data
/// (`tests/core/lifecycle_props.rs` checks it over the explored graph), so the exploration keeps one
/// of them.
pub fn control(state: &NodeState) -> NodeState {
    let mut state = state.clone();
    match &mut state {
        NodeState::Unjoined { .. }
        | NodeState::Joining { .. }
        | NodeState::Ready { .. }
        | NodeState::Resetting { run: None, .. } => {}
        NodeState::Rebooting { run, .. } | NodeState::Resetting { run: Some(run), .. } => {
            run.started_at = BASE
        }
        NodeState::Upgrading { run, phase, .. } => {
            run.started_at = BASE;
            match phase {
                UpgradePhase::RollingBack { message, .. } => message.clear(),
                UpgradePhase::Staging | UpgradePhase::Switching | UpgradePhase::HandingOff => {}
            }
        }
        NodeState::Repaving { phase, .. } => match phase {
            RepavePhase::RollingBack { message } => message.clear(),
            RepavePhase::Provisioning
            | RepavePhase::Draining
            | RepavePhase::SwitchingOver
            | RepavePhase::Retiring => {}
        },
    }
    state
}

fn shift(t: Timestamp, ms: i64) -> Timestamp {
    Timestamp::from_millis(t.millis() + ms)
}

fn shift_run(run: &OpRun, ms: i64) -> OpRun {
    OpRun {
        started_at: shift(run.started_at, ms),
        deadline: shift(run.deadline, ms),
        ..run.clone()
    }
}

/// `state` with every timestamp in it moved by `ms`.
pub fn shift_state(state: &NodeState, ms: i64) -> NodeState {
    match state {
        NodeState::Unjoined { .. } | NodeState::Ready { .. } => state.clone(),
        NodeState::Joining {
            node,
            phase,
            deadline,
        } => NodeState::Joining {
            node: node.clone(),
            phase: *phase,
            deadline: shift(*deadline, ms),
        },
        NodeState::Rebooting { node, run, phase } => NodeState::Rebooting {
            node: node.clone(),
            run: shift_run(run, ms),
            phase: *phase,
        },
        NodeState::Upgrading {
            node,
            run,
            target,
            candidate,
            phase,
        } => NodeState::Upgrading {
            node: node.clone(),
            run: shift_run(run, ms),
            target: target.clone(),
            candidate: candidate.clone(),
            phase: phase.clone(),
        },
        NodeState::Repaving {
            node,
            goal,
            phase,
            deadline,
        } => NodeState::Repaving {
            node: node.clone(),
            goal: goal.clone(),
            phase: phase.clone(),
            deadline: shift(*deadline, ms),
        },
        NodeState::Resetting {
            node,
            run,
            cause,
            phase,
            deadline,
        } => NodeState::Resetting {
            node: node.clone(),
            run: run.as_ref().map(|r| shift_run(r, ms)),
            cause: *cause,
            phase: phase.clone(),
            deadline: shift(*deadline, ms),
        },
    }
}

/// `effect` with every timestamp in it moved by `ms`.
pub fn shift_effect(effect: &Effect, ms: i64) -> Effect {
    match effect {
        Effect::PublishResult { op, result } => Effect::PublishResult {
            op: op.clone(),
            result: OpResult {
                started_at: shift(result.started_at, ms),
                ..result.clone()
            },
        },
        Effect::RestartMachine { side, not_before } => Effect::RestartMachine {
            side: *side,
            not_before: shift(*not_before, ms),
        },
        Effect::ReportProgress {
            op,
            message,
            machine_generation,
            started_at,
        } => Effect::ReportProgress {
            op: op.clone(),
            message: message.clone(),
            machine_generation: *machine_generation,
            started_at: shift(*started_at, ms),
        },
        Effect::Drain {
            run,
            holder,
            policy,
            until,
        } => Effect::Drain {
            run: run.as_ref().map(|r| shift_run(r, ms)),
            holder: holder.clone(),
            policy: policy.clone(),
            until: shift(*until, ms),
        },
        Effect::AwaitPublished { .. }
        | Effect::Uncordon
        | Effect::ReportMachine { .. }
        | Effect::InstallAgent { .. }
        | Effect::WriteUnits { .. }
        | Effect::DisableSwap
        | Effect::StartAgent
        | Effect::StageAgent { .. }
        | Effect::DiscardCandidate { .. }
        | Effect::SwitchAgent { .. }
        | Effect::ScheduleAgentRestart { .. }
        | Effect::RestartAgent
        | Effect::ProvisionMachine { .. }
        | Effect::StartMachine { .. }
        | Effect::AwaitNode { .. }
        | Effect::StopMachine { .. }
        | Effect::RemoveMachine { .. }
        | Effect::WipeNode
        | Effect::UninstallAgent => effect.clone(),
    }
}

/// An input's name in the diagram; a `Tick` that finds the deadline due is `deadline`.
fn input_label(graph: &Graph, edge: &Edge) -> String {
    match (&graph.inputs[edge.input], edge.arrival) {
        (Input::Tick, Arrival::AtDeadline) => "deadline".to_string(),
        (Input::Tick, Arrival::Now)
            if graph.states[edge.from]
                .deadline()
                .is_some_and(|d| d <= BASE) =>
        {
            "deadline".to_string()
        }
        (input, _) => input.name().to_string(),
    }
}

/// Label-level transitions `(from, input, to)`, without "nothing happened" self-loops.
pub fn transitions(graph: &Graph) -> BTreeSet<(String, String, String)> {
    graph
        .edges
        .iter()
        .filter(|e| e.changed)
        .map(|e| {
            (
                label(&graph.states[e.from]),
                input_label(graph, e),
                label(&graph.states[e.to]),
            )
        })
        .collect()
}

/// The size of the explored graph, as `docs/design.md` states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub inputs: usize,
    pub states: usize,
    pub edges: usize,
    pub transitions: usize,
}

impl Counts {
    pub fn of(graph: &Graph) -> Self {
        Self {
            inputs: graph.inputs.len(),
            states: graph.states.len(),
            edges: graph.edges.len(),
            transitions: transitions(graph).len(),
        }
    }

    /// The sentence in `docs/design.md`.
    pub fn sentence(&self) -> String {
        format!(
            "The exploration applies {} inputs, each at once and when a deadline is due, and \
             reaches {} states and {} accepted steps ({} labelled transitions).",
            self.inputs, self.states, self.edges, self.transitions
        )
    }
}

/// The Mermaid state diagram and the counts, embedded in `docs/design.md`.
pub fn mermaid() -> String {
    let graph = explore();
    let mut by_edge: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for (from, input, to) in transitions(&graph) {
        by_edge.entry((from, to)).or_default().insert(input);
    }
    let mut out = format!(
        "{}\n\n```mermaid\nstateDiagram-v2\n    [*] --> Unjoined\n",
        Counts::of(&graph).sentence()
    );
    for ((from, to), inputs) in by_edge {
        let inputs: Vec<String> = inputs.into_iter().collect();
        out.push_str(&format!("    {from} --> {to}: {}\n", inputs.join(", ")));
    }
    out.push_str("```\n");
    out
}
