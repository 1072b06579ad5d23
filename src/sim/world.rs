//! The simulated host's model: units as systemd knows them, nspawn machines, agent slots and
//! images, what the artifact server and registry serve, the API server's writes, scripted
//! faults, and every call made.

use crate::effects::{EffectError, EffectResult, machine_unit};
use crate::lifecycle::Timestamp;
use crate::lifecycle::agent::{AgentBuild, Slot};
use crate::lifecycle::result::{MachinePhase, OpResult};
use crate::lifecycle::state::{OpRef, Side};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A build the artifact server or registry offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Build {
    pub version: String,
    /// The daemon of this build crashes at start (the `version` check still passes).
    pub crashes: bool,
}

/// A unit as systemd knows it: its file (if installed) and its runtime state. As in systemd, a
/// unit whose file is removed keeps running until stopped; an inactive unit without a file is
/// forgotten (garbage-collected).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimUnit {
    pub contents: String,
    /// The unit file is installed (`write_unit`, until `remove_unit`).
    pub file: bool,
    pub enabled: bool,
    pub active: bool,
    pub active_since: Option<Timestamp>,
    /// Its process exits non-zero: every start fails and leaves the unit `failed`.
    pub fails: bool,
    /// The last start failed (cleared by `reset_failed` or a successful start).
    pub failed: bool,
    /// The file changed since the last daemon-reload.
    pub stale: bool,
    /// Masked: it never starts.
    pub masked: bool,
}

/// A transient timer made by `schedule_restart`. The simulated systemd fires it once its time
/// has come (restarting the unit at `due`); a harness playing systemd's part for the agent
/// process takes it from [`World::restart_timers`] instead, and a taken timer never fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestartTimer {
    pub unit: String,
    pub delay_ms: u64,
    pub due: Timestamp,
    /// The simulated systemd already restarted the unit.
    pub fired: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SimMachine {
    pub kubernetes_version: Option<String>,
    /// The node image its tree was unpacked from (hex digest); `None`: the minimal tree.
    pub image: Option<String>,
    /// The Machine generation its files were written for.
    #[serde(default)]
    pub generation: Option<i64>,
    /// An image unpacked into the tree, not completed yet.
    pub unpacked: Option<String>,
    /// Its unit (an instance of systemd's own template) is enabled.
    pub enabled: bool,
    pub running: bool,
    /// When it started; `None` while stopped (systemd has no active time for an inactive unit).
    pub started_at: Option<Timestamp>,
    /// Starting this machine fails (its kubelet never gets ready).
    pub broken: bool,
}

/// A status write seen by the simulated API server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ApiWrite {
    Progress {
        op: OpRef,
        message: String,
        machine_generation: i64,
    },
    /// Every publish is kept, with the `completedAt` it carried: a re-publish of the same
    /// result is idempotent on a real API server, one with another time is a second result.
    Result {
        op: OpRef,
        result: OpResult,
        completed_at: Timestamp,
    },
    Machine {
        phase: MachinePhase,
        message: String,
        observed_generation: Option<i64>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The call fails with a message.
    Fail,
    /// The process dies before the call does anything.
    CrashBefore,
    /// The process dies right after the call took effect.
    CrashAfter,
}

/// Fires once, at the `nth` (0-based) call of the named method from now on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub call: &'static str,
    pub kind: FaultKind,
    pub nth: u32,
}

/// A point in the life of the simulated agent processes where one can die: a host call or
/// a commit of the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// `call(detail)`, or `commit(<the rows' tables and changes>)`.
    pub what: String,
    /// The journal entry (step) under way: the last one whose intent was committed, or the
    /// one this commit begins.
    pub step: Option<i64>,
}

impl Event {
    pub fn is_commit(&self) -> bool {
        self.what.starts_with("commit(")
    }
}

/// Before or after an event: a call the process died after took effect; a commit it died
/// before (or during) did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum When {
    Before,
    After,
}

