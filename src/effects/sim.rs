//! A simulated host: units, images, nspawn machines, agent slots and the API server, in
//! memory. It is a model of the host, not a call recorder, so the real core, store and
//! executor run end to end against it, with scripted failures and crashes.

use super::{
    Containerd, EffectError, EffectResult, Host, MachineStatus, Publisher, Systemd,
    check_unit_name, machine_unit,
};
use crate::machine::Timestamp;
use crate::machine::effect::{MachinePhase, OpResult};
use crate::machine::state::{AgentBuild, InstallMode, OpRef, Side, Slot};
use crate::machine::validate::{ArchiveUrl, Sha256Hex};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// A build the artifact server or registry offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    pub version: String,
    /// The daemon of this build crashes at start (the `version` check still passes).
    pub crashes: bool,
}

/// A unit as systemd knows it: its file (if installed) and its runtime state. As in systemd, a
/// unit whose file is removed keeps running until stopped; an inactive unit without a file is
/// forgotten (garbage-collected).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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
}

/// A transient timer made by `schedule_restart`. The simulated systemd fires it once its time
/// has come (restarting the unit at `due`); a harness playing systemd's part for the agent
/// process takes it from [`World::restart_timers`] instead, and a taken timer never fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestartTimer {
    pub unit: String,
    pub delay_ms: u64,
    pub due: Timestamp,
    /// The simulated systemd already restarted the unit.
    pub fired: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimMachine {
    pub kubernetes_version: Option<String>,
    /// Its unit (an instance of systemd's own template) is enabled.
    pub enabled: bool,
    pub running: bool,
    /// When it started; `None` while stopped (systemd has no active time for an inactive unit).
    pub started_at: Option<Timestamp>,
    /// Starting this machine fails (its kubelet never gets ready).
    pub broken: bool,
}

/// A unit in a [`HostSnapshot`]: its file and state, without times.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitSnapshot {
    pub contents: String,
    pub file: bool,
    pub enabled: bool,
    pub active: bool,
    pub failed: bool,
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
    pub pending_restart_timers: usize,
    pub agent_restarts: u32,
    /// The first published result of each operation UID: reason and message.
    pub results: BTreeMap<String, (crate::machine::effect::ResultReason, String)>,
    /// The last Machine status written.
    pub machine_status: Option<(MachinePhase, String, Option<i64>)>,
}

/// A status write seen by the simulated API server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiWrite {
    Progress {
        op: OpRef,
        message: String,
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

#[derive(Debug, Default)]
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
    /// What the artifact server serves: URL → (sha256, build).
    pub artifacts: BTreeMap<String, (String, Build)>,
    /// What the registry serves: digest → build.
    pub registry: BTreeMap<String, Build>,
    /// Scheduled restarts, until a harness takes them (fired or not).
    pub restart_timers: Vec<RestartTimer>,
    /// `restart` calls on the agent unit.
    pub agent_restarts: u32,
    pub api: Vec<ApiWrite>,
    pub api_down: bool,
    pub faults: Vec<Fault>,
    /// Every call, in order, for assertions on what happened.
    pub calls: Vec<String>,
    /// Calls that take this long (to act while an effect runs).
    pub slow: BTreeMap<&'static str, std::time::Duration>,
}

type TimeSource = Arc<dyn Fn() -> Timestamp + Send + Sync>;

#[derive(Clone, Default)]
pub struct SimHost {
    world: Arc<Mutex<World>>,
    time: Option<TimeSource>,
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

    pub fn serve_artifact(&self, url: &str, sha256: &str, build: Build) {
        self.world()
            .artifacts
            .insert(url.to_string(), (sha256.to_string(), build));
    }

    pub fn serve_image(&self, digest: &str, build: Build) {
        self.world().registry.insert(digest.to_string(), build);
    }

    pub fn inject(&self, call: &'static str, kind: FaultKind, nth: u32) {
        self.world().faults.push(Fault { call, kind, nth });
    }

