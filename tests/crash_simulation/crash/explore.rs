//! Scenarios from the transition table: starting from a fresh node, every action (plain, with
//! each host call it makes broken, and with a death after each intent it writes) is run on a
//! copy of every distinct node reached, breadth first, until every labelled transition of the
//! core's table (`flexnode::lifecycle::table`) has been seen in the node's own journal, in each
//! install mode. Each transition's scenario, per mode, is the first (shortest) run that
//! showed it.

use super::action::{Action, Claimed, Modifier, Observed, applies, fresh, run};
use flexnode::lifecycle::NodeState;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::lifecycle::table;
use flexnode::sim::{Event, SimNode};
use flexnode::store::StoreReader;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A labelled transition: from, input, to (as `table::transitions` names them).
pub type Transition = (String, String, String);

/// The install modes, each explored to the whole table: the same transitions carry other
/// effects in each (a slot or an image switched, a unit or a container restarted).
pub const MODES: [(&str, InstallMode); 2] = [
    ("host", InstallMode::Host),
    ("container", InstallMode::Container),
];

/// A transition in an install mode (its name in [`MODES`]).
pub type Covered = (&'static str, Transition);

fn mode_name(mode: InstallMode) -> &'static str {
    match mode {
        InstallMode::Host => MODES[0].0,
        InstallMode::Container => MODES[1].0,
    }
}

/// A node reached by a sequence of actions, kept to start runs from.
pub struct Snapshot {
    pub node: SimNode,
    pub state: NodeState,
    /// The last journal entry.
    pub last_seq: i64,
    pub depth: usize,
    pub path: Vec<(Modifier, Action)>,
    _dir: tempfile::TempDir,
}

/// A run that showed transitions nobody showed before it.
#[derive(Clone)]
pub struct Scenario {
    /// The snapshot it starts from.
    pub from: usize,
    /// The node's install mode (a [`MODES`] name).
    pub mode: &'static str,
    pub modifier: Modifier,
    pub action: Action,
    /// The transitions its journal shows, in order.
    pub transitions: Vec<Transition>,
}

pub struct Explored {
    pub snapshots: Vec<Snapshot>,
    pub scenarios: Vec<Scenario>,
    /// The table's transitions.
    pub table: BTreeSet<Transition>,
    /// Runs made to explore.
    pub runs: usize,
}

/// A directory for a node's store: on tmpfs where there is one (a commit's fsync is then
/// free, and the exploration makes thousands).
pub fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        tempfile::tempdir_in(shm).expect("a directory in /dev/shm")
    } else {
        tempfile::tempdir().expect("a temporary directory")
    }
}

/// Every action there is.
pub fn actions() -> Vec<Action> {
    let mut all = vec![
        Action::Join(InstallMode::Host),
        Action::Join(InstallMode::Container),
    ];
    all.extend(Claimed::ALL.map(Action::Claim));
    all.extend(Observed::all().into_iter().map(Action::Observe));
    all.extend([
        Action::RestartDaemon,
        Action::RestartDaemonLate,
        Action::Settle,
        Action::RecoveryUnit,
        Action::CliReset,
        Action::Deadline,
        Action::AlmostDeadline,
        Action::LoseRestartTimers,
    ]);
    all
}

/// A state's label as `table::label` writes it, from its journal rendering
/// ("Upgrading/Staging op=… side=…" → "Upgrading_Staging").
fn state_label(rendered: &str) -> String {
    rendered
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .replace('/', "_")
}

/// The table's transitions, explored once per test binary.
pub fn table() -> &'static BTreeSet<Transition> {
    static TABLE: std::sync::OnceLock<BTreeSet<Transition>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| table::transitions(&table::explore()))
}

/// A journal entry as the table labels it: a tick is a `deadline` where it found the
/// deadline due (the journal does not say; the table tells the two apart by the states).
fn transition(from: &str, input: &str, to: &str) -> Transition {
    let (from, to) = (state_label(from), state_label(to));
    let name = input.split('(').next().unwrap_or_default();
    let tick = (from.clone(), "Tick".to_string(), to.clone());
    if name == "Tick" && !table().contains(&tick) {
        return (from, "deadline".into(), to);
    }
    (from, name.into(), to)
}

/// What a node's store holds: the state, whether a step waits (its intent or its outcome),
/// and the journal's transitions after `after`, as (seq, transition). Read through the
/// running process's connection when one runs (opening another costs more than the read).
pub struct Stored {
    pub state: NodeState,
    pub waiting: (bool, bool),
    pub transitions: Vec<(i64, Transition)>,
}

pub fn stored(node: &SimNode, after: i64) -> Stored {
    let none = || Stored {
        state: NodeState::default(),
        waiting: (false, false),
        transitions: Vec::new(),
    };
    let (persisted, journal) = match node.store() {
        Some(store) => (store.load(), store.journal(500)),
        // A node no process ran on has no store yet.
        None if !node.path.exists() => return none(),
        None => {
            let reader = StoreReader::open(&node.path).expect("the store reads");
            (reader.load(), reader.journal(500))
        }
    };
    let persisted = persisted.expect("the state reads");
    let transitions = journal
        .expect("the journal reads")
        .into_iter()
        .filter(|e| e.seq > after)
        .map(|e| (e.seq, transition(&e.from, &e.input, &e.to)))
        .collect();
    Stored {
        state: persisted.state,
        waiting: (persisted.pending.is_some(), persisted.report.is_some()),
        transitions,
    }
}

