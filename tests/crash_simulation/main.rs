//! The crash simulation, exhaustive over the core's transition table (`crash/`): for every
//! labelled transition of `flexnode::lifecycle::table`, the first scenario that shows it
//! is run again with a death before and after every event of its action — every host call
//! (an effect, a probe, a status write) and every commit of the store (the intent, the
//! outcome, the claim and result written with them) — and with a second death at every event
//! of the recovery from each. The real core, store and executor run against the simulated
//! host; a death leaves the store file as it was and the process's remaining code inert. A
//! sample of the deaths are real: a child process stopped at the point and SIGKILLed.

mod crash;

use crash::action::{Action, Modifier, after_death, node_images, quiesce};
use crash::crashes::{
    Clean, Outcome, clean, crashed, describe, judge_any, recovery_window, restarts_agent,
};
use crash::explore::{
    Covered, Explored, MODES, Scenario, Snapshot, Transition, coverage, explore, scratch,
};
use flexnode::sim::{PlannedCrash, SimNode, When};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Paused: the executor's waits (a Node that never becomes Ready) pass at once.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime")
}

fn death(at: usize, when: When) -> PlannedCrash {
    PlannedCrash {
        at,
        when,
        down_secs: Some(0),
    }
}

/// What the crash runs found, over all scenarios.
#[derive(Default)]
struct Tally {
    /// Deaths at an event of each transition (the one under way), per install mode.
    points: BTreeMap<Covered, usize>,
    first: usize,
    second: usize,
    failures: Vec<String>,
}

/// A death of the daemon restarts the agent: where the scenario broke that restart, a run
/// with a death may end as the run where it worked does (that end, then).
async fn working_restart(snapshot: &Snapshot, scenario: &Scenario) -> Option<Outcome> {
    match &scenario.modifier {
        Modifier::Break(call) if restarts_agent(call) => {
            let working = Scenario {
                modifier: Modifier::None,
                ..scenario.clone()
            };
            Some(clean(snapshot, &working).await.outcome)
        }
        Modifier::None | Modifier::Break(_) | Modifier::Kill(_) => None,
    }
}