    /// The agent's process exited (after a reset, or it died): its unit is inactive.
    pub fn agent_exited(&self) {
        self.world().stop_unit(super::AGENT_UNIT);
    }

    /// systemd (re)started the agent unit (a new agent process).
    pub fn agent_started(&self) {
        let mut w = self.world();
        let now = w.now;
        if let Some(u) = w.units.get_mut(super::AGENT_UNIT) {
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
            pending_restart_timers: w.restart_timers.iter().filter(|t| !t.fired).count(),
            agent_restarts: w.agent_restarts,
            results,
            machine_status,
        }
    }

    /// Records the call and applies a scripted fault, if one is due.
    fn enter(&self, call: &'static str, detail: &str) -> Result<Option<FaultKind>, EffectError> {
        let mut w = self.world();
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
        // A call the process died before making never reached the host.
        if fired != Some(FaultKind::CrashBefore) {
            w.calls.push(format!("{call}({detail})"));
        }
        match fired {
            Some(FaultKind::Fail) => Err(EffectError::Failed(format!("{call} failed (injected)"))),
            Some(FaultKind::CrashBefore) => Err(EffectError::Crashed),
            Some(FaultKind::CrashAfter) => Ok(Some(FaultKind::CrashAfter)),
            None => Ok(None),
        }
    }

    async fn pause(&self, call: &'static str) {
        let delay = self.world().slow.get(call).copied();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
    }

    /// A read: a crash "after" it is a crash all the same.
    fn read(&self, call: &'static str, detail: &str) -> EffectResult {
        match self.enter(call, detail)? {
            Some(FaultKind::CrashAfter) => Err(EffectError::Crashed),
            Some(FaultKind::Fail | FaultKind::CrashBefore) | None => Ok(()),
        }
    }

    fn run(
        &self,
        call: &'static str,
        detail: &str,
        f: impl FnOnce(&mut World) -> EffectResult,
    ) -> EffectResult {
        let fault = self.enter(call, detail)?;
        f(&mut self.world())?;
        match fault {
            Some(FaultKind::CrashAfter) => Err(EffectError::Crashed),
            Some(FaultKind::Fail | FaultKind::CrashBefore) | None => Ok(()),
        }
    }
}

impl World {
    fn build_of(&self, build: &AgentBuild) -> Option<Build> {
        match build {
            AgentBuild::Slot { slot } => self.slots.get(slot).cloned(),
            AgentBuild::Image { digest } => self.images.get(digest.as_str()).cloned(),
        }
    }

    fn machine(&mut self, side: Side) -> &mut SimMachine {
        self.machines.entry(side).or_default()
    }

    /// The nspawn machine whose unit `unit` is, if it is one.
    fn machine_side(unit: &str) -> Option<Side> {
        [Side::Kube1, Side::Kube2]
            .into_iter()
            .find(|side| unit == machine_unit(*side))
    }

