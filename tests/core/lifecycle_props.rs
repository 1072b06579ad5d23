//! Property tests of the pure core over its explored state graph (`src/lifecycle/table.rs`):
//! its size, its alphabet, the soundness of how it identifies states, reset paths; and random
//! runs: no duplicated disruption, no URL secrets.

use flexnode::lifecycle::agent::{AgentBuild, InstallMode, Slot};
use flexnode::lifecycle::agent::{Arch, Sha256Hex};
use flexnode::lifecycle::input::{
    Claim, ClaimKind, GoalObservation, JoinRequest, MachineObservation, NodeObservation,
};
use flexnode::lifecycle::policy::Policy;
use flexnode::lifecycle::result::OpResult;
use flexnode::lifecycle::state::{Goal, OpRef};
use flexnode::lifecycle::state::{RepavePhase, UpgradePhase};
use flexnode::lifecycle::table::{
    BASE, Counts, DIGEST_INSTALLED, DIGEST_UPGRADE, Graph, INPUT_VARIANTS, control, explore,
    input_variant, sample_inputs, shift_effect, shift_state, transitions,
};
use flexnode::lifecycle::{Effect, Input, NodeState, Step, Timestamp, step};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::OnceLock;

const T0: i64 = 1_785_578_400_000;

/// The explored graph, once per test binary (it takes a few seconds in a debug build).
fn graph() -> &'static Graph {
    static GRAPH: OnceLock<Graph> = OnceLock::new();
    GRAPH.get_or_init(explore)
}

/// The counts `docs/design.md` states (written by `cargo run --bin crdgen`).
fn documented_counts() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/design.md"))
        .expect("read docs/design.md");
    doc.lines()
        .find(|l| l.starts_with("The exploration applies "))
        .expect("docs/design.md states the exploration's counts")
        .to_string()
}

/// The graph is as large as the design says: a change to the core or to the alphabet that
/// grows or shrinks it shows in the diff of `docs/design.md`.
#[test]
fn the_exploration_reaches_the_documented_counts() {
    let counts = Counts::of(graph());
    eprintln!("{counts:?}");
    assert_eq!(
        counts.sentence(),
        documented_counts(),
        "docs/design.md is stale: run `cargo run --bin crdgen`"
    );
}

/// The alphabet covers every input variant, every claim kind under more than one UID, every
/// Node and Machine observation, goal generations beyond 2 and every build a daemon runs.
#[test]
fn the_alphabet_covers_every_input_variant() {
    let inputs = sample_inputs();
    let variants: HashSet<usize> = inputs.iter().map(input_variant).collect();
    assert_eq!(
        variants.len(),
        INPUT_VARIANTS,
        "variants covered: {variants:?}"
    );
    let mut uids_per_kind: HashMap<&'static str, HashSet<String>> = HashMap::new();
    let mut nodes = HashSet::new();
    let mut machines = HashSet::new();
    let mut generations = HashSet::new();
    for input in &inputs {
        match input {
            Input::OperationClaimed(c) => {
                let kind = match &c.kind {
                    ClaimKind::NodeReboot { .. } => "NodeReboot",
                    ClaimKind::AgentReset { .. } => "AgentReset",
                    ClaimKind::AgentUpgrade { .. } => "AgentUpgrade",
                };
                uids_per_kind
                    .entry(kind)
                    .or_default()
                    .insert(c.op.uid.clone());
            }
            Input::GoalObserved(g) => {
                nodes.insert(format!("{:?}", g.node));
                machines.insert(match &g.machine {
                    MachineObservation::Missing => "Missing",
                    MachineObservation::Unknown => "Unknown",
                    MachineObservation::Present(goal) => {
                        generations.insert(goal.generation);
                        "Present"
                    }
                });
            }
            Input::Join(_)
            | Input::EffectsDone
            | Input::EffectsFailed { .. }
            | Input::DaemonStarted { .. }
            | Input::RecoveryRequested { .. }
            | Input::ResetRequested
            | Input::Tick => {}
        }
    }
    assert_eq!(uids_per_kind.len(), 3, "{uids_per_kind:?}");
    for (kind, uids) in &uids_per_kind {
        assert!(uids.len() >= 2, "{kind} is claimed under one UID only");
    }
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(machines.len(), 3, "{machines:?}");
    assert!(generations.iter().any(|g| *g > 2), "{generations:?}");
}