pub fn last_seq(node: &SimNode) -> i64 {
    stored(node, 0)
        .transitions
        .last()
        .map_or(0, |(seq, _)| *seq)
}

/// What tells two nodes apart for exploring: the state's label and mode, the processes,
/// and what waits (an unfinished step, an outcome, restart timers).
fn key(node: &SimNode, stored: &Stored) -> String {
    let w = node.host.world();
    format!(
        "{} {:?} daemon={} waiting={:?} timers={} selected={:?}",
        table::label(&stored.state),
        stored.state.node().map(|n| n.mode),
        node.daemon_running(),
        stored.waiting,
        w.restart_timers.iter().any(|t| !t.fired),
        w.current,
    )
}

/// One action on a copy of `snapshot`: the copy after it, what its store holds (the
/// journal's transitions being the action's), and the events it made.
pub async fn try_run(
    snapshot: &Snapshot,
    modifier: &Modifier,
    action: Action,
) -> (SimNode, tempfile::TempDir, Vec<Event>, Stored) {
    let dir = scratch();
    let mut node = snapshot
        .node
        .fork(&dir.path().join("state/state.db"))
        .expect("fork");
    let base = node.host.world().events.len();
    let what = format!("{:?} then {modifier:?} {action:?}", snapshot.path);
    run(&mut node, action, modifier, snapshot.depth)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let events = node.host.world().events[base..].to_vec();
    let after = stored(&node, snapshot.last_seq);
    (node, dir, events, after)
}

pub async fn explore() -> Explored {
    let table = table().clone();
    let dir = scratch();
    let root = Snapshot {
        node: fresh(&dir.path().join("state/state.db")),
        state: NodeState::default(),
        last_seq: 0,
        depth: 0,
        path: Vec::new(),
        _dir: dir,
    };
    let mut seen = BTreeSet::from([key(&root.node, &stored(&root.node, 0))]);
    let mut snapshots = vec![root];
    let mut queue = VecDeque::from([0usize]);
    let mut covered: BTreeSet<Covered> = BTreeSet::new();
    let whole = |covered: &BTreeSet<Covered>| {
        MODES
            .iter()
            .all(|(m, _)| table.iter().all(|t| covered.contains(&(*m, t.clone()))))
    };
    let mut scenarios = Vec::new();
    let mut runs = 0;
    'explore: while let Some(from) = queue.pop_front() {
        for action in actions() {
            if !applies(&snapshots[from].node, &snapshots[from].state, action) {
                continue;
            }
            let mode = match action {
                Action::Join(mode) => Some(mode),
                _ => snapshots[from].state.node().map(|n| n.mode),
            }
            .map(mode_name);
            let mut modifiers = VecDeque::from([Modifier::None]);
            let mut tried = BTreeSet::new();
            while let Some(modifier) = modifiers.pop_front() {
                let (node, dir, events, after) = try_run(&snapshots[from], &modifier, action).await;
                runs += 1;
                if runs % 500 == 0 {
                    eprintln!(
                        "exploring: {runs} runs, {} nodes, {} of {} transitions in both modes",
                        snapshots.len(),
                        covered.len(),
                        2 * table.len()
                    );
                }
                // A step's effects fail alike whichever of its calls fails: the first call of
                // each step is broken (not a Machine status report, whose failure a step
                // outlives).
                if modifier == Modifier::None && !after.transitions.is_empty() {
                    for (i, e) in events.iter().enumerate() {
                        if e.is_commit() && e.what.contains("insert journal") {
                            modifiers.push_back(Modifier::Kill(i));
                        } else if !e.is_commit()
                            && !e.what.starts_with("report_machine(")
                            && tried.insert(e.step)
                        {
                            modifiers.push_back(Modifier::Break(e.what.clone()));
                        }
                    }
                }
                let transitions: Vec<Transition> =
                    after.transitions.iter().map(|(_, t)| t.clone()).collect();
                let new = |t: &Transition| mode.is_some_and(|m| !covered.contains(&(m, t.clone())));
                if let Some(mode) = mode.filter(|_| transitions.iter().any(new)) {
                    covered.extend(transitions.iter().map(|t| (mode, t.clone())));
                    scenarios.push(Scenario {
                        from,
                        mode,
                        modifier: modifier.clone(),
                        action,
                        transitions,
                    });
                }
                if seen.insert(key(&node, &after)) {
                    let mut path = snapshots[from].path.clone();
                    path.push((modifier, action));
                    let last_seq = after
                        .transitions
                        .last()
                        .map_or(snapshots[from].last_seq, |(seq, _)| *seq);
                    snapshots.push(Snapshot {
                        node,
                        state: after.state,
                        last_seq,
                        depth: snapshots[from].depth + 1,
                        path,
                        _dir: dir,
                    });
                    queue.push_back(snapshots.len() - 1);
                }
                if whole(&covered) {
                    break 'explore;
                }
            }
        }
    }
    Explored {
        snapshots,
        scenarios,
        table,
        runs,
    }
}

/// The transitions of the table, in each install mode, where no crash point struck.
pub fn coverage(table: &BTreeSet<Transition>, points: &BTreeMap<Covered, usize>) -> Vec<Covered> {
    MODES
        .iter()
        .flat_map(|(m, _)| table.iter().map(move |t| (*m, t.clone())))
        .filter(|c| points.get(c).copied().unwrap_or(0) == 0)
        .collect()
}