    /// Starting an active unit is a no-op, as in systemd (the active time stays).
    fn start_unit(&mut self, unit: &str) -> EffectResult {
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
    fn stop_unit(&mut self, unit: &str) {
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

    fn collect(&mut self, unit: &str) {
        if self.units.get(unit).is_some_and(|u| !u.file && !u.active) {
            self.units.remove(unit);
        }
    }

    /// Restart: a stop, then a start (an inactive unit is started). An unknown unit fails.
    fn restart_unit(&mut self, unit: &str) -> EffectResult {
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
    fn fire_due_timers(&mut self) {
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

    fn api(&self) -> EffectResult {
        if self.api_down {
            Err(EffectError::Failed(
                "API server unreachable: connection refused".into(),
            ))
        } else {
            Ok(())
        }
    }
}

impl Systemd for SimHost {
    async fn write_unit(&self, name: &str, contents: &str) -> EffectResult {
        self.run("write_unit", name, |w| {
            check_unit_name(name)?;
            let u = w.units.entry(name.to_string()).or_default();
            u.contents = contents.to_string();
            u.file = true;
            Ok(())
        })
    }

    /// The file goes; a running unit keeps running until stopped.
    async fn remove_unit(&self, name: &str) -> EffectResult {
        self.run("remove_unit", name, |w| {
            check_unit_name(name)?;
            if let Some(u) = w.units.get_mut(name) {
                u.file = false;
                u.enabled = false;
                u.contents.clear();
            }
            w.collect(name);
            Ok(())
        })
    }

    async fn unit_file_present(&self, name: &str) -> EffectResult<bool> {
        self.read("unit_file_present", name)?;
        check_unit_name(name)?;
        Ok(self.world().units.get(name).is_some_and(|u| u.file))
    }

    async fn is_enabled(&self, unit: &str) -> EffectResult<bool> {
        self.read("is_enabled", unit)?;
        check_unit_name(unit)?;
        let mut w = self.world();
        if let Some(side) = World::machine_side(unit) {
            return Ok(w.machine(side).enabled);
        }
        Ok(w.units.get(unit).is_some_and(|u| u.enabled))
    }

    async fn daemon_reload(&self) -> EffectResult {
        self.run("daemon_reload", "", |w| {
            w.reloads += 1;
            Ok(())
        })
    }

    async fn enable(&self, unit: &str) -> EffectResult {
        self.run("enable", unit, |w| {
            check_unit_name(unit)?;
            // A machine unit is an instance of systemd's own template: its file always exists.
            if let Some(side) = World::machine_side(unit) {
                w.machine(side).enabled = true;
                w.reloads += 1;
                return Ok(());
            }
            match w.units.get_mut(unit).filter(|u| u.file) {
                Some(u) => u.enabled = true,
                None => {
                    return Err(EffectError::Failed(format!(
                        "enable {unit}: Unit file {unit} does not exist."
                    )));
                }
            }
            // As systemctl does after changing symlinks.
            w.reloads += 1;
            Ok(())
        })
    }

    async fn disable(&self, unit: &str) -> EffectResult {
        self.run("disable", unit, |w| {
            check_unit_name(unit)?;
            if let Some(side) = World::machine_side(unit) {
                w.machine(side).enabled = false;
            }
            if let Some(u) = w.units.get_mut(unit) {
                u.enabled = false;
            }
            w.reloads += 1;
            Ok(())
        })
    }

    async fn start(&self, unit: &str) -> EffectResult {
        self.run("start", unit, |w| {
            check_unit_name(unit)?;
            w.start_unit(unit)
        })
    }

    async fn stop(&self, unit: &str) -> EffectResult {
        self.run("stop", unit, |w| {
            check_unit_name(unit)?;
            w.stop_unit(unit);
            Ok(())
        })
    }

    async fn restart(&self, unit: &str) -> EffectResult {
        self.pause("restart").await;
        self.run("restart", unit, |w| {
            check_unit_name(unit)?;
            if unit == super::AGENT_UNIT {
                w.agent_restarts += 1;
            }
            w.restart_unit(unit)
        })
    }

    // The simulated manager has no jobs to wait for.
    async fn start_no_wait(&self, unit: &str) -> EffectResult {
        self.start(unit).await
    }

    async fn restart_no_wait(&self, unit: &str) -> EffectResult {
        self.restart(unit).await
    }

    async fn reset_failed(&self, unit: &str) -> EffectResult {
        self.run("reset_failed", unit, |w| {
            check_unit_name(unit)?;
            if let Some(u) = w.units.get_mut(unit) {
                u.failed = false;
            }
            Ok(())
        })
    }

    async fn schedule_restart(&self, unit: &str, delay_ms: u64) -> EffectResult {
        self.run("schedule_restart", unit, |w| {
            check_unit_name(unit)?;
            let due = Timestamp::from_millis(
                w.now
                    .millis()
                    .saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
            );
            w.restart_timers.push(RestartTimer {
                unit: unit.to_string(),
                delay_ms,
                due,
                fired: false,
            });
            Ok(())
        })
    }

    async fn active_since(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        self.read("active_since", unit)?;
        check_unit_name(unit)?;
        let mut w = self.world();
        if let Some(side) = World::machine_side(unit) {
            let m = w.machine(side);
            return Ok(m.started_at.filter(|_| m.running));
        }
        Ok(w.units.get(unit).and_then(|u| u.active_since))
    }

    /// Simulated units start at once: their run begins when they become active.
    async fn started_since(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        self.read("started_since", unit)?;
        check_unit_name(unit)?;
        let mut w = self.world();
        if let Some(side) = World::machine_side(unit) {
            let m = w.machine(side);
            return Ok(m.started_at.filter(|_| m.running));
        }
        Ok(w.units.get(unit).and_then(|u| u.active_since))
    }

    async fn machine_status(&self, side: Side) -> EffectResult<MachineStatus> {
        self.read("machine_status", side.name())?;
        let mut w = self.world();
        let m = w.machine(side);
        Ok(MachineStatus {
            running: m.running,
            started_at: m.started_at.filter(|_| m.running),
        })
    }
}

impl Containerd for SimHost {
    async fn pull(&self, reference: &str, digest: &Sha256Hex) -> EffectResult {
        self.run("pull", reference, |w| {
            // As the real pull: the reference must be pinned to the digest asked for.
            let (name, pinned) = reference.rsplit_once('@').ok_or_else(|| {
                EffectError::Failed(
                    "image reference: not pinned by digest (registry/repository@sha256:…)".into(),
                )
            })?;
            if pinned != digest.oci() {
                return Err(EffectError::Failed(format!(
                    "image reference is pinned to {pinned}, but {} was requested",
                    digest.oci()
                )));
            }
            let build = w.registry.get(digest.as_str()).cloned().ok_or_else(|| {
                EffectError::Failed(format!("manifest {} not found in {name}", digest.oci()))
            })?;
            w.images.insert(digest.as_str().to_string(), build);
            Ok(())
        })
    }

    async fn image_present(&self, digest: &Sha256Hex) -> EffectResult<bool> {
        self.read("image_present", digest.short())?;
        let w = self.world();
        Ok(w.images.contains_key(digest.as_str()) && !w.foreign_images.contains(digest.as_str()))
    }

    async fn remove_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        self.run("remove_agent_image", digest.short(), |w| {
            // As the real one: someone else's image is refused, never removed.
            if w.foreign_images.contains(digest.as_str()) {
                return Err(EffectError::Failed(format!(
                    "image {digest} was not pulled by flexnode; not removing it"
                )));
            }
            w.images.remove(digest.as_str());
            Ok(())
        })
    }
}

impl Host for SimHost {
    async fn install_agent(&self, mode: InstallMode, build: &AgentBuild) -> EffectResult {
        self.run("install_agent", mode.as_str(), |w| {
            let installed = Build {
                version: crate::VERSION.to_string(),
                crashes: false,
            };
            match build {
                AgentBuild::Slot { slot } => {
                    w.slots.entry(*slot).or_insert(installed);
                }
                AgentBuild::Image { digest } => {
                    w.images
                        .entry(digest.as_str().to_string())
                        .or_insert(installed);
                }
            }
            w.current = Some(build.clone());
            w.runtime_files = true;
            Ok(())
        })
    }

    async fn stage_archive(
        &self,
        url: &ArchiveUrl,
        sha256: &Sha256Hex,
        build: &AgentBuild,
    ) -> EffectResult {
        self.run("stage_archive", &url.redacted(), |w| {
            let AgentBuild::Slot { slot } = build else {
                return Err(EffectError::Failed(
                    "an archive installs into a slot".into(),
                ));
            };
            let (served_sha, served) = w
                .artifacts
                .get(url.expose())
                .cloned()
                .ok_or_else(|| EffectError::Failed(format!("download of {url} failed: 404")))?;
            if served_sha != sha256.as_str() {
                return Err(EffectError::Failed(
                    "downloaded archive does not match sha256".into(),
                ));
            }
            w.slots.insert(*slot, served);
            Ok(())
        })
    }

    async fn check_candidate(&self, build: &AgentBuild) -> EffectResult<String> {
        self.read("check_candidate", &build.to_string())?;
        let w = self.world();
        w.build_of(build)
            .map(|b| format!("flexnode {}", b.version))
            .ok_or_else(|| EffectError::Failed(format!("candidate {build} is not installed")))
    }

    async fn discard_candidate(&self, build: &AgentBuild) -> EffectResult {
        self.run("discard_candidate", &build.to_string(), |w| {
            if w.current.as_ref() != Some(build) {
                match build {
                    AgentBuild::Slot { slot } => {
                        w.slots.remove(slot);
                    }
                    AgentBuild::Image { .. } => {}
                }
            }
            Ok(())
        })
    }

    async fn selected_agent(&self, _mode: InstallMode) -> EffectResult<Option<AgentBuild>> {
        self.read("selected_agent", "")?;
        Ok(self.world().current.clone())
    }

    async fn select_agent(
        &self,
        _mode: InstallMode,
        to: &AgentBuild,
        last_good: &AgentBuild,
    ) -> EffectResult {
        self.run("select_agent", &to.to_string(), |w| {
            if w.build_of(to).is_none() {
                return Err(EffectError::Failed(format!("{to} is not installed")));
            }
            w.last_good = Some(last_good.clone());
            w.current = Some(to.clone());
            Ok(())
        })
    }

    async fn remove_agent_links(&self) -> EffectResult {
        self.run("remove_agent_links", "", |w| {
            w.current = None;
            w.last_good = None;
            Ok(())
        })
    }

    async fn agent_links_present(&self) -> EffectResult<bool> {
        self.read("agent_links_present", "")?;
        let w = self.world();
        Ok(w.current.is_some() || w.last_good.is_some())
    }

    async fn machine_rootfs(&self, side: Side) -> EffectResult<Option<String>> {
        self.read("machine_rootfs", side.name())?;
        Ok(self.world().machine(side).kubernetes_version.clone())
    }

    async fn provision_machine(&self, side: Side, kubernetes_version: &str) -> EffectResult {
        self.run("provision_machine", side.name(), |w| {
            w.machine(side).kubernetes_version = Some(kubernetes_version.to_string());
            Ok(())
        })
    }

    async fn remove_machine(&self, side: Side) -> EffectResult {
        self.run("remove_machine", side.name(), |w| {
            let m = w.machine(side);
            m.kubernetes_version = None;
            m.running = false;
            m.started_at = None;
            Ok(())
        })
    }

    async fn runtime_present(&self) -> EffectResult<bool> {
        self.read("runtime_present", "")?;
        Ok(self.world().runtime_files)
    }

    async fn wipe_runtime(&self) -> EffectResult {
        self.run("wipe_runtime", "", |w| {
            w.runtime_files = false;
            Ok(())
        })
    }
}

impl Publisher for SimHost {
    async fn report_progress(&self, op: &OpRef, message: &str) -> EffectResult {
        self.run("report_progress", &op.name, |w| {
            w.api()?;
            w.api.push(ApiWrite::Progress {
                op: op.clone(),
                message: message.to_string(),
            });
            Ok(())
        })
    }

    async fn publish_result(&self, op: &OpRef, result: &OpResult, at: Timestamp) -> EffectResult {
        self.run("publish_result", &op.name, |w| {
            w.api()?;
            w.api.push(ApiWrite::Result {
                op: op.clone(),
                result: result.clone(),
                completed_at: at,
            });
            Ok(())
        })
    }

    async fn report_machine(
        &self,
        phase: MachinePhase,
        message: &str,
        observed_generation: Option<i64>,
    ) -> EffectResult {
        self.run("report_machine", phase.as_str(), |w| {
            w.api()?;
            w.api.push(ApiWrite::Machine {
                phase,
                message: message.to_string(),
                observed_generation,
            });
            Ok(())
        })
    }
}
