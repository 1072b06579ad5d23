//! The transitions of the pure core as a table: each row starts from a state, feeds inputs in
//! turn and says what each step must do (the state it reaches, its effects, the result it
//! publishes, or the refusal). One runner checks every row and names the row and step that
//! failed.

use flexnode::lifecycle::agent::{AgentBuild, InstallMode, Slot};
use flexnode::lifecycle::agent::{Arch, Sha256Hex};
use flexnode::lifecycle::drain::{DrainPolicy, OnTimeout};
use flexnode::lifecycle::input::{
    Claim, ClaimKind, GoalObservation, JoinRequest, MachineObservation, NodeObservation,
};
use flexnode::lifecycle::policy::Policy;
use flexnode::lifecycle::result::{MachinePhase, ResultReason};
use flexnode::lifecycle::state::{
    Goal, OpRef, RepavePhase, ResetCause, ResetPhase, Side, UpgradePhase,
};
use flexnode::lifecycle::{Effect, Input, NodeState, Refusal, Timestamp, step};
use std::collections::BTreeMap;

const T0: Timestamp = Timestamp::from_millis(1_785_578_400_000);
const D1: &str = "1111111111111111111111111111111111111111111111111111111111111111";
const D2: &str = "2222222222222222222222222222222222222222222222222222222222222222";
const RECOVERY: &str = "upgraded daemon failed repeatedly; restored last-good agent";

// ---- inputs and builds ----------------------------------------------------------------------

fn digest(h: &str) -> Sha256Hex {
    Sha256Hex::parse(h).expect("digest")
}
fn blue() -> AgentBuild {
    AgentBuild::Slot { slot: Slot::Blue }
}
fn green() -> AgentBuild {
    AgentBuild::Slot { slot: Slot::Green }
}
fn image(h: &str) -> AgentBuild {
    AgentBuild::Image { digest: digest(h) }
}
fn goal(generation: i64) -> Goal {
    Goal::new(generation, &format!("v1.34.{generation}"))
}
fn op(uid: &str) -> OpRef {
    OpRef {
        name: uid.into(),
        uid: format!("uid-{uid}"),
    }
}
fn claim(uid: &str, kind: ClaimKind) -> Input {
    Input::OperationClaimed(Claim {
        op: op(uid),
        kind,
        machine_generation: 1,
    })
}
fn upgrade(url: &str, sha: &str) -> ClaimKind {
    ClaimKind::AgentUpgrade {
        parameters: BTreeMap::from([
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), sha.to_string()),
        ]),
    }
}
fn host_upgrade() -> Input {
    claim("u1", upgrade("https://a.example/f.tgz", D2))
}
fn failed(msg: &str) -> Input {
    Input::EffectsFailed {
        message: msg.into(),
    }
}
fn started(build: AgentBuild) -> Input {
    Input::DaemonStarted {
        running: build.clone(),
        selected: Some(build),
    }
}
fn recover() -> Input {
    Input::RecoveryRequested {
        message: RECOVERY.into(),
    }
}
fn observe(node: NodeObservation, machine: MachineObservation) -> Input {
    Input::GoalObserved(GoalObservation { node, machine })
}
fn node_gone_goal(generation: i64) -> Input {
    observe(
        NodeObservation::Absent,
        MachineObservation::Present(goal(generation)),
    )
}
fn join(mode: InstallMode) -> Input {
    Input::Join(JoinRequest {
        node_name: "edge-07".into(),
        mode,
        arch: Arch::Amd64,
        goal: goal(1),
        agent: match mode {
            InstallMode::Host => blue(),
            InstallMode::Container => image(D1),
        },
    })
}

// ---- the table's vocabulary ---------------------------------------------------------------

/// Where a row starts.
#[derive(Clone, Copy, Debug)]
enum From {
    Unjoined,
    /// Joined (installed, started, `Ready`) in this mode.
    Joined(InstallMode),
}

impl From {
    fn state(self) -> NodeState {
        match self {
            Self::Unjoined => NodeState::default(),
            Self::Joined(mode) => {
                let mut s = NodeState::default();
                for i in [join(mode), Input::EffectsDone, Input::EffectsDone] {
                    s = step(&s, &i, &Policy::default(), T0)
                        .unwrap_or_else(|r| panic!("join refused: {r}"))
                        .next;
                }
                s
            }
        }
    }
}