/// A death planned at an event (its index in [`World::events`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedCrash {
    pub at: usize,
    pub when: When,
    /// How long the node stays down before an agent process runs again (0: systemd
    /// restarts the agent at once); `None`: it stays down until someone starts it.
    pub down_secs: Option<i64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct World {
    pub now: Timestamp,
    pub units: BTreeMap<String, SimUnit>,
    pub reloads: u32,
    pub machines: BTreeMap<Side, SimMachine>,
    /// Host install: what each slot holds.
    pub slots: BTreeMap<Slot, Build>,
    /// Container install: images the agent pulled, by digest.
    pub images: BTreeMap<String, Build>,
    /// Images present in containerd that someone else pulled (not labelled as the agent's).
    pub foreign_images: std::collections::BTreeSet<String>,
    pub current: Option<AgentBuild>,
    pub last_good: Option<AgentBuild>,
    pub runtime_files: bool,
    /// flexnode's drop-ins by unit.
    pub drop_ins: BTreeMap<String, String>,
    /// Swap lines in the host's fstab that are not commented out.
    pub fstab_swap: bool,
    /// The machines' kernel modules loaded (and listed for boots).
    pub kernel_modules: bool,
    /// What the artifact server serves: URL → (sha256, build).
    pub artifacts: BTreeMap<String, (String, Build)>,
    /// What the registry serves: digest → build.
    pub registry: BTreeMap<String, Build>,
    /// The registry's tags: `registry/repository:tag` → hex digest.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// Scheduled restarts, until a harness takes them (fired or not).
    pub restart_timers: Vec<RestartTimer>,
    /// `restart` calls on the agent unit.
    pub agent_restarts: u32,
    /// The agent unit was restarted while a process of it ran: systemd replaces that process
    /// (the harness playing systemd's part starts the new one).
    pub agent_restart_due: bool,
    pub api: Vec<ApiWrite>,
    pub api_down: bool,
    /// The Node's cordon: `Some(holder)` when a drain placed it, `Some("")` when someone else
    /// did (an operator); `None`: schedulable.
    #[serde(default)]
    pub cordon: Option<String>,
    /// The pods (`namespace/name`) bound to the node, each made again elsewhere when evicted.
    #[serde(default)]
    pub pods: Vec<String>,
    /// Every eviction, in order.
    #[serde(default)]
    pub evictions: Vec<String>,
    #[serde(skip)]
    pub faults: Vec<Fault>,
    /// Calls (`call(detail)`) that fail every time: a broken part of the host.
    pub broken: BTreeSet<String>,
    /// Every call, in order, for assertions on what happened.
    pub calls: Vec<String>,
    /// Every event (calls and commits) of every process, in order: where deaths strike.
    pub events: Vec<Event>,
    /// Deaths to come.
    pub crash_plan: Vec<PlannedCrash>,
    /// The current process died at this crash: until a new one starts, nothing it still does
    /// reaches the host or the store (it is gone; its code may run on inert).
    pub dead: Option<PlannedCrash>,
    /// Tables changed by the store's open transaction, and the journal entry it inserts.
    #[serde(skip)]
    pub(super) tx: (Vec<String>, Option<i64>),
    /// The step under way: the journal entry of the last intent committed.
    #[serde(skip)]
    pub(super) step: Option<i64>,
    /// Calls that take this long (to act while an effect runs).
    #[serde(skip)]
    pub slow: BTreeMap<&'static str, std::time::Duration>,
}

impl World {
    pub(super) fn build_of(&self, build: &AgentBuild) -> Option<Build> {
        match build {
            AgentBuild::Slot { slot } => self.slots.get(slot).cloned(),
            AgentBuild::Image { digest } => self.images.get(digest.as_str()).cloned(),
        }
    }

    pub(super) fn machine(&mut self, side: Side) -> &mut SimMachine {
        self.machines.entry(side).or_default()
    }

    /// The nspawn machine whose unit `unit` is, if it is one.
    pub(super) fn machine_side(unit: &str) -> Option<Side> {
        [Side::Kube1, Side::Kube2]
            .into_iter()
            .find(|side| unit == machine_unit(*side))
    }