/// Every death of one scenario, and a second one during each recovery.
async fn crash_scenario(explored: &Explored, k: usize, tally: &Mutex<Tally>) {
    let scenario = &explored.scenarios[k];
    let snapshot = &explored.snapshots[scenario.from];
    let clean: Clean = clean(snapshot, scenario).await;
    let working = working_restart(snapshot, scenario).await;
    let ends: Vec<&Outcome> = [
        Some(&clean.outcome),
        clean.restarted.as_ref(),
        clean.redelivered.as_ref(),
        working.as_ref(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let name = describe(snapshot, scenario);
    let started = Instant::now();
    let (mut first, mut second) = (0, 0);
    for (i, (event, under_way)) in clean.events.iter().enumerate() {
        for when in [When::Before, When::After] {
            let what = format!("{name}: death {when:?} event {i} {}", event.what);
            let (outcome, events, deaths) =
                crashed(snapshot, scenario, &[death(i, when)], &what).await;
            let verdict = judge_any(&ends, &outcome, deaths);
            first += 1;
            {
                let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(transition) = under_way {
                    *t.points
                        .entry((scenario.mode, transition.clone()))
                        .or_default() += 1;
                }
                if let Err(e) = verdict {
                    eprintln!("FAILED {what}: {e}");
                    t.failures.push(format!("{what}: {e}"));
                }
            }
            // A death after an event leaves what a death before the next one leaves (nothing
            // the process does between events outlives it): second deaths follow the distinct
            // first ones, and strike before each event of the recovery.
            if when == When::After && i + 1 < clean.events.len() {
                continue;
            }
            for j in recovery_window(&events, i) {
                let what = format!(
                    "{what}, then before event {j} {} (recovering)",
                    events[j].what
                );
                let plan = [death(i, when), death(j, When::Before)];
                let (outcome, _, deaths) = crashed(snapshot, scenario, &plan, &what).await;
                second += 1;
                if let Err(e) = judge_any(&ends, &outcome, deaths) {
                    eprintln!("FAILED {what}: {e}");
                    let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
                    t.failures.push(format!("{what}: {e}"));
                }
            }
        }
    }
    let mut t = tally.lock().unwrap_or_else(|p| p.into_inner());
    t.first += first;
    t.second += second;
    eprintln!(
        "scenario {}/{}: {name}: {} events, {} deaths ({:.1} s)",
        k + 1,
        explored.scenarios.len(),
        clean.events.len(),
        first + second,
        started.elapsed().as_secs_f64()
    );
}

/// Set in the environment of a child process of this test: it is the process a real death
/// happens in (what to run, as JSON).
const CHILD: &str = "FLEXNODE_CRASH_CHILD";
const STOPPED: &str = "STOPPED-AT-THE-PLANNED-DEATH";

/// What a child process runs: a scenario's action on the node saved in `dir`, until `death`.
#[derive(Serialize, Deserialize)]
struct ChildRun {
    dir: PathBuf,
    action: Action,
    modifier: Modifier,
    depth: usize,
    death: PlannedCrash,
}

/// The child: the action runs until the planned death, where the world is saved beside the
/// store and the process waits for its SIGKILL (the store left as the kill leaves it).
fn child(spec: &str) -> ! {
    let run: ChildRun = serde_json::from_str(spec).expect("the child's run");
    runtime().block_on(async {
        let mut node = SimNode::restore(&run.dir, node_images()).expect("the saved node");
        let (dir, clock) = (run.dir.clone(), node.clock.clone());
        node.host.stop_at_crash(Arc::new(move |world| {
            SimNode::save_world(&dir, world, clock.peek()).expect("the world saved");
            let mut out = std::io::stdout();
            let _ = writeln!(out, "{STOPPED}");
            let _ = out.flush();
            loop {
                std::thread::park();
            }
        }));
        let before = node.host.world().events.len();
        node.host.world().crash_plan.push(run.death);
        let outcome = crash::action::run(&mut node, run.action, &run.modifier, run.depth).await;
        let after = node.host.world().events.len();
        eprintln!(
            "the planned death (at event {}) never came: {outcome:?}; events {before}..{after}",
            run.death.at
        );
    });
    std::process::exit(3)
}

/// A death at event `i` (`when`) of scenario `k` as a real process death: a child process
/// runs the action until that point and is SIGKILLed there; the node then goes on from what
/// the dead process left (its store file, the world it saved) and must end like the run
/// without a death.
async fn real_death(
    explored: &Explored,
    k: usize,
    i: usize,
    when: When,
    ends: &[&Outcome],
) -> Result<(), String> {
    let scenario = &explored.scenarios[k];
    let snapshot = &explored.snapshots[scenario.from];
    let dir = scratch();
    snapshot.node.save(dir.path()).map_err(|e| e.to_string())?;
    let (base, calls) = {
        let w = snapshot.node.host.world();
        (w.events.len(), w.calls.len())
    };
    let death = PlannedCrash {
        at: base + i,
        when,
        down_secs: Some(0),
    };
    let spec = serde_json::to_string(&ChildRun {
        dir: dir.path().to_path_buf(),
        action: scenario.action,
        modifier: scenario.modifier.clone(),
        depth: snapshot.depth,
        death,
    })
    .map_err(|e| e.to_string())?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = std::process::Command::new(exe)
        .args([
            "--exact",
            "crash_at_every_boundary_of_every_transition",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, spec)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(
            std::fs::File::create(dir.path().join("child.log")).map_err(|e| e.to_string())?,
        ))
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            // libtest's own "test … ... " precedes it on the line.
            if line.ends_with(STOPPED) {
                let _ = tx.send(());
                return;
            }
        }
    });
    let stopped = rx.recv_timeout(Duration::from_secs(120));
    child.kill().map_err(|e| e.to_string())?;
    let status = child.wait().map_err(|e| e.to_string())?;
    stopped.map_err(|_| {
        let log = std::fs::read_to_string(dir.path().join("child.log")).unwrap_or_default();
        let tail: String = log.lines().rev().take(15).collect::<Vec<_>>().join("\n");
        format!("the child never reached the planned death ({status}): {tail}")
    })?;
    if std::os::unix::process::ExitStatusExt::signal(&status) != Some(9) {
        return Err(format!("the child was not killed by SIGKILL: {status}"));
    }
    let mut node = SimNode::restore(dir.path(), node_images()).map_err(|e| e.to_string())?;
    node.killed(death);
    after_death(&mut node, scenario.action, snapshot.depth)
        .await
        .map_err(|e| e.to_string())?;
    quiesce(&mut node).await.map_err(|e| e.to_string())?;
    judge_any(ends, &Outcome::of(&node, calls), 1)
}

