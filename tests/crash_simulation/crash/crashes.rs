//! A scenario run with deaths planned in it, and what must hold of every such run: it ends
//! like the run without a death.

use super::action::{Action, Modifier, applies, quiesce, run, stored_state};
use super::explore::{Scenario, Snapshot, Transition, last_seq, scratch, stored};
use flexnode::effects::AGENT_UNIT;
use flexnode::lifecycle::result::ResultReason;
use flexnode::lifecycle::state::NodeInfo;
use flexnode::lifecycle::table;
use flexnode::sim::{ApiWrite, Event, HostSnapshot, PlannedCrash, SimNode};
use std::collections::BTreeMap;

/// Host calls that carry out the core's disruptive effects (`Effect::is_disruptive`):
/// switching and restarting the agent, stopping, restarting and removing machines, wiping the
/// runtime, and uninstalling (disabling, removing units and links).
const DISRUPTIVE: [&str; 9] = [
    "restart(",
    "schedule_restart(",
    "select_agent(",
    "stop(",
    "remove_machine(",
    "wipe_runtime(",
    "remove_unit(",
    "disable(",
    "remove_agent_links(",
];

/// Calls that restart the agent daemon. A death of the daemon is a restart too (systemd
/// starts the agent again, onto whatever is selected): an interrupted restart effect is done
/// once the agent came back after its intent (`src/exec/apply.rs`), and a daemon a death
/// started on a build no longer selected restarts onto the selected one. So each death may
/// account for one such call fewer or more.
pub fn restarts_agent(call: &str) -> bool {
    call == format!("schedule_restart({AGENT_UNIT})") || call == format!("restart({AGENT_UNIT})")
}

/// How a run ended, for comparing runs.
#[derive(Debug)]
pub struct Outcome {
    /// The host and API server, agent restarts left out (see [`restarts_agent`]).
    host: HostSnapshot,
    state: String,
    node: Option<NodeInfo>,
    /// Every result written for each operation, as the API server keeps them (a write of
    /// the status an object already has is no new version).
    results: BTreeMap<String, Vec<(ResultReason, String)>>,
    /// Disruptive calls since the action began, and how often each was made.
    disruptive: BTreeMap<String, usize>,
    unpublished: Vec<String>,
    /// Agent restart calls since the action began.
    agent_restarts: usize,
}

impl Outcome {
    pub fn of(node: &SimNode, calls_before: usize) -> Self {
        let mut host = node.host.snapshot();
        host.agent_restarts = 0;
        let w = node.host.world();
        let mut results: BTreeMap<String, Vec<(ResultReason, String)>> = BTreeMap::new();
        for write in &w.api {
            if let ApiWrite::Result { op, result, .. } = write {
                results
                    .entry(op.uid.clone())
                    .or_default()
                    .push((result.reason, result.message.clone()));
            }
        }
        let mut disruptive = BTreeMap::new();
        let mut agent_restarts = 0;
        for call in &w.calls[calls_before..] {
            if restarts_agent(call) {
                agent_restarts += 1;
            } else if DISRUPTIVE.iter().any(|p| call.starts_with(p)) {
                *disruptive.entry(call.clone()).or_insert(0) += 1;
            }
        }
        drop(w);
        let state = stored_state(node);
        Self {
            host,
            state: table::label(&state),
            node: state.node().cloned(),
            results,
            disruptive,
            unpublished: unpublished(node),
            agent_restarts,
        }
    }
}

fn unpublished(node: &SimNode) -> Vec<String> {
    let waiting = match node.store() {
        Some(store) => store.unpublished(),
        None if !node.path.exists() => return Vec::new(),
        None => flexnode::store::Store::open(&node.path).and_then(|s| s.unpublished()),
    };
    let mut uids: Vec<String> = waiting
        .expect("the outbox reads")
        .into_iter()
        .map(|r| r.op.uid)
        .collect();
    uids.sort();
    uids
}

