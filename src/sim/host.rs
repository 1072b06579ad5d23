//! `SimHost`: a handle on the simulated world for the effects and for the harness (serve
//! artifacts, inject faults, read results, take a snapshot).

use super::world::*;
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::Timestamp;
use crate::lifecycle::agent::{AgentBuild, Slot};
use crate::lifecycle::result::{MachinePhase, OpResult};
use crate::lifecycle::state::{OpRef, Side};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// A unit in a [`HostSnapshot`]: its file and state, without times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitSnapshot {
    pub contents: String,
    pub file: bool,
    pub enabled: bool,
    pub active: bool,
    pub failed: bool,
    /// Its file changed since the last daemon-reload.
    pub stale: bool,
    pub masked: bool,
}

/// The simulated host and API server as a whole, without times (see [`SimHost::snapshot`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostSnapshot {
    pub units: BTreeMap<String, UnitSnapshot>,
    /// Per side: the provisioned Kubernetes version, whether its unit is enabled, and
    /// whether it runs.
    pub machines: BTreeMap<Side, (Option<String>, bool, bool)>,
    pub slots: BTreeMap<Slot, Build>,
    pub images: BTreeMap<String, Build>,
    pub current: Option<AgentBuild>,
    pub last_good: Option<AgentBuild>,
    pub runtime_files: bool,
    /// flexnode's drop-ins by unit, swap in the fstab, the kernel modules, others' images.
    pub drop_ins: BTreeMap<String, String>,
    pub fstab_swap: bool,
    pub kernel_modules: bool,
    pub foreign_images: std::collections::BTreeSet<String>,
    pub pending_restart_timers: usize,
    pub agent_restarts: u32,
    /// The first published result of each operation UID: reason and message.
    pub results: BTreeMap<String, (crate::lifecycle::result::ResultReason, String)>,
    /// The last Machine status written.
    pub machine_status: Option<(MachinePhase, String, Option<i64>)>,
    /// The Node's cordon, the pods still bound to it, every eviction.
    pub cordon: Option<String>,
    pub pods: Vec<String>,
    pub evictions: Vec<String>,
}

type TimeSource = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What a process does where a crash is planned instead of simulating it: it saves what
/// outlives it and waits for its SIGKILL (`tests/crash_simulation/main.rs`, the real deaths).
pub type StopAtCrash = Arc<dyn Fn(&World) + Send + Sync>;

#[derive(Clone, Default)]
pub struct SimHost {
    world: Arc<Mutex<World>>,
    time: Option<TimeSource>,
    /// Shared by every handle (the process's effects and store hooks hold clones).
    stop_at_crash: Arc<Mutex<Option<StopAtCrash>>>,
}

impl std::fmt::Debug for SimHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHost").finish_non_exhaustive()
    }
}