/// The two ways the exploration identifies states hold over the explored states and inputs:
/// moving the state and the clock by the same amount moves the step by that amount, and
/// states equal but for start times and rollback messages step alike but for that data.
#[test]
fn time_shift_and_data_projection_invent_no_edges() {
    let g = graph();
    let policy = Policy::default();
    let mut checked = 0;
    // Every 7th state (all of them take minutes in a debug build): all inputs, at once and at
    // the state's deadline.
    for state in g.states.iter().step_by(7) {
        let mut times = vec![0];
        if let Some(d) = state.deadline() {
            times.push((d.millis() - BASE.millis()).max(0));
        }
        let other = perturbed(state);
        for dt in times {
            let now = Timestamp::from_millis(BASE.millis() + dt);
            for input in &g.inputs {
                let want = step(state, input, &policy, now);
                for k in [1_000, 86_400_000 + 7] {
                    let moved = step(
                        &shift_state(state, k),
                        input,
                        &policy,
                        Timestamp::from_millis(now.millis() + k),
                    );
                    let back = moved.map(|s| Step {
                        next: shift_state(&s.next, -k),
                        effects: s.effects.iter().map(|e| shift_effect(e, -k)).collect(),
                    });
                    assert_eq!(back, want, "time shift by {k} ms of {state} with {input}");
                }
                let alike = step(&other, input, &policy, now);
                match (&want, &alike) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(control(&a.next), control(&b.next), "{state} with {input}");
                        let strip = |s: &Step| -> Vec<Effect> {
                            s.effects.iter().map(effect_without_data).collect()
                        };
                        assert_eq!(strip(a), strip(b), "{state} with {input}");
                    }
                    (Err(a), Err(b)) => assert_eq!(a, b, "{state} with {input}"),
                    (a, b) => panic!("{state} with {input}: {a:?} but {b:?}"),
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} steps checked");
}

/// `state` with other start times and rollback messages.
fn perturbed(state: &NodeState) -> NodeState {
    let mut s = state.clone();
    let run_moved = |run: &mut flexnode::lifecycle::state::OpRun| {
        run.started_at = Timestamp::from_millis(run.started_at.millis() - 4_242_000);
    };
    match &mut s {
        NodeState::Rebooting { run, .. } | NodeState::Resetting { run: Some(run), .. } => {
            run_moved(run)
        }
        NodeState::Upgrading { run, phase, .. } => {
            run_moved(run);
            if let UpgradePhase::RollingBack { message, .. } = phase {
                message.push_str(" (another message)");
            }
        }
        NodeState::Repaving {
            phase: RepavePhase::RollingBack { message },
            ..
        } => message.push_str(" (another message)"),
        _ => {}
    }
    s
}

fn effect_without_data(e: &Effect) -> Effect {
    match e {
        Effect::PublishResult { op, result } => Effect::PublishResult {
            op: op.clone(),
            result: OpResult {
                started_at: BASE,
                message: String::new(),
                ..result.clone()
            },
        },
        Effect::ReportProgress {
            op,
            message,
            machine_generation,
            ..
        } => Effect::ReportProgress {
            op: op.clone(),
            message: message.clone(),
            machine_generation: *machine_generation,
            started_at: BASE,
        },
        Effect::ReportMachine {
            phase,
            observed_generation,
            ..
        } => Effect::ReportMachine {
            phase: *phase,
            message: String::new(),
            observed_generation: *observed_generation,
        },
        other => other.clone(),
    }
}

/// From every reachable state, some sequence of inputs ends in `Unjoined` (reset).
#[test]
fn every_reachable_state_has_a_reset_path() {
    let graph = graph();
    let mut can_reset: HashSet<usize> = graph
        .states
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, NodeState::Unjoined { .. }))
        .map(|(i, _)| i)
        .collect();
    loop {
        let before = can_reset.len();
        for e in &graph.edges {
            if can_reset.contains(&e.to) {
                can_reset.insert(e.from);
            }
        }
        if can_reset.len() == before {
            break;
        }
    }
    for (i, s) in graph.states.iter().enumerate() {
        assert!(can_reset.contains(&i), "no reset path from {s}");
    }
}