/// The run without a death: how it ended, and the action's events, each with the
/// transition under way when it happened.
pub struct Clean {
    pub outcome: Outcome,
    /// The same end, then the daemon started again at rest: a death is a restart, and a start
    /// at rest does work of its own (it removes the agent images nothing will run again).
    pub restarted: Option<Outcome>,
    /// An observation delivered again after the step it started ended: a restarted daemon's
    /// watch delivers it again, and a goal whose repave just failed is tried once more at
    /// once (src/reconcile/repave_pause.rs).
    pub redelivered: Option<Outcome>,
    pub events: Vec<(Event, Option<Transition>)>,
}

pub async fn clean(snapshot: &Snapshot, scenario: &Scenario) -> Clean {
    let dir = scratch();
    let mut node = fork(snapshot, &dir);
    let (base, calls, seq) = marks(&node);
    run(
        &mut node,
        scenario.action,
        &scenario.modifier,
        snapshot.depth,
    )
    .await
    .unwrap_or_else(|e| panic!("clean run of {}: {e}", describe(snapshot, scenario)));
    let events = node.host.world().events[base..].to_vec();
    let steps: BTreeMap<i64, Transition> = stored(&node, seq).transitions.into_iter().collect();
    let first = steps.keys().next().copied();
    // An event before the action's first intent belongs to the step it leads to.
    let events = events
        .into_iter()
        .map(|e| {
            let step = e.step.filter(|s| *s > seq).or(first);
            let under_way = step.and_then(|s| steps.get(&s)).cloned();
            (e, under_way)
        })
        .collect();
    quiesced(&mut node, snapshot, scenario).await;
    let outcome = Outcome::of(&node, calls);
    let mut restarted = None;
    if applies(&node, &stored_state(&node), Action::RestartDaemon) {
        run(
            &mut node,
            Action::RestartDaemon,
            &Modifier::None,
            snapshot.depth + 1,
        )
        .await
        .unwrap_or_else(|e| panic!("restarting after {}: {e}", describe(snapshot, scenario)));
        quiesced(&mut node, snapshot, scenario).await;
        restarted = Some(Outcome::of(&node, calls));
    }
    let redelivered = if matches!(scenario.action, Action::Observe(_)) {
        Some(redelivered(snapshot, scenario).await)
    } else {
        None
    };
    Clean {
        outcome,
        restarted,
        redelivered,
        events,
    }
}

/// After the action: the node quiesced (tests/crash_simulation/crash/action.rs, `quiesce`),
/// or the run names itself.
async fn quiesced(node: &mut SimNode, snapshot: &Snapshot, scenario: &Scenario) {
    quiesce(node)
        .await
        .unwrap_or_else(|e| panic!("quiescing {}: {e}", describe(snapshot, scenario)));
}

async fn redelivered(snapshot: &Snapshot, scenario: &Scenario) -> Outcome {
    let dir = scratch();
    let mut node = fork(snapshot, &dir);
    let (_, calls, _) = marks(&node);
    for _ in 0..2 {
        run(
            &mut node,
            scenario.action,
            &scenario.modifier,
            snapshot.depth,
        )
        .await
        .unwrap_or_else(|e| panic!("redelivery of {}: {e}", describe(snapshot, scenario)));
    }
    quiesced(&mut node, snapshot, scenario).await;
    Outcome::of(&node, calls)
}

fn fork(snapshot: &Snapshot, dir: &tempfile::TempDir) -> SimNode {
    snapshot
        .node
        .fork(&dir.path().join("state/state.db"))
        .expect("fork")
}

/// Events so far, calls so far, the last journal entry.
fn marks(node: &SimNode) -> (usize, usize, i64) {
    let w = node.host.world();
    let marks = (w.events.len(), w.calls.len());
    drop(w);
    (marks.0, marks.1, last_seq(node))
}

pub fn describe(snapshot: &Snapshot, scenario: &Scenario) -> String {
    let path: Vec<String> = snapshot
        .path
        .iter()
        .map(|(m, a)| match m {
            Modifier::None => format!("{a:?}"),
            m => format!("{a:?} [{m:?}]"),
        })
        .collect();
    format!(
        "{} → {:?} [{:?}]",
        path.join(" → "),
        scenario.action,
        scenario.modifier
    )
}