impl SimHost {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn world(&self) -> MutexGuard<'_, World> {
        let mut w = self.world.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(time) = &self.time {
            w.now = time();
        }
        w.fire_due_timers();
        w
    }

    /// Host time follows this source (the simulation clock) instead of `World::now`.
    pub fn set_time_source(&mut self, time: impl Fn() -> Timestamp + Send + Sync + 'static) {
        self.time = Some(Arc::new(time));
    }

    /// A host with this world (a copy of another's), on `time`.
    pub fn with_world(world: World, time: impl Fn() -> Timestamp + Send + Sync + 'static) -> Self {
        Self {
            world: Arc::new(Mutex::new(world)),
            time: Some(Arc::new(time)),
            stop_at_crash: Arc::default(),
        }
    }

    /// At a planned crash, run `stop` (which never returns) instead of simulating the death.
    pub fn stop_at_crash(&self, stop: StopAtCrash) {
        *self.stop_at_crash.lock().unwrap_or_else(|p| p.into_inner()) = Some(stop);
    }

    /// A new agent or CLI process starts: whatever the last one was is gone.
    pub fn new_process(&self) {
        self.world().dead = None;
    }

    /// The crash the current process died at, if it died; taken (the process is over).
    pub fn take_death(&self) -> Option<PlannedCrash> {
        self.world().dead.take()
    }

    /// The planned crash at the event about to be numbered `index`, `when`, if any.
    fn planned(w: &mut World, index: usize, when: When) -> Option<PlannedCrash> {
        let i = w
            .crash_plan
            .iter()
            .position(|c| c.at == index && c.when == when)?;
        Some(w.crash_plan.remove(i))
    }

    /// The process dies at `crash` (or stops there for its SIGKILL).
    fn die(&self, mut w: MutexGuard<'_, World>, crash: PlannedCrash) {
        let stop = self
            .stop_at_crash
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(stop) = stop {
            stop(&w);
        }
        w.dead = Some(crash);
    }

    /// A commit of the store (its commit hook): an event. A crash planned before it rolls it
    /// back (the process died before the commit landed); one planned after it lets it land.
    /// A dead process commits nothing. Returns whether to roll back.
    pub(super) fn commit(&self) -> bool {
        let mut w = self.world();
        if w.dead.is_some() {
            return true;
        }
        let (tables, begins) = std::mem::take(&mut w.tx);
        let index = w.events.len();
        let step = begins.or(w.step);
        w.events.push(Event {
            what: format!("commit({})", tables.join(", ")),
            step,
        });
        if let Some(crash) = Self::planned(&mut w, index, When::Before) {
            self.die(w, crash);
            return true;
        }
        w.step = step;
        if let Some(crash) = Self::planned(&mut w, index, When::After) {
            self.die(w, crash);
        }
        false
    }

    /// A row the store's open transaction changed (its update hook).
    pub(super) fn row_changed(&self, change: &str, table: &str, rowid: i64) {
        let mut w = self.world();
        if table == "journal" && change == "insert" {
            w.tx.1 = Some(rowid);
        }
        let entry = format!("{change} {table}");
        if !w.tx.0.contains(&entry) {
            w.tx.0.push(entry);
        }
    }

    /// The store's open transaction rolled back (its rollback hook).
    pub(super) fn rolled_back(&self) {
        self.world().tx = Default::default();
    }

    pub fn serve_artifact(&self, url: &str, sha256: &str, build: Build) {
        self.world()
            .artifacts
            .insert(url.to_string(), (sha256.to_string(), build));
    }

    pub fn serve_image(&self, digest: &str, build: Build) {
        self.world().registry.insert(digest.to_string(), build);
    }

    /// The registry's tag `reference` (`registry/repository:tag`) names `digest` (hex).
    pub fn tag_image(&self, reference: &str, digest: &str) {
        self.world()
            .tags
            .insert(reference.to_string(), digest.to_string());
    }

    pub fn inject(&self, call: &'static str, kind: FaultKind, nth: u32) {
        self.world().faults.push(Fault { call, kind, nth });
    }

    /// The agent's process exited (after a reset, or it died): its unit is inactive.
    pub fn agent_exited(&self) {
        self.world().stop_unit(crate::effects::AGENT_UNIT);
    }

    /// systemd (re)started the agent unit (a new agent process).
    pub fn agent_started(&self) {
        let mut w = self.world();
        w.dead = None;
        w.agent_restart_due = false;
        let now = w.now;
        if let Some(u) = w.units.get_mut(crate::effects::AGENT_UNIT) {
            u.active = true;
            u.active_since = Some(now);
        }
    }

    /// The build of the selected agent, as the agent unit would start it.
    pub fn selected_build(&self) -> Option<(AgentBuild, Build)> {
        let w = self.world();
        let current = w.current.clone()?;
        let build = w.build_of(&current)?;
        Some((current, build))
    }

    pub fn results(&self) -> Vec<(OpRef, OpResult)> {
        self.publishes()
            .into_iter()
            .map(|(op, result, _)| (op, result))
            .collect()
    }

    /// Every result publish, in order, with its `completedAt`.
    pub fn publishes(&self) -> Vec<(OpRef, OpResult, Timestamp)> {
        self.world()
            .api
            .iter()
            .filter_map(|w| match w {
                ApiWrite::Result {
                    op,
                    result,
                    completed_at,
                } => Some((op.clone(), result.clone(), *completed_at)),
                ApiWrite::Progress { .. } | ApiWrite::Machine { .. } => None,
            })
            .collect()
    }

    /// What the host and the API server hold now, without times and call logs: two runs that
    /// did the same things end in equal snapshots.
    pub fn snapshot(&self) -> HostSnapshot {
        let w = self.world();
        let mut results = BTreeMap::new();
        let mut machine_status = None;
        for write in &w.api {
            match write {
                ApiWrite::Result { op, result, .. } => {
                    results
                        .entry(op.uid.clone())
                        .or_insert_with(|| (result.reason, result.message.clone()));
                }
                ApiWrite::Machine {
                    phase,
                    message,
                    observed_generation,
                } => machine_status = Some((*phase, message.clone(), *observed_generation)),
                ApiWrite::Progress { .. } => {}
            }
        }
        HostSnapshot {
            units: w
                .units
                .iter()
                .map(|(name, u)| {
                    let state = UnitSnapshot {
                        contents: u.contents.clone(),
                        file: u.file,
                        enabled: u.enabled,
                        active: u.active,
                        failed: u.failed,
                        stale: u.stale,
                        masked: u.masked,
                    };
                    (name.clone(), state)
                })
                .collect(),
            machines: w
                .machines
                .iter()
                .map(|(side, m)| {
                    let state = (m.kubernetes_version.clone(), m.enabled, m.running);
                    (*side, state)
                })
                .collect(),
            slots: w.slots.clone(),
            images: w.images.clone(),
            current: w.current.clone(),
            last_good: w.last_good.clone(),
            runtime_files: w.runtime_files,
            drop_ins: w.drop_ins.clone(),
            fstab_swap: w.fstab_swap,
            kernel_modules: w.kernel_modules,
            foreign_images: w.foreign_images.clone(),
            pending_restart_timers: w.restart_timers.iter().filter(|t| !t.fired).count(),
            agent_restarts: w.agent_restarts,
            results,
            machine_status,
            cordon: w.cordon.clone(),
            pods: w.pods.clone(),
            evictions: w.evictions.clone(),
        }
    }

    /// Records the call (an event) and applies what is due at it: a planned crash, a named
    /// fault, a broken part. A dead process's calls never reach the host.
    pub(super) fn enter(
        &self,
        call: &'static str,
        detail: &str,
    ) -> Result<Option<PlannedCrash>, EffectError> {
        let mut w = self.world();
        if w.dead.is_some() {
            return Err(EffectError::Crashed);
        }
        let what = format!("{call}({detail})");
        let index = w.events.len();
        let step = w.step;
        w.events.push(Event {
            what: what.clone(),
            step,
        });
        let mut fired = None;
        for f in w.faults.iter_mut().filter(|f| f.call == call) {
            if f.nth == 0 {
                fired = Some(f.kind);
                f.nth = u32::MAX;
                break;
            }
            f.nth = f.nth.saturating_sub(1);
        }
        w.faults.retain(|f| f.nth != u32::MAX);
        let named = |when| PlannedCrash {
            at: index,
            when,
            down_secs: Some(0),
        };
        let (before, after) = match fired {
            Some(FaultKind::CrashBefore) => (Some(named(When::Before)), None),
            Some(FaultKind::CrashAfter) => (None, Some(named(When::After))),
            Some(FaultKind::Fail) | None => (
                Self::planned(&mut w, index, When::Before),
                Self::planned(&mut w, index, When::After),
            ),
        };
        // A call the process died before making never reached the host.
        if let Some(crash) = before {
            self.die(w, crash);
            return Err(EffectError::Crashed);
        }
        w.calls.push(what.clone());
        let failure = if fired == Some(FaultKind::Fail) {
            Some("injected")
        } else if w.broken.contains(&what) {
            Some("broken")
        } else {
            None
        };
        match (failure, after) {
            (Some(_), Some(crash)) => {
                self.die(w, crash);
                Err(EffectError::Crashed)
            }
            (Some(why), None) => Err(EffectError::Failed(format!("{call} failed ({why})"))),
            (None, after) => Ok(after),
        }
    }

    /// After a call took effect: the process dies if a crash was planned after it.
    fn after(&self, crash: Option<PlannedCrash>) -> EffectResult {
        match crash {
            Some(crash) => {
                self.die(self.world(), crash);
                Err(EffectError::Crashed)
            }
            None => Ok(()),
        }
    }

    pub(super) async fn pause(&self, call: &'static str) {
        let delay = self.world().slow.get(call).copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
    }

    /// A read: a crash "after" it is a crash all the same.
    pub(super) fn read(&self, call: &'static str, detail: &str) -> EffectResult {
        let crash = self.enter(call, detail)?;
        self.after(crash)
    }

    pub(super) fn run<T>(
        &self,
        call: &'static str,
        detail: &str,
        f: impl FnOnce(&mut World) -> EffectResult<T>,
    ) -> EffectResult<T> {
        let crash = self.enter(call, detail)?;
        let out = f(&mut self.world());
        self.after(crash)?;
        out
    }
}