/// Real deaths at a sample of the points: in every other scenario, before its first commit
/// and after its middle event.
async fn real_deaths(explored: &Explored) -> (usize, Vec<String>) {
    let (mut done, mut failures) = (0, Vec::new());
    for k in (0..explored.scenarios.len()).step_by(2) {
        let scenario = &explored.scenarios[k];
        let snapshot = &explored.snapshots[scenario.from];
        let clean = clean(snapshot, scenario).await;
        let working = working_restart(snapshot, scenario).await;
        let ends: Vec<&Outcome> = [
            Some(&clean.outcome),
            clean.restarted.as_ref(),
            clean.redelivered.as_ref(),
            working.as_ref(),
        ]
        .into_iter()
        .flatten()
        .collect();
        let name = describe(snapshot, scenario);
        let commit = clean.events.iter().position(|(e, _)| e.is_commit());
        let middle = clean.events.len() / 2;
        let points = commit
            .map(|c| (c, When::Before))
            .into_iter()
            .chain((!clean.events.is_empty()).then_some((middle, When::After)));
        for (i, when) in points {
            done += 1;
            if let Err(e) = real_death(explored, k, i, when, &ends).await {
                let event = &clean.events[i].0.what;
                failures.push(format!("{name}: SIGKILL {when:?} event {i} {event}: {e}"));
            }
        }
    }
    (done, failures)
}

#[test]
fn crash_at_every_boundary_of_every_transition() {
    if let Ok(spec) = std::env::var(CHILD) {
        child(&spec);
    }
    let started = Instant::now();
    let explored = runtime().block_on(explore());
    println!(
        "explored: {} runs, {} distinct nodes, {} scenarios for the table's {} transitions in both \
         install modes ({:.1} s)",
        explored.runs,
        explored.snapshots.len(),
        explored.scenarios.len(),
        explored.table.len(),
        started.elapsed().as_secs_f64()
    );
    let shown: BTreeSet<&Transition> = explored
        .scenarios
        .iter()
        .flat_map(|s| &s.transitions)
        .collect();
    let unknown: Vec<_> = shown
        .iter()
        .filter(|t| !explored.table.contains(**t))
        .collect();
    assert!(
        unknown.is_empty(),
        "the journal shows transitions the table does not have: {unknown:?}"
    );
    // The scenarios on every core, each worker on a runtime of its own.
    let next = AtomicUsize::new(0);
    let tally = Mutex::new(Tally::default());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                let rt = runtime();
                loop {
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    if k >= explored.scenarios.len() {
                        break;
                    }
                    rt.block_on(crash_scenario(&explored, k, &tally));
                }
            });
        }
    });
    let mut tally = tally.into_inner().unwrap_or_else(|p| p.into_inner());
    let (real, failures) = runtime().block_on(real_deaths(&explored));
    tally.failures.extend(failures);
    println!("real deaths: {real} child processes SIGKILLed at a planned point");
    println!(
        "crash points: {} deaths at an event of a transition, {} second deaths during the \
         recovery from one ({:.1} s in all)",
        tally.first,
        tally.second,
        started.elapsed().as_secs_f64()
    );
    println!("   host  container  transition");
    for t in &explored.table {
        let [host, container] =
            MODES.map(|(m, _)| tally.points.get(&(m, t.clone())).copied().unwrap_or(0));
        println!("  {host:>5}  {container:>9}  {} --{}--> {}", t.0, t.1, t.2);
    }
    for f in tally.failures.iter().take(40) {
        println!("FAILED {f}");
    }
    assert!(
        tally.failures.is_empty(),
        "{} of {} runs with deaths did not end like the run without (the first 40 above)",
        tally.failures.len(),
        tally.first + tally.second
    );
    let missing = coverage(&explored.table, &tally.points);
    assert!(
        missing.is_empty(),
        "transitions of the table without a crash point: {missing:?}"
    );
}