/// Every non-resting state carries a deadline.
#[test]
fn every_non_resting_state_has_a_deadline() {
    for s in &graph().states {
        let resting = matches!(s, NodeState::Unjoined { .. } | NodeState::Ready { .. });
        assert_eq!(s.deadline().is_some(), !resting, "{s}");
    }
}

/// No reachable upgrade stages the build that already runs: its switch and its undo would be
/// one and the same disruption (a finding of the random runs below).
#[test]
fn no_upgrade_stages_the_running_build() {
    let mut images = 0;
    for s in &graph().states {
        if let NodeState::Upgrading {
            node, candidate, ..
        } = s
        {
            assert_ne!(*candidate, node.agent, "{s}");
            images += usize::from(matches!(candidate, AgentBuild::Image { .. }));
        }
    }
    // The case it guards is explored: container upgrades to an image.
    assert!(images > 0, "no image upgrade in the explored graph");
}

/// Every phase of the design appears in the explored graph.
#[test]
fn exploration_reaches_every_phase() {
    let labels: HashSet<String> = transitions(graph())
        .into_iter()
        .flat_map(|(a, _, b)| [a, b])
        .collect();
    for want in [
        "Unjoined",
        "Joining_Installing",
        "Joining_Starting",
        "Ready",
        "Rebooting_Draining",
        "Rebooting_Restarting",
        "Upgrading_Staging",
        "Upgrading_Switching",
        "Upgrading_HandingOff",
        "Upgrading_RollingBack",
        "Repaving_Provisioning",
        "Repaving_Draining",
        "Repaving_SwitchingOver",
        "Repaving_RollingBack",
        "Repaving_Retiring",
        "Resetting_Draining",
        "Resetting_Wiping",
        "Resetting_Publishing",
        "Resetting_Uninstalling",
    ] {
        assert!(labels.contains(want), "{want} never reached");
    }
}

fn digest(h: &str) -> Sha256Hex {
    Sha256Hex::parse(h).expect("valid")
}

fn input_strategy(secret: String) -> impl Strategy<Value = Input> {
    let uids = prop::sample::select(vec!["a", "b", "c"]);
    let builds = prop::sample::select(vec![
        AgentBuild::Slot { slot: Slot::Blue },
        AgentBuild::Slot { slot: Slot::Green },
        AgentBuild::Image {
            digest: digest(DIGEST_INSTALLED),
        },
        AgentBuild::Image {
            digest: digest(DIGEST_UPGRADE),
        },
    ]);
    let s1 = secret.clone();
    let urls = prop::sample::select(vec![
        format!("https://artifacts.example/f.tgz?sig={s1}"),
        format!("https://{s1}@artifacts.example/f.tgz"),
        format!("https://u:{s1}@artifacts.example/f.tgz"),
        format!("https://artifacts.example/f.tgz#{s1}"),
        format!("oci://registry.example/flexnode:v2?t={s1}"),
        "oci://registry.example/flexnode:v2".to_string(),
        "https://artifacts.example/f.tgz".to_string(),
    ]);
    let shas = prop::sample::select(vec![DIGEST_UPGRADE.to_string(), format!("{secret}")]);
    let kinds = prop_oneof![
        Just(ClaimKind::node_reboot()),
        Just(ClaimKind::agent_reset()),
        (urls, shas).prop_map(|(u, s)| ClaimKind::AgentUpgrade {
            parameters: BTreeMap::from([("downloadURL".to_string(), u), ("sha256".to_string(), s)])
        }),
    ];
    let goals = (0i64..3).prop_map(|g| Goal::new(g, "v1.34.2"));
    prop_oneof![
        1 => prop::sample::select(vec![InstallMode::Host, InstallMode::Container]).prop_map(|mode| {
            Input::Join(JoinRequest {
                node_name: "n".into(),
                mode,
                arch: Arch::Amd64,
                goal: Goal::new(1, "v1.34.1"),
                agent: match mode {
                    InstallMode::Host => AgentBuild::Slot { slot: Slot::Blue },
                    InstallMode::Container => AgentBuild::Image { digest: digest(DIGEST_INSTALLED) },
                },
            })
        }),
        3 => (uids, kinds).prop_map(|(uid, kind)| Input::OperationClaimed(Claim {
            op: OpRef { name: format!("op-{uid}"), uid: uid.to_string() },
            kind,
            machine_generation: 1,
        })),
        1 => (any::<bool>(), any::<bool>(), prop::option::of(goals)).prop_map(|(absent, taint, machine)| {
            Input::GoalObserved(GoalObservation {
                node: if absent { NodeObservation::Absent } else { NodeObservation::Present { deletion_taint: taint } },
                machine: machine.map(MachineObservation::Present).unwrap_or(MachineObservation::Missing),
            })
        }),
        4 => Just(Input::EffectsDone),
        2 => Just(Input::EffectsFailed { message: "effect failed".into() }),
        2 => (builds.clone(), prop::option::of(builds)).prop_map(|(running, selected)| Input::DaemonStarted { running, selected }),
        1 => Just(Input::RecoveryRequested { message: "recovered".into() }),
        1 => Just(Input::ResetRequested),
        2 => Just(Input::Tick),
    ]
}