/// A run of the scenario with `plan` (event indices counted from the action's start): the
/// events it made from the action's start, and how it ended. Panics if a planned death did
/// not strike.
pub async fn crashed(
    snapshot: &Snapshot,
    scenario: &Scenario,
    plan: &[PlannedCrash],
    what: &str,
) -> (Outcome, Vec<Event>, usize) {
    let dir = scratch();
    let mut node = fork(snapshot, &dir);
    let (base, calls, _) = marks(&node);
    node.host
        .world()
        .crash_plan
        .extend(plan.iter().map(|c| PlannedCrash {
            at: base + c.at,
            ..*c
        }));
    let deaths_before = node.crashes;
    run(
        &mut node,
        scenario.action,
        &scenario.modifier,
        snapshot.depth,
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    quiesce(&mut node)
        .await
        .unwrap_or_else(|e| panic!("{what}: quiescing: {e}"));
    let deaths = (node.crashes - deaths_before) as usize;
    assert_eq!(
        deaths,
        plan.len(),
        "{what}: {} of the planned deaths struck (left: {:?})",
        deaths,
        node.host.world().crash_plan
    );
    let events = node.host.world().events[base..].to_vec();
    (Outcome::of(&node, calls), events, deaths)
}

/// What every run with deaths must show against the run without: the same end (host, API
/// server, store), exactly one result per operation and the same one, every disruptive call
/// made exactly as often, and agent restarts as often but for one per death.
/// The first difference, if any.
pub fn judge(clean: &Outcome, got: &Outcome, deaths: usize) -> Result<(), String> {
    // A drain's cordon outlives no step: a node at rest is never left cordoned.
    if matches!(got.state.as_str(), "Ready" | "Unjoined") && got.host.cordon.is_some() {
        return Err(format!("the Node is left cordoned: {:?}", got.host.cordon));
    }
    for (uid, results) in &got.results {
        if results.len() > 1 {
            return Err(format!("{uid} has {} results: {results:?}", results.len()));
        }
    }
    if got.results != clean.results {
        return Err(format!(
            "results differ: {:?}, clean run {:?}",
            got.results, clean.results
        ));
    }
    if got.disruptive != clean.disruptive {
        return Err(format!(
            "disruptive calls differ: {:?}, clean run {:?}",
            got.disruptive, clean.disruptive
        ));
    }
    if got.agent_restarts.abs_diff(clean.agent_restarts) > deaths {
        return Err(format!(
            "{} agent restart calls (+{deaths} deaths), clean run {}",
            got.agent_restarts, clean.agent_restarts
        ));
    }
    let store = |o: &Outcome| (o.state.clone(), o.node.clone(), o.unpublished.clone());
    if store(got) != store(clean) {
        return Err(format!(
            "the store ends differently: {:?}, clean run {:?}",
            store(got),
            store(clean)
        ));
    }
    if got.host != clean.host {
        return Err(format!(
            "the host ends differently: {:?}, clean run {:?}",
            got.host, clean.host
        ));
    }
    Ok(())
}

/// [`judge`] against several acceptable ends: the first difference from the first, if none
/// matches.
pub fn judge_any(cleans: &[&Outcome], got: &Outcome, deaths: usize) -> Result<(), String> {
    let mut first = None;
    for clean in cleans {
        match judge(clean, got, deaths) {
            Ok(()) => return Ok(()),
            Err(e) => {
                first.get_or_insert(e);
            }
        }
    }
    Err(first.unwrap_or_else(|| "nothing to compare with".into()))
}

/// The recovery from a death at `at` in `events`: the events after it up to the first
/// commit that records a step's outcome (the interrupted step finished or superseded), at
/// most 8.
pub fn recovery_window(events: &[Event], at: usize) -> Vec<usize> {
    let mut window = Vec::new();
    for (i, e) in events.iter().enumerate().skip(at + 1).take(8) {
        window.push(i);
        if e.is_commit() && e.what.contains("update journal") {
            break;
        }
    }
    window
}
