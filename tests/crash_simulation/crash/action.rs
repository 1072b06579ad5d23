//! What can happen to a simulated node, one action at a time: the table's inputs as the
//! world delivers them (a join, claims, observations, the daemon's starts and ticks, the
//! recovery unit, the operator's reset), each optionally with a broken host call or a death
//! the node does not come back from by itself.

use flexnode::config::{NodeImage, NodeImagePattern, NodeImages};
use flexnode::lifecycle::agent::{ImageRef, InstallMode, Sha256Hex};
use flexnode::lifecycle::input::{
    Claim, ClaimKind, GoalObservation, MachineObservation, NodeObservation,
};
use flexnode::lifecycle::state::{Goal, OpRef};
use flexnode::lifecycle::{Input, NodeState, Timestamp};
use flexnode::sim::{Build, GOAL_VERSION, PlannedCrash, SimError, SimNode, When, upgrade};
use flexnode::store::StoreReader;
use serde::{Deserialize, Serialize};

pub const T0: Timestamp = Timestamp::from_millis(1_785_578_400_000);
pub const NODE: &str = "edge-07";
/// The version a new Machine generation asks for (a repave).
pub const NEXT_VERSION: &str = "v1.35.1";
const URL: &str = "https://artifacts.example/flexnode-v2.tar.gz?sig=SECRETSAS";
const BROKEN_URL: &str = "https://artifacts.example/flexnode-broken.tar.gz?sig=SECRETSAS";
const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const BROKEN_SHA: &str = "abababababababababababababababababababababababababababababababab";
const IMAGE: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const BROKEN_IMAGE: &str = "bcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbcbc";
const NODE_IMAGES: [(&str, &str); 2] = [
    (
        GOAL_VERSION,
        "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc",
    ),
    (
        NEXT_VERSION,
        "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd",
    ),
];
/// Past every deadline of `Policy::default()` (the longest is 30 minutes).
const LATE_SECS: i64 = 2 * 3600;

/// An operation kind with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Claimed {
    /// Drained first (the default).
    Reboot,
    Reset,
    /// With the parameter `drain: "false"` (an operator who drained already).
    RebootUndrained,
    ResetUndrained,
    /// An upgrade by archive (valid for the host install; the container install refuses it).
    Archive,
    /// An archive whose daemon crashes at start.
    BrokenArchive,
    Image,
    BrokenImage,
    /// An upgrade with parameters no install mode accepts.
    Invalid,
}

impl Claimed {
    pub const ALL: [Claimed; 9] = [
        Self::Reboot,
        Self::Reset,
        Self::RebootUndrained,
        Self::ResetUndrained,
        Self::Archive,
        Self::BrokenArchive,
        Self::Image,
        Self::BrokenImage,
        Self::Invalid,
    ];

    fn kind(self) -> ClaimKind {
        match self {
            Self::Reboot => ClaimKind::node_reboot(),
            Self::Reset => ClaimKind::agent_reset(),
            Self::RebootUndrained => ClaimKind::NodeReboot {
                parameters: undrained(),
            },
            Self::ResetUndrained => ClaimKind::AgentReset {
                parameters: undrained(),
            },
            Self::Archive => upgrade(URL, SHA),
            Self::BrokenArchive => upgrade(BROKEN_URL, BROKEN_SHA),
            Self::Image => upgrade("oci://registry.example/flexnode:v2", IMAGE),
            Self::BrokenImage => upgrade("oci://registry.example/flexnode:v3", BROKEN_IMAGE),
            Self::Invalid => upgrade("ftp://artifacts.example/flexnode.tar.gz", SHA),
        }
    }
}

fn undrained() -> std::collections::BTreeMap<String, String> {
    [("drain".to_string(), "false".to_string())].into()
}

/// The Node and the Machine as a watch sees them: the Node absent, present or tainted for
/// deletion; the Machine missing, unreadable, at the joined generation or at the next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Observed {
    pub node: u8,
    pub machine: u8,
}

impl Observed {
    pub fn all() -> Vec<Observed> {
        (0..3)
            .flat_map(|node| (0..4).map(move |machine| Observed { node, machine }))
            .collect()
    }

