//! Property tests of the pure core: reset paths, no duplicated disruption, no URL secrets.

use flexnode::machine::input::{
    Claim, ClaimKind, GoalObservation, JoinRequest, MachineObservation, NodeObservation,
};
use flexnode::machine::policy::Policy;
use flexnode::machine::state::{AgentBuild, Goal, InstallMode, OpRef, Slot};
use flexnode::machine::table::{DIGEST_INSTALLED, DIGEST_UPGRADE, explore, transitions};
use flexnode::machine::validate::{Arch, Sha256Hex};
use flexnode::machine::{Effect, Input, NodeState, Timestamp, step};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};

const T0: i64 = 1_785_578_400_000;

/// (a) From every reachable state, some sequence of inputs ends in `Unjoined` (reset).
#[test]
fn every_reachable_state_has_a_reset_path() {
    let graph = explore();
    assert!(
        graph.states.len() > 30,
        "exploration too small: {}",
        graph.states.len()
    );
    let mut can_reset: HashSet<usize> = graph
        .states
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, NodeState::Unjoined { .. }))
        .map(|(i, _)| i)
        .collect();
    loop {
        let before = can_reset.len();
        for (from, _, to, _) in &graph.edges {
            if can_reset.contains(to) {
                can_reset.insert(*from);
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

/// Every phase of the design appears in the explored graph.
#[test]
fn exploration_reaches_every_phase() {
    let labels: HashSet<String> = transitions(&explore())
        .into_iter()
        .flat_map(|(a, _, b)| [a, b])
        .collect();
    for want in [
        "Unjoined",
        "Joining_Installing",
        "Joining_Starting",
        "Ready",
        "Rebooting",
        "Upgrading_Staging",
        "Upgrading_Switching",
        "Upgrading_HandingOff",
        "Upgrading_RollingBack",
        "Repaving_Provisioning",
        "Repaving_SwitchingOver",
        "Repaving_RollingBack",
        "Repaving_Retiring",
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
        Just(ClaimKind::NodeReboot),
        Just(ClaimKind::AgentReset),
        (urls, shas).prop_map(|(u, s)| ClaimKind::AgentUpgrade {
            parameters: BTreeMap::from([("downloadURL".to_string(), u), ("sha256".to_string(), s)])
        }),
        Just(ClaimKind::Unsupported {
            kind: "HostReboot".into()
        }),
    ];
    let goals = (0i64..3).prop_map(|g| Goal {
        generation: g,
        kubernetes_version: "v1.34.2".into(),
    });
    prop_oneof![
        1 => prop::sample::select(vec![InstallMode::Host, InstallMode::Container]).prop_map(|mode| {
            Input::Join(JoinRequest {
                node_name: "n".into(),
                mode,
                arch: Arch::Amd64,
                goal: Goal { generation: 1, kubernetes_version: "v1.34.1".into() },
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
        2 => builds.prop_map(|running| Input::DaemonStarted { running }),
        1 => Just(Input::RecoveryRequested { message: "recovered".into() }),
        1 => Just(Input::ResetRequested),
        2 => Just(Input::Tick),
    ]
}

fn secret_strategy() -> impl Strategy<Value = String> {
    "[a-z0-9]{16}".prop_map(|s| format!("TOKEN{s}"))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

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