fn secret_strategy() -> impl Strategy<Value = String> {
    "[a-z0-9]{16}".prop_map(|s| format!("TOKEN{s}"))
}

proptest! {
    // Failing seeds are kept beside this file and replayed first (proptest looks for lib.rs
    // by default, which an integration test has not).
    #![proptest_config(ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "tests/core/lifecycle_props.proptest-regressions",
        ))),
        ..ProptestConfig::with_cases(400)
    })]

    /// (b) No disruptive effect is emitted twice for one operation UID, and (c) no message,
    /// journal line or rendering ever contains a URL secret — over random input sequences
    /// with time moving forward, including repeated claims of the same UID.
    #[test]
    fn random_runs_never_duplicate_disruption_or_leak_secrets(
        (secret, inputs, gaps) in secret_strategy().prop_flat_map(|secret| {
            (Just(secret.clone()),
             prop::collection::vec(input_strategy(secret), 1..60),
             prop::collection::vec(0i64..400, 60))
        })
    ) {
        let policy = Policy::default();
        let mut state = NodeState::default();
        let mut now = Timestamp::from_millis(T0);
        let mut disruptive: HashMap<String, Vec<Effect>> = HashMap::new();
        for (input, gap) in inputs.iter().zip(gaps) {
            now = now.plus_secs(gap);
            prop_assert!(!input.to_string().contains(&secret), "input line: {}", input);
            let Ok(s) = step(&state, input, &policy, now) else { continue };
            let uid = s.next.run().or(state.run()).map(|r| r.op.uid.clone());
            for e in &s.effects {
                let shown = format!("{e} {e:?}");
                prop_assert!(!shown.contains(&secret), "effect leaks: {}", shown);
                prop_assert!(!result_message(e).contains(&secret));
                if let (true, Some(uid)) = (e.is_disruptive(), &uid) {
                    let seen = disruptive.entry(uid.clone()).or_default();
                    prop_assert!(!seen.contains(e), "{} emitted twice for {}", e, uid);
                    seen.push(e.clone());
                }
            }
            let shown = format!("{} {:?}", s.next, s.next);
            prop_assert!(!shown.contains(&secret));
            // Every non-resting state carries a deadline.
            prop_assert_eq!(
                s.next.deadline().is_none(),
                matches!(s.next, NodeState::Unjoined { .. } | NodeState::Ready { .. })
            );
            state = s.next;
        }
    }
}

fn result_message(e: &Effect) -> String {
    match e {
        Effect::PublishResult { result, .. } => result.message.clone(),
        Effect::ReportMachine { message, .. } | Effect::ReportProgress { message, .. } => {
            message.clone()
        }
        _ => String::new(),
    }
}