    fn input(self) -> Input {
        let node = match self.node {
            0 => NodeObservation::Absent,
            n => NodeObservation::Present {
                deletion_taint: n == 2,
            },
        };
        let machine = match self.machine {
            0 => MachineObservation::Missing,
            1 => MachineObservation::Unknown,
            m => MachineObservation::Present(Goal::new(
                i64::from(m) - 1,
                if m == 2 { GOAL_VERSION } else { NEXT_VERSION },
            )),
        };
        Input::GoalObserved(GoalObservation { node, machine })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Action {
    /// `flexnode join` (then systemd starts the agent it enabled).
    Join(InstallMode),
    /// The daemon claims an operation addressed to it.
    Claim(Claimed),
    /// The daemon's watches see the Node and the Machine.
    Observe(Observed),
    /// systemd starts the agent (again), at once.
    RestartDaemon,
    /// The node was off past the state's deadline, then systemd starts the agent.
    RestartDaemonLate,
    /// The transient restart timers fire.
    Settle,
    /// The recovery unit runs (the agent unit failed repeatedly).
    RecoveryUnit,
    /// The operator runs `flexnode reset --yes`.
    CliReset,
    /// The clock reaches the state's deadline and the daemon ticks (with no restart timer
    /// pending: one fires long before any deadline).
    Deadline,
    /// The same a second before the deadline: what the tick starts may end after it.
    AlmostDeadline,
    /// The transient restart timers are gone without firing (systemd was re-executed, or
    /// someone stopped them).
    LoseRestartTimers,
}

/// What else happens while an action runs.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Modifier {
    None,
    /// This host call (`call(detail)`) fails every time.
    Break(String),
    /// The process dies right after this event of the action (an intent's commit) and
    /// nothing restarts it: the node sits with the step unfinished.
    Kill(usize),
}

/// A fresh node: nothing joined, the artifacts, images and node images served, pods bound
/// to its Node for the first drain to evict.
pub fn fresh(path: &std::path::Path) -> SimNode {
    let mut node = SimNode::new(path, T0);
    node.host.world().pods = vec!["default/web-0".into(), "default/web-1".into()];
    node.node_images = node_images();
    for (url, sha, crashes) in [(URL, SHA, false), (BROKEN_URL, BROKEN_SHA, true)] {
        node.host.serve_artifact(url, sha, build(crashes));
    }
    for (digest, crashes) in [(IMAGE, false), (BROKEN_IMAGE, true)] {
        node.host.serve_image(digest, build(crashes));
    }
    for (version, digest) in NODE_IMAGES {
        node.host.serve_image(digest, build(false));
        node.host
            .tag_image(&format!("registry.example/node:{version}"), digest);
    }
    node
}

/// The goal's version pinned, the next one through the pattern (its tag resolved).
pub fn node_images() -> NodeImages {
    let pins = NODE_IMAGES[..1]
        .iter()
        .map(|(version, digest)| {
            let image = NodeImage {
                image: ImageRef {
                    registry: "registry.example".into(),
                    repository: "node".into(),
                    tag: None,
                },
                digest: Sha256Hex::parse(digest).unwrap_or_else(|| unreachable!("a digest")),
            };
            (version.to_string(), image)
        })
        .collect();
    let pattern = NodeImagePattern::parse("oci://registry.example/node:{kubernetesVersion}")
        .unwrap_or_else(|e| unreachable!("the pattern: {e}"));
    NodeImages {
        pins,
        pattern: Some(pattern),
        archive: None,
    }
}

fn build(crashes: bool) -> Build {
    Build {
        version: if crashes { "0.3.0" } else { "0.2.0" }.into(),
        crashes,
    }
}

/// The state the node's store holds.
pub fn stored_state(node: &SimNode) -> NodeState {
    match node.store() {
        Some(store) => store.load().map(|p| p.state),
        None => StoreReader::open(&node.path).and_then(|r| r.load().map(|p| p.state)),
    }
    .unwrap_or_default()
}

/// Whether `action` can happen to `node` now (anything else changes nothing or is not how
/// the world works: a claim reaches only a running daemon, the recovery command does nothing
/// without an upgrade, a deadline needs one).
pub fn applies(node: &SimNode, state: &NodeState, action: Action) -> bool {
    let joined = !matches!(state, NodeState::Unjoined { .. });
    let installed = node.host.selected_build().is_some();
    // Until the harness (systemd's part) took them, fired in the world or not.
    let timers = !node.host.world().restart_timers.is_empty();
    match action {
        Action::Join(_) => !joined,
        Action::Claim(_) | Action::Observe(_) | Action::Settle => node.daemon_running(),
        Action::Deadline | Action::AlmostDeadline => {
            node.daemon_running() && state.deadline().is_some() && !timers
        }
        Action::LoseRestartTimers => timers,
        Action::RestartDaemon => installed && joined,
        Action::RestartDaemonLate => installed && state.deadline().is_some(),
        Action::RecoveryUnit => matches!(state, NodeState::Upgrading { .. }),
        Action::CliReset => joined,
    }
}

/// Runs `action` (the `depth`-th of its scenario: claims are named after it) under `modifier`.
/// `base`: the number of events before it (where a `Kill` counts from).
pub async fn run(
    node: &mut SimNode,
    action: Action,
    modifier: &Modifier,
    depth: usize,
) -> Result<(), SimError> {
    let base = node.host.world().events.len();
    match modifier {
        Modifier::None => {}
        Modifier::Break(call) => {
            node.host.world().broken.insert(call.clone());
        }
        Modifier::Kill(at) => node.host.world().crash_plan.push(PlannedCrash {
            at: base + at,
            when: When::After,
            down_secs: None,
        }),
    }
    let outcome = act(node, action, depth).await;
    node.host.world().broken.clear();
    match outcome {
        // The recovery unit found the restored build crashing too; a death by `Kill`.
        Err(SimError::CrashLoop | SimError::Down) => Ok(()),
        other => other,
    }
}

async fn act(node: &mut SimNode, action: Action, depth: usize) -> Result<(), SimError> {
    match action {
        Action::Join(mode) => {
            node.join(mode, NODE).await?;
            start_enabled_agent(node).await?;
        }
        Action::Claim(_) => watched(node, claim(action, depth)).await?,
        Action::Observe(observed) => watched(node, observed.input()).await?,
        Action::RestartDaemon => {
            node.restart_daemon().await?;
        }
        Action::RestartDaemonLate => {
            node.stop_process();
            node.host.agent_exited();
            node.clock.advance_secs(LATE_SECS);
            node.boot().await?;
        }
        Action::Settle => node.settle().await?,
        Action::LoseRestartTimers => node.host.world().restart_timers.clear(),
        Action::RecoveryUnit => node.recovery_unit().await?,
        Action::CliReset => {
            node.cli_reset().await?;
            start_enabled_agent(node).await?;
        }
        Action::Deadline | Action::AlmostDeadline => {
            if let Some(deadline) = stored_state(node).deadline() {
                let ahead = (deadline.millis() - node.clock.peek().millis()) / 1000;
                let ahead = if action == Action::Deadline {
                    ahead + 1
                } else {
                    ahead - 1
                };
                node.clock.advance_secs(ahead.max(0));
            }
            watched(node, Input::Tick).await?;
        }
    }
    Ok(())
}

/// What follows a death at a point of `action` (one a real process died at, SIGKILLed):
/// systemd restarts the agent (or a command finishes what was interrupted), then the action
/// goes on as it would have after the same death in this process — the watches deliver
/// their input again, a command is run again.
pub async fn after_death(node: &mut SimNode, action: Action, depth: usize) -> Result<(), SimError> {
    if !matches!(
        action,
        Action::Join(_) | Action::CliReset | Action::RecoveryUnit
    ) {
        match node.after_death().await {
            Ok(_) | Err(SimError::Down) => {}
            Err(e) => return Err(e),
        }
    }
    match action {
        Action::Claim(_) | Action::Observe(_) | Action::Deadline | Action::AlmostDeadline => {
            let input = match action {
                Action::Observe(observed) => observed.input(),
                Action::Deadline | Action::AlmostDeadline => Input::Tick,
                _ => claim(action, depth),
            };
            if node.daemon_running() {
                watched(node, input).await?;
            }
        }
        Action::Join(_) | Action::CliReset | Action::RecoveryUnit => {
            run(node, action, &Modifier::None, depth).await?
        }
        Action::Settle => node.settle().await?,
        Action::RestartDaemon | Action::RestartDaemonLate | Action::LoseRestartTimers => {}
    }
    Ok(())
}

fn claim(action: Action, depth: usize) -> Input {
    let kind = match action {
        Action::Claim(claimed) => claimed.kind(),
        _ => ClaimKind::node_reboot(),
    };
    Input::OperationClaimed(Claim {
        op: OpRef {
            name: format!("op-{depth}"),
            uid: format!("op{depth}"),
        },
        kind,
        machine_generation: 1,
    })
}

/// The daemon is fed what its watches and timer deliver, and delivered again by the next
/// daemon if it died first: an operation still Pending, the Node and Machine as they are,
/// the next tick. (The core refuses what it already took.)
async fn watched(node: &mut SimNode, input: Input) -> Result<(), SimError> {
    loop {
        let deaths = node.crashes;
        node.feed(input.clone()).await?;
        if node.crashes == deaths || !node.daemon_running() {
            return Ok(());
        }
    }
}

/// systemd runs the agent unit a command started (the join's `StartAgent`), or one a dead
/// CLI process left starting.
async fn start_enabled_agent(node: &mut SimNode) -> Result<(), SimError> {
    let active = node
        .host
        .world()
        .units
        .get(flexnode::effects::AGENT_UNIT)
        .is_some_and(|u| u.active);
    if active && !node.daemon_running() && node.host.selected_build().is_some() {
        node.boot().await?;
    }
    Ok(())
}

/// After an action: the restart timers fire, an agent systemd would run runs, and the
/// daemon publishes what waits in its outbox. Two runs that did the same things end alike.
pub async fn quiesce(node: &mut SimNode) -> Result<(), SimError> {
    node.settle().await?;
    start_enabled_agent(node).await?;
    node.settle().await?;
    if node.daemon_running() {
        node.runner()?.flush_outbox().await?;
    }
    Ok(())
}