    /// Starting an active unit is a no-op, as in systemd (the active time stays).
    pub(super) fn start_unit(&mut self, unit: &str) -> EffectResult {
        let now = self.now;
        if let Some(side) = Self::machine_side(unit) {
            let m = self.machine(side);
            if m.running {
                return Ok(());
            }
            if m.kubernetes_version.is_none() {
                return Err(EffectError::Failed(format!(
                    "start {unit}: machine {} has no rootfs",
                    side.name()
                )));
            }
            if m.broken {
                return Err(EffectError::Failed(format!(
                    "start {unit}: machine {}: kubelet did not become ready",
                    side.name()
                )));
            }
            m.running = true;
            m.started_at = Some(now);
            return Ok(());
        }
        if self.units.get(unit).is_some_and(|u| u.masked && !u.active) {
            return Err(EffectError::Failed(format!(
                "start {unit}: Unit {unit} is masked."
            )));
        }
        let Some(u) = self.units.get_mut(unit).filter(|u| u.file || u.active) else {
            return Err(EffectError::Failed(format!(
                "start {unit}: Unit {unit} not found."
            )));
        };
        if u.active {
            return Ok(());
        }
        if u.fails {
            u.failed = true;
            return Err(EffectError::Failed(format!(
                "start {unit}: job failed, unit failed (failed), result exit-code"
            )));
        }
        u.failed = false;
        u.active = true;
        u.active_since = Some(now);
        Ok(())
    }

    /// Stopping a unit that is not active (or not known at all) is fine. An inactive unit
    /// without a file is forgotten.
    pub(super) fn stop_unit(&mut self, unit: &str) {
        if let Some(side) = Self::machine_side(unit) {
            let m = self.machine(side);
            m.running = false;
            m.started_at = None;
        }
        if let Some(u) = self.units.get_mut(unit) {
            u.active = false;
            u.active_since = None;
        }
        self.collect(unit);
    }

    /// A unit with no file, no mask and no process is forgotten.
    pub(super) fn collect(&mut self, unit: &str) {
        if self
            .units
            .get(unit)
            .is_some_and(|u| !u.file && !u.active && !u.masked)
        {
            self.units.remove(unit);
        }
    }

    /// Restart: a stop, then a start (an inactive unit is started). An unknown unit fails.
    pub(super) fn restart_unit(&mut self, unit: &str) -> EffectResult {
        if Self::machine_side(unit).is_none()
            && !self.units.get(unit).is_some_and(|u| u.file || u.active)
        {
            return Err(EffectError::Failed(format!(
                "restart {unit}: Unit {unit} not found."
            )));
        }
        self.stop_unit(unit);
        self.start_unit(unit).map_err(|e| match e {
            EffectError::Failed(m) => EffectError::Failed(m.replacen("start ", "restart ", 1)),
            EffectError::Crashed => EffectError::Crashed,
        })
    }

    /// Fires the restart timers whose time has come: each restarts its unit (after resetting
    /// its failed state), at the time it was due.
    pub(super) fn fire_due_timers(&mut self) {
        let now = self.now;
        let mut due: Vec<(Timestamp, String)> = self
            .restart_timers
            .iter_mut()
            .filter(|t| !t.fired && t.due <= now)
            .map(|t| {
                t.fired = true;
                (t.due, t.unit.clone())
            })
            .collect();
        if due.is_empty() {
            return;
        }
        due.sort();
        for (at, unit) in due {
            self.now = at;
            if let Some(u) = self.units.get_mut(&unit) {
                u.failed = false;
            }
            // A failed restart leaves the unit failed; nobody waits for the timer's job.
            let _ = self.restart_unit(&unit);
        }
        self.now = now;
    }

    pub(super) fn api(&self) -> EffectResult {
        if self.api_down {
            Err(EffectError::Failed(
                "API server unreachable: connection refused".into(),
            ))
        } else {
            Ok(())
        }
    }
}