/// One input, when it arrives (seconds after `T0`), and what must happen.
#[derive(Clone)]
enum Act {
    /// Accepted at `T0 + secs`.
    Feed(u64, Input),
    /// Refused with exactly this; the state is kept.
    Refuse(Input, Refusal),
    /// Refused with a refusal of this variant (its `Debug` starts so); the state is kept.
    RefuseKind(Input, &'static str),
}

/// A published result's message.
#[derive(Clone, Copy)]
enum Message {
    Exactly(&'static str),
    Contains(&'static str),
    Lacks(&'static str),
    Any,
}

/// What an accepted step must do; each field that is set is checked.
#[derive(Clone, Default)]
struct Then {
    /// The state reached, as `NodeState` shows its phase and step (`Upgrading/Staging`).
    state: Option<&'static str>,
    /// The state is the one the step started from.
    unchanged: bool,
    /// The effects' names, in order.
    effects: Option<&'static [&'static str]>,
    /// The effects, exactly.
    exactly: Option<Vec<Effect>>,
    /// The result published by this step.
    publishes: Option<(ResultReason, Message)>,
    /// The build the node runs afterwards.
    agent: Option<AgentBuild>,
    /// The active nspawn machine afterwards.
    active: Option<Side>,
    /// Anything else, on the state reached and the step's effects.
    check: Option<fn(&NodeState, &[Effect])>,
}

struct Row {
    name: &'static str,
    from: From,
    steps: Vec<(Act, Then)>,
}

fn feed(input: Input, then: Then) -> (Act, Then) {
    (Act::Feed(0, input), then)
}
fn at(secs: u64, input: Input, then: Then) -> (Act, Then) {
    (Act::Feed(secs, input), then)
}
fn refuse(input: Input, refusal: Refusal) -> (Act, Then) {
    (Act::Refuse(input, refusal), Then::default())
}
fn refuse_kind(input: Input, kind: &'static str) -> (Act, Then) {
    (Act::RefuseKind(input, kind), Then::default())
}
fn done(then: Then) -> (Act, Then) {
    feed(Input::EffectsDone, then)
}
fn any() -> Then {
    Then::default()
}
fn state(s: &'static str) -> Then {
    Then {
        state: Some(s),
        ..any()
    }
}
fn effects(names: &'static [&'static str]) -> Then {
    Then {
        effects: Some(names),
        ..any()
    }
}
fn exactly(e: Vec<Effect>) -> Then {
    Then {
        exactly: Some(e),
        ..any()
    }
}
fn publishes(reason: ResultReason, message: Message) -> Then {
    Then {
        publishes: Some((reason, message)),
        ..any()
    }
}
fn unchanged() -> Then {
    Then {
        unchanged: true,
        ..any()
    }
}

fn published(effects: &[Effect]) -> Option<(ResultReason, String)> {
    effects.iter().find_map(|e| match e {
        Effect::PublishResult { result, .. } => Some((result.reason, result.message.clone())),
        _ => None,
    })
}

fn reports_machine(effects: &[Effect], phase: MachinePhase, generation: Option<i64>) -> bool {
    matches!(effects, [Effect::ReportMachine { phase: p, observed_generation: g, .. }]
        if *p == phase && *g == generation)
}

/// Runs every row; panics naming each row and step that did not do what it says.
fn check(rows: &[Row]) {
    let mut failures = Vec::new();
    for row in rows {
        let mut s = row.from.state();
        for (i, (act, then)) in row.steps.iter().enumerate() {
            let at = format!("{} step {}", row.name, i + 1);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                check_step(&s, act, then)
            }));
            match outcome {
                Ok(next) => s = next,
                Err(e) => {
                    let why = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    failures.push(format!("{at}: {why}"));
                    break;
                }
            }
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn check_step(s: &NodeState, act: &Act, then: &Then) -> NodeState {
    let (input, now) = match act {
        Act::Feed(secs, input) => (input, T0.plus_secs(*secs as i64)),
        Act::Refuse(input, want) => {
            match step(s, input, &Policy::default(), T0) {
                Err(r) => assert_eq!(&r, want, "{input} in {s}"),
                Ok(st) => panic!("{input} accepted in {s}: {}", st.next),
            }
            return s.clone();
        }
        Act::RefuseKind(input, kind) => {
            match step(s, input, &Policy::default(), T0) {
                Err(r) => assert!(format!("{r:?}").starts_with(kind), "{input}: {r:?}"),
                Ok(st) => panic!("{input} accepted in {s}: {}", st.next),
            }
            return s.clone();
        }
    };
    let st = step(s, input, &Policy::default(), now)
        .unwrap_or_else(|r| panic!("{input} refused in {s}: {r}"));
    let (next, effects) = (st.next, st.effects);
    let shown = next.to_string();
    if let Some(want) = then.state {
        let got = shown.split(' ').next().unwrap_or_default();
        assert_eq!(got, want, "after {input}: {shown}");
    }
    if then.unchanged {
        assert_eq!(&next, s, "{input} changed the state");
    }
    if let Some(names) = then.effects {
        let got: Vec<&str> = effects.iter().map(Effect::name).collect();
        assert_eq!(got, names, "effects of {input}");
    }
    if let Some(want) = &then.exactly {
        assert_eq!(&effects, want, "effects of {input}");
    }
    if let Some((reason, message)) = then.publishes {
        let (got, text) =
            published(&effects).unwrap_or_else(|| panic!("{input} published nothing"));
        assert_eq!(got, reason, "{text}");
        match message {
            Message::Exactly(m) => assert_eq!(text, m),
            Message::Contains(m) => assert!(text.contains(m), "{text}"),
            Message::Lacks(m) => assert!(!text.contains(m), "{text}"),
            Message::Any => {}
        }
    }
    if let Some(agent) = &then.agent {
        assert_eq!(next.node().map(|n| &n.agent), Some(agent), "{shown}");
    }
    if let Some(side) = then.active {
        assert_eq!(next.node().map(|n| n.active), Some(side), "{shown}");
    }
    if let Some(f) = then.check {
        f(&next, &effects);
    }
    next
}

// ---- the rows -------------------------------------------------------------------------------

fn join_rows() -> Vec<Row> {
    let host = From::Joined(InstallMode::Host);
    vec![
        Row {
            name: "join installs, starts and reports Ready",
            from: From::Unjoined,
            steps: vec![
                feed(
                    join(InstallMode::Host),
                    Then {
                        state: Some("Joining/Installing"),
                        effects: Some(&[
                            "ReportMachine",
                            "InstallAgent",
                            "WriteUnits",
                            "DisableSwap",
                            "ProvisionMachine",
                            "StartMachine",
                            "AwaitNode",
                        ]),
                        ..any()
                    },
                ),
                done(effects(&["StartAgent"])),
                done(Then {
                    state: Some("Ready"),
                    active: Some(Side::Kube1),
                    agent: Some(blue()),
                    check: Some(|_, e| {
                        assert!(reports_machine(e, MachinePhase::Ready, Some(1)), "{e:?}");
                    }),
                    ..any()
                }),
                refuse(join(InstallMode::Host), Refusal::AlreadyJoined),
            ],
        },
        Row {
            name: "a failed join returns to Unjoined",
            from: From::Unjoined,
            steps: vec![
                feed(join(InstallMode::Host), any()),
                feed(failed("disk full"), state("Unjoined")),
            ],
        },
        Row {
            name: "a join past its deadline returns to Unjoined and reports Failed",
            from: From::Unjoined,
            steps: vec![
                feed(join(InstallMode::Host), any()),
                at(
                    1801,
                    Input::Tick,
                    Then {
                        state: Some("Unjoined"),
                        check: Some(|_, e| {
                            assert!(
                                matches!(
                                    e,
                                    [Effect::ReportMachine {
                                        phase: MachinePhase::Failed,
                                        ..
                                    }]
                                ),
                                "{e:?}"
                            );
                        }),
                        ..any()
                    },
                ),
            ],
        },
        Row {
            name: "Unjoined refuses everything but a join",
            from: From::Unjoined,
            steps: vec![
                refuse(claim("a", ClaimKind::node_reboot()), Refusal::NotJoined),
                refuse(Input::ResetRequested, Refusal::NotJoined),
                refuse_kind(Input::EffectsDone, "NothingPending"),
            ],
        },
        Row {
            name: "Ready records the build that actually runs",
            from: host,
            steps: vec![feed(
                started(green()),
                Then {
                    agent: Some(green()),
                    effects: Some(&[]),
                    ..any()
                },
            )],
        },
    ]
}

fn reboot_rows() -> Vec<Row> {
    let host = From::Joined(InstallMode::Host);
    let reboot = || claim("r1", ClaimKind::node_reboot());
    let reboot_with = |key: &str, value: &str| {
        claim(
            "r1",
            ClaimKind::NodeReboot {
                parameters: BTreeMap::from([(key.to_string(), value.to_string())]),
            },
        )
    };
    let drained = || {
        vec![
            feed(reboot(), state("Rebooting/Draining")),
            done(state("Rebooting/Restarting")),
        ]
    };
    let with = |mut prefix: Vec<(Act, Then)>, rest: Vec<(Act, Then)>| {
        prefix.extend(rest);
        prefix
    };
    vec![
        Row {
            name: "NodeReboot drains, restarts the active machine, uncordons and completes",
            from: host,
            steps: vec![
                feed(
                    reboot(),
                    Then {
                        state: Some("Rebooting/Draining"),
                        effects: Some(&["ReportProgress", "ReportMachine", "Drain"]),
                        // The Machine says Rebooting before the drain, its applied settings
                        // version kept; the drain is the operation's, as configured, for its
                        // timeout, and the operation's deadline counts it.
                        check: Some(|next, e| {
                            let applied = next.node().map(|n| n.applied.generation);
                            assert!(
                                reports_machine(&e[1..2], MachinePhase::Rebooting, applied),
                                "{:?}",
                                e[1]
                            );
                            let Effect::Drain {
                                run: Some(run),
                                holder,
                                policy,
                                until,
                            } = &e[2]
                            else {
                                panic!("{:?}", e[2])
                            };
                            assert_eq!(holder, "operation/uid-r1");
                            assert_eq!(policy, &DrainPolicy::default());
                            assert_eq!(*until, T0.plus_secs(600));
                            assert_eq!(run.deadline, T0.plus_secs(600 + 600));
                            assert_eq!(next.deadline(), Some(run.deadline));
                        }),
                        ..any()
                    },
                ),
                refuse(reboot(), Refusal::AlreadyRunning { op: op("r1") }),
                refuse_kind(claim("r2", ClaimKind::node_reboot()), "Busy"),
                at(
                    30,
                    Input::EffectsDone,
                    Then {
                        state: Some("Rebooting/Restarting"),
                        effects: Some(&["RestartMachine", "AwaitNode"]),
                        // Restarted once the drain is over, not before.
                        check: Some(|_, e| {
                            assert_eq!(
                                e[0],
                                Effect::RestartMachine {
                                    side: Side::Kube1,
                                    not_before: T0.plus_secs(30)
                                }
                            );
                        }),
                        ..any()
                    },
                ),
                done(Then {
                    state: Some("Ready"),
                    effects: Some(&["Uncordon", "PublishResult", "ReportMachine"]),
                    check: Some(|next, e| {
                        let applied = next.node().map(|n| n.applied.generation);
                        assert!(
                            reports_machine(&e[2..3], MachinePhase::Ready, applied),
                            "{:?}",
                            e[2]
                        );
                    }),
                    ..publishes(
                        ResultReason::Succeeded,
                        Message::Exactly("NodeReboot completed"),
                    )
                }),
                refuse(reboot(), Refusal::AlreadyFinished { op: op("r1") }),
            ],
        },
        Row {
            name: "a NodeReboot with drain \"false\" restarts at once",
            from: host,
            steps: vec![
                feed(
                    reboot_with("drain", "false"),
                    Then {
                        state: Some("Rebooting/Restarting"),
                        effects: Some(&[
                            "ReportProgress",
                            "ReportMachine",
                            "RestartMachine",
                            "AwaitNode",
                        ]),
                        check: Some(|next, _| {
                            assert_eq!(next.deadline(), Some(T0.plus_secs(600)));
                        }),
                        ..any()
                    },
                ),
                done(Then {
                    effects: Some(&["Uncordon", "PublishResult", "ReportMachine"]),
                    ..publishes(
                        ResultReason::Succeeded,
                        Message::Exactly("NodeReboot completed"),
                    )
                }),
            ],
        },
        Row {
            name: "a drain parameter the agent cannot read is InvalidParameters, nothing done",
            from: host,
            steps: vec![feed(
                reboot_with("drainTimeout", "whenever"),
                Then {
                    state: Some("Ready"),
                    effects: Some(&["PublishResult"]),
                    ..publishes(
                        ResultReason::InvalidParameters,
                        Message::Exactly(
                            "parameter drainTimeout must be a duration such as 90s, 10m or \
                             1h30m, at most 24h",
                        ),
                    )
                },
            )],
        },
        Row {
            name: "a drain that fails ends the NodeReboot uncordoned, nothing restarted",
            from: host,
            steps: vec![
                feed(reboot(), any()),
                feed(
                    failed(
                        "drain timed out after 10m0s: 1 pod left: default/web held by budget default/web",
                    ),
                    Then {
                        state: Some("Ready"),
                        effects: Some(&["Uncordon", "PublishResult", "ReportMachine"]),
                        ..publishes(
                            ResultReason::ExecutionFailed,
                            Message::Contains("held by budget default/web"),
                        )
                    },
                ),
            ],
        },
        Row {
            name: "a failed NodeReboot publishes ExecutionFailed with the failure",
            from: host,
            steps: with(
                drained(),
                vec![feed(
                    failed("machine kube1 did not start"),
                    Then {
                        effects: Some(&["Uncordon", "PublishResult", "ReportMachine"]),
                        ..publishes(
                            ResultReason::ExecutionFailed,
                            Message::Exactly("machine kube1 did not start"),
                        )
                    },
                )],
            ),
        },
        Row {
            name: "a NodeReboot waits for its deadline (its drain's time and its own), then \
                   times out",
            from: host,
            steps: vec![
                feed(reboot(), any()),
                at(
                    10,
                    Input::Tick,
                    Then {
                        unchanged: true,
                        effects: Some(&[]),
                        ..any()
                    },
                ),
                at(
                    1199,
                    Input::Tick,
                    Then {
                        unchanged: true,
                        ..any()
                    },
                ),
                at(
                    1201,
                    Input::Tick,
                    Then {
                        effects: Some(&["Uncordon", "PublishResult", "ReportMachine"]),
                        ..publishes(
                            ResultReason::ExecutionFailed,
                            Message::Exactly("NodeReboot timed out"),
                        )
                    },
                ),
            ],
        },
        Row {
            name: "a reset during a drain wipes without restarting and lifts the cordon",
            from: host,
            steps: vec![
                feed(reboot(), any()),
                feed(
                    Input::ResetRequested,
                    Then {
                        state: Some("Resetting/Wiping"),
                        effects: Some(&["PublishResult", "WipeNode", "Uncordon"]),
                        ..any()
                    },
                ),
            ],
        },
    ]
}

fn upgrade_rows() -> Vec<Row> {
    let host = From::Joined(InstallMode::Host);
    // Claimed, staged, switched, the restart scheduled: the old daemon waits for its successor.
    let handing_off = || {
        vec![
            feed(host_upgrade(), any()),
            done(any()),
            done(state("Upgrading/HandingOff")),
        ]
    };
    let with = |mut prefix: Vec<(Act, Then)>, rest: Vec<(Act, Then)>| {
        prefix.extend(rest);
        prefix
    };
    let mut rows = vec![
        Row {
            name: "a host upgrade stages, switches, hands off and succeeds",
            from: host,
            steps: vec![
                feed(
                    claim("u1", upgrade("https://a.example/f.tgz?sig=x", D2)),
                    Then {
                        state: Some("Upgrading/Staging"),
                        effects: Some(&["ReportProgress", "StageAgent"]),
                        check: Some(|s, _| {
                            let NodeState::Upgrading { candidate, .. } = s else {
                                panic!("{s}")
                            };
                            assert_eq!(*candidate, green());
                        }),
                        ..any()
                    },
                ),
                done(exactly(vec![Effect::SwitchAgent {
                    mode: InstallMode::Host,
                    to: green(),
                    last_good: blue(),
                }])),
                done(Then {
                    effects: Some(&["ScheduleAgentRestart"]),
                    check: Some(|s, _| {
                        assert!(!s.awaits_effects(), "a hand-off waits for the successor");
                    }),
                    ..any()
                }),
                // The restart-scheduling outcome arrives; still waiting for the successor.
                done(effects(&[])),
                refuse_kind(claim("u2", upgrade("https://a.example/g.tgz", D1)), "Busy"),
                feed(
                    started(green()),
                    Then {
                        state: Some("Ready"),
                        agent: Some(green()),
                        check: Some(|s, _| {
                            assert_eq!(s.node().and_then(|n| n.last_good.clone()), Some(blue()));
                        }),
                        ..publishes(
                            ResultReason::Succeeded,
                            Message::Exactly("AgentUpgrade completed"),
                        )
                    },
                ),
            ],
        },
        Row {
            name: "a container upgrade targets the image digest",
            from: From::Joined(InstallMode::Container),
            steps: vec![
                feed(
                    claim("u1", upgrade("oci://registry.example/flexnode:v2", D2)),
                    Then {
                        check: Some(|s, _| {
                            let NodeState::Upgrading { candidate, .. } = s else {
                                panic!("{s}")
                            };
                            assert_eq!(*candidate, image(D2));
                        }),
                        ..any()
                    },
                ),
                done(exactly(vec![Effect::SwitchAgent {
                    mode: InstallMode::Container,
                    to: image(D2),
                    last_good: image(D1),
                }])),
                done(any()),
                feed(
                    started(image(D2)),
                    Then {
                        agent: Some(image(D2)),
                        ..publishes(ResultReason::Succeeded, Message::Any)
                    },
                ),
            ],
        },
        Row {
            name: "a container upgrade to the image that runs completes without a switch",
            from: From::Joined(InstallMode::Container),
            steps: vec![
                feed(
                    started(image(D2)),
                    Then {
                        agent: Some(image(D2)),
                        ..any()
                    },
                ),
                feed(
                    claim("u1", upgrade("oci://registry.example/flexnode:v2", D2)),
                    Then {
                        state: Some("Ready"),
                        agent: Some(image(D2)),
                        check: Some(|_, effects| {
                            assert!(!effects.iter().any(Effect::is_disruptive), "{effects:?}");
                        }),
                        ..publishes(
                            ResultReason::Succeeded,
                            Message::Exactly(
                                "AgentUpgrade completed; the agent already runs that image",
                            ),
                        )
                    },
                ),
            ],
        },
        Row {
            name: "an archive URL on the container install is InvalidParameters",
            from: From::Joined(InstallMode::Container),
            steps: vec![feed(
                claim("bad", upgrade("https://a.example/f.tgz", D2)),
                publishes(ResultReason::InvalidParameters, Message::Any),
            )],
        },
        Row {
            name: "a staging failure aborts and publishes ExecutionFailed",
            from: host,
            steps: vec![
                feed(host_upgrade(), any()),
                feed(
                    failed("sha256 mismatch"),
                    Then {
                        check: Some(|s, _| {
                            assert!(
                                matches!(
                                    s,
                                    NodeState::Upgrading {
                                        phase: UpgradePhase::RollingBack { restart: false, .. },
                                        ..
                                    }
                                ),
                                "{s}"
                            );
                        }),
                        ..any()
                    },
                ),
                done(Then {
                    agent: Some(blue()),
                    ..publishes(
                        ResultReason::ExecutionFailed,
                        Message::Exactly("sha256 mismatch"),
                    )
                }),
            ],
        },
        Row {
            name: "a switch failure switches back",
            from: host,
            steps: vec![
                feed(host_upgrade(), any()),
                done(any()),
                feed(
                    failed("rename failed"),
                    exactly(vec![Effect::SwitchAgent {
                        mode: InstallMode::Host,
                        to: blue(),
                        last_good: blue(),
                    }]),
                ),
            ],
        },
        Row {
            name: "a restart-scheduling failure rolls back with the fixed message",
            from: host,
            steps: vec![
                feed(host_upgrade(), any()),
                done(any()),
                done(any()),
                feed(failed("dbus"), any()),
                done(publishes(
                    ResultReason::ExecutionFailed,
                    Message::Exactly("failed to restart upgraded agent daemon"),
                )),
            ],
        },
        Row {
            name: "no successor before the hand-off deadline rolls back",
            from: host,
            steps: with(
                handing_off(),
                vec![
                    at(301, Input::Tick, effects(&["SwitchAgent"])),
                    done(Then {
                        agent: Some(blue()),
                        ..publishes(ResultReason::ExecutionFailed, Message::Any)
                    }),
                ],
            ),
        },
        Row {
            name: "a crash-looping candidate goes through recovery; last-good publishes DaemonFailed",
            from: host,
            steps: with(
                handing_off(),
                vec![
                    feed(recover(), effects(&["SwitchAgent", "RestartAgent"])),
                    refuse(recover(), Refusal::NoUpgradePending),
                    feed(
                        started(blue()),
                        Then {
                            agent: Some(blue()),
                            ..publishes(ResultReason::DaemonFailed, Message::Exactly(RECOVERY))
                        },
                    ),
                    // A plain crash later never swaps binaries.
                    refuse(recover(), Refusal::NoUpgradePending),
                ],
            ),
        },
        Row {
            name: "a successor that is not the candidate means DaemonFailed",
            from: host,
            steps: with(
                handing_off(),
                vec![feed(
                    started(blue()),
                    publishes(ResultReason::DaemonFailed, Message::Any),
                )],
            ),
        },
        Row {
            name: "a failed abort restarts, and the next daemon reports",
            from: host,
            steps: vec![
                feed(host_upgrade(), any()),
                done(any()),
                feed(failed("switch failed"), any()),
                feed(
                    failed("switch back failed"),
                    exactly(vec![Effect::RestartAgent]),
                ),
                feed(
                    started(green()),
                    Then {
                        agent: Some(green()),
                        ..publishes(
                            ResultReason::ExecutionFailed,
                            Message::Contains("rollback failed"),
                        )
                    },
                ),
            ],
        },
    ];
    // Invalid parameters: only the result, nothing run, no part of the URL in the message.
    for (url, sha) in [
        ("https://a.example/f.tgz", ""),
        ("https://a.example/f.tgz", "abc"),
        ("oci://r.example/f:1", D2),
        ("https://user:pw@a.example/f.tgz", D2),
    ] {
        rows.push(Row {
            name: "invalid upgrade parameters publish InvalidParameters and run nothing",
            from: host,
            steps: vec![feed(
                claim("bad", upgrade(url, sha)),
                Then {
                    state: Some("Ready"),
                    effects: Some(&["PublishResult"]),
                    ..publishes(ResultReason::InvalidParameters, Message::Lacks("pw"))
                },
            )],
        });
    }
    rows
}

fn reset_rows() -> Vec<Row> {
    let host = From::Joined(InstallMode::Host);
    // Drained, wiped; the result is being published.
    let publishing = || {
        vec![
            feed(
                claim("x1", ClaimKind::agent_reset()),
                Then {
                    state: Some("Resetting/Draining"),
                    effects: Some(&["ReportProgress", "Drain"]),
                    ..any()
                },
            ),
            done(Then {
                state: Some("Resetting/Wiping"),
                effects: Some(&["WipeNode", "Uncordon"]),
                ..any()
            }),
            done(Then {
                effects: Some(&["PublishResult", "AwaitPublished"]),
                check: Some(|s, _| {
                    assert!(
                        matches!(
                            s,
                            NodeState::Resetting {
                                phase: ResetPhase::Publishing,
                                ..
                            }
                        ),
                        "{s}"
                    );
                }),
                ..publishes(ResultReason::Succeeded, Message::Any)
            }),
        ]
    };
    let with = |mut prefix: Vec<(Act, Then)>, rest: Vec<(Act, Then)>| {
        prefix.extend(rest);
        prefix
    };
    let taint = NodeObservation::Present {
        deletion_taint: true,
    };
    vec![
        Row {
            name: "AgentReset wipes, publishes, then uninstalls",
            from: host,
            steps: with(
                publishing(),
                vec![
                    done(effects(&["UninstallAgent"])),
                    done(state("Unjoined")),
                    refuse(claim("x1", ClaimKind::agent_reset()), Refusal::NotJoined),
                ],
            ),
        },
        Row {
            name: "AgentReset with the API server away retries at each tick, then uninstalls at the deadline",
            from: host,
            steps: with(
                publishing(),
                vec![
                    // A failed attempt waits for the next tick: attempts at once would all
                    // meet the same outage.
                    feed(failed("connection refused"), unchanged()),
                    at(2, Input::Tick, effects(&["AwaitPublished"])),
                    at(2, failed("connection refused"), unchanged()),
                    at(300, Input::Tick, effects(&["AwaitPublished"])),
                    at(300, failed("connection refused"), unchanged()),
                    at(601, Input::Tick, effects(&["UninstallAgent"])),
                    done(state("Unjoined")),
                ],
            ),
        },
        Row {
            name: "AgentReset publishes at the tick after the API server's return, then uninstalls",
            from: host,
            steps: with(
                publishing(),
                vec![
                    feed(failed("connection refused"), unchanged()),
                    at(300, Input::Tick, effects(&["AwaitPublished"])),
                    done(effects(&["UninstallAgent"])),
                    done(state("Unjoined")),
                ],
            ),
        },
        Row {
            name: "a failed AgentReset publishes and keeps the daemon",
            from: host,
            steps: vec![
                feed(claim("x1", ClaimKind::agent_reset()), any()),
                done(any()),
                feed(
                    failed("umount busy"),
                    Then {
                        state: Some("Ready"),
                        effects: Some(&["Uncordon", "PublishResult"]),
                        ..publishes(ResultReason::ExecutionFailed, Message::Any)
                    },
                ),
            ],
        },
        Row {
            name: "an AgentReset whose drain fails wipes nothing and lifts the cordon",
            from: host,
            steps: vec![
                feed(claim("x1", ClaimKind::agent_reset()), any()),
                feed(
                    failed("drain refused: default/db: its emptyDir data would be lost"),
                    Then {
                        state: Some("Ready"),
                        effects: Some(&["Uncordon", "PublishResult"]),
                        ..publishes(ResultReason::ExecutionFailed, Message::Contains("emptyDir"))
                    },
                ),
            ],
        },
        Row {
            name: "an AgentReset with drain \"false\" wipes at once",
            from: host,
            steps: vec![feed(
                claim(
                    "x1",
                    ClaimKind::AgentReset {
                        parameters: BTreeMap::from([("drain".into(), "false".into())]),
                    },
                ),
                Then {
                    state: Some("Resetting/Wiping"),
                    effects: Some(&["ReportProgress", "WipeNode", "Uncordon"]),
                    ..any()
                },
            )],
        },
        Row {
            name: "a CLI reset interrupting an operation publishes its result first",
            from: host,
            steps: vec![
                feed(claim("r1", ClaimKind::node_reboot()), any()),
                feed(
                    Input::ResetRequested,
                    Then {
                        effects: Some(&["PublishResult", "WipeNode", "Uncordon"]),
                        ..publishes(
                            ResultReason::ExecutionFailed,
                            Message::Exactly("interrupted by a node reset"),
                        )
                    },
                ),
                refuse(Input::ResetRequested, Refusal::ResetUnderWay),
                done(effects(&["UninstallAgent"])),
                done(state("Unjoined")),
            ],
        },
        Row {
            name: "the deletion taint alone waits for the Machine to go",
            from: host,
            steps: vec![feed(
                observe(taint, MachineObservation::Present(goal(1))),
                unchanged(),
            )],
        },
        Row {
            name: "a 404 alone never wipes",
            from: host,
            steps: vec![feed(
                observe(NodeObservation::Absent, MachineObservation::Missing),
                unchanged(),
            )],
        },
        Row {
            name: "the deletion signal (taint + Machine gone) resets without an operation",
            from: host,
            steps: vec![
                feed(
                    observe(taint, MachineObservation::Missing),
                    Then {
                        effects: Some(&["Drain"]),
                        // The Node is going: the drain does what budgets allow in its time,
                        // then the wipe goes ahead.
                        check: Some(|s, e| {
                            assert!(
                                matches!(
                                    s,
                                    NodeState::Resetting {
                                        cause: ResetCause::DeletionSignal,
                                        ..
                                    }
                                ),
                                "{s}"
                            );
                            assert!(
                                matches!(&e[0], Effect::Drain { run: None, policy, .. }
                                    if policy.on_timeout == OnTimeout::Proceed),
                                "{e:?}"
                            );
                        }),
                        ..any()
                    },
                ),
                done(effects(&["WipeNode", "Uncordon"])),
                done(effects(&["UninstallAgent"])),
                done(state("Unjoined")),
            ],
        },
    ]
}

fn repave_rows() -> Vec<Row> {
    let host = From::Joined(InstallMode::Host);
    let rolling_back = |s: &NodeState, _: &[Effect]| {
        assert!(
            matches!(
                s,
                NodeState::Repaving {
                    phase: RepavePhase::RollingBack { .. },
                    ..
                }
            ),
            "{s}"
        );
    };
    vec![
        Row {
            name: "a changed goal waits for the Node to go",
            from: host,
            steps: vec![feed(
                observe(
                    NodeObservation::Present {
                        deletion_taint: false,
                    },
                    MachineObservation::Present(goal(2)),
                ),
                unchanged(),
            )],
        },
        Row {
            name: "a repave provisions, switches over and retires",
            from: host,
            steps: vec![
                feed(
                    node_gone_goal(2),
                    effects(&["ReportMachine", "ProvisionMachine"]),
                ),
                // The old side's pods evicted before it stops.
                done(Then {
                    state: Some("Repaving/Draining"),
                    check: Some(|_, e| {
                        assert!(
                            matches!(e, [Effect::Drain { run: None, holder, .. }] if holder == "repave/2"),
                            "{e:?}"
                        );
                    }),
                    ..any()
                }),
                done(exactly(vec![
                    Effect::StopMachine { side: Side::Kube1 },
                    Effect::StartMachine { side: Side::Kube2 },
                    Effect::AwaitNode { side: Side::Kube2 },
                ])),
                done(exactly(vec![Effect::RemoveMachine { side: Side::Kube1 }])),
                done(Then {
                    active: Some(Side::Kube2),
                    check: Some(|s, e| {
                        let node = s.node().expect("node");
                        assert_eq!(node.applied, goal(2));
                        assert_eq!(node.previous, Some(goal(1)));
                        assert_eq!(e[0], Effect::Uncordon);
                        assert!(
                            reports_machine(&e[1..], MachinePhase::Ready, Some(2)),
                            "{e:?}"
                        );
                    }),
                    ..any()
                }),
            ],
        },
        Row {
            name: "a drain that fails drops the new side and keeps the old one running",
            from: host,
            steps: vec![
                feed(node_gone_goal(2), any()),
                done(state("Repaving/Draining")),
                feed(
                    failed("drain timed out after 10m0s: 1 pod left"),
                    Then {
                        state: Some("Ready"),
                        active: Some(Side::Kube1),
                        effects: Some(&["RemoveMachine", "Uncordon", "ReportMachine"]),
                        ..any()
                    },
                ),
            ],
        },
        Row {
            name: "a new side failing after the old one stopped rolls back automatically",
            from: host,
            steps: vec![
                feed(node_gone_goal(2), any()),
                done(any()),
                done(any()),
                feed(
                    failed("kubelet not ready on kube2"),
                    Then {
                        exactly: Some(vec![
                            Effect::StopMachine { side: Side::Kube2 },
                            Effect::StartMachine { side: Side::Kube1 },
                            Effect::AwaitNode { side: Side::Kube1 },
                        ]),
                        check: Some(rolling_back),
                        ..any()
                    },
                ),
                done(Then {
                    active: Some(Side::Kube1),
                    check: Some(|s, e| {
                        assert_eq!(s.node().map(|n| n.applied.clone()), Some(goal(1)));
                        assert!(
                            matches!(e, [Effect::Uncordon, Effect::ReportMachine { phase: MachinePhase::Failed, message, .. }]
                                if message.contains("rolled back")),
                            "{e:?}"
                        );
                    }),
                    ..any()
                }),
            ],
        },
        Row {
            name: "a provisioning failure keeps the old side running",
            from: host,
            steps: vec![
                feed(node_gone_goal(2), any()),
                feed(
                    failed("pull failed"),
                    Then {
                        active: Some(Side::Kube1),
                        check: Some(|_, e| {
                            assert!(!e.iter().any(|e| matches!(e, Effect::StopMachine { .. })));
                            assert_eq!(e[0], Effect::RemoveMachine { side: Side::Kube2 });
                        }),
                        ..any()
                    },
                ),
            ],
        },
        Row {
            name: "the deadline during the switch-over rolls back",
            from: host,
            steps: vec![
                feed(node_gone_goal(2), any()),
                done(any()),
                done(any()),
                at(
                    2401,
                    Input::Tick,
                    Then {
                        check: Some(rolling_back),
                        ..any()
                    },
                ),
            ],
        },
    ]
}

#[test]
fn join_and_ready() {
    check(&join_rows());
}

#[test]
fn node_reboot() {
    check(&reboot_rows());
}

#[test]
fn agent_upgrade() {
    check(&upgrade_rows());
}

#[test]
fn resets() {
    check(&reset_rows());
}

#[test]
fn repave() {
    check(&repave_rows());
}

/// The runner itself fails on a row that does not hold (a table that cannot fail tests
/// nothing).
#[test]
fn the_runner_names_a_row_that_does_not_hold() {
    let wrong = [Row {
        name: "NodeReboot publishes the wrong reason",
        from: From::Joined(InstallMode::Host),
        steps: vec![
            feed(claim("r1", ClaimKind::node_reboot()), any()),
            done(publishes(ResultReason::DaemonFailed, Message::Any)),
        ],
    }];
    let e = std::panic::catch_unwind(|| check(&wrong)).expect_err("must fail");
    let text = e.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        text.contains("NodeReboot publishes the wrong reason step 2"),
        "{text}"
    );
}
