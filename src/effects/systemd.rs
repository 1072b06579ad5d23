//! systemd over D-Bus: the production [`Systemd`] implementation.
//!
//! Every operation is a method call on `org.freedesktop.systemd1` (zbus_systemd proxies); no
//! `systemctl` or `machinectl` process is spawned. Only Manager methods and Unit properties that
//! systemd 252 (Debian 12) already has are used, although the proxies are generated from a
//! newer systemd.
//!
//! Beyond the manager: login1 (`reboot`) and machine1 (`list_machines`, `machine`,
//! `terminate_machine`) on the same connection, as inherent methods; `machine_status` prefers
//! machined's view of the side's machine and falls back to the `systemd-nspawn@` unit when
//! machined does not know it (or is not installed).
//!
//! Jobs (start, stop, restart, the restart timer) are awaited: the `JobRemoved` match is
//! registered *before* the method call that queues the job, so a job that finishes at once is
//! not missed, and a result other than `done` is an [`EffectError::Failed`] naming the unit.

use super::atomic_file::{sync_dir, write_file_atomic};
use super::{EffectError, EffectResult, MachineStatus, Systemd, check_unit_name, machine_unit};
use crate::machine::Timestamp;
use crate::machine::state::Side;
use futures::StreamExt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath, OwnedVariant, Variant};
use zbus_systemd::login1::ManagerProxy as LoginManagerProxy;
use zbus_systemd::machine1::{MachineProxy, ManagerProxy as MachineManagerProxy};
use zbus_systemd::systemd1::{ManagerProxy, ServiceProxy, UnitProxy};

/// Where the agent's unit files live on a normal system.
pub const DEFAULT_UNIT_DIR: &str = "/etc/systemd/system";
/// How long a start/stop/restart job may take before the call gives up.
pub const DEFAULT_JOB_TIMEOUT: Duration = Duration::from_secs(90);
/// The tool the transient restart service runs: systemd's own D-Bus client.
pub const BUSCTL: &str = "/usr/bin/busctl";
/// Prefix of the transient timer/service pair made by `schedule_restart`.
pub const RESTART_UNIT_PREFIX: &str = "flexnode-agent-restart-";

const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";
/// `GetUnitFileState` of a unit without a file.
const FILE_NOT_FOUND: &str = "org.freedesktop.DBus.Error.FileNotFound";
const NO_SUCH_MACHINE: &str = "org.freedesktop.machine1.NoSuchMachine";
/// machined is not installed (no bus name, no activation file).
const SERVICE_UNKNOWN: &str = "org.freedesktop.DBus.Error.ServiceUnknown";
/// The machine's object went away between two calls.
const UNKNOWN_OBJECT: &str = "org.freedesktop.DBus.Error.UnknownObject";
/// How often `terminate_machine` looks whether machined has let the machine go.
const MACHINE_POLL: Duration = Duration::from_millis(20);
/// Timer accuracy for scheduled restarts (systemd's default is one minute).
const RESTART_ACCURACY_USEC: u64 = 100_000;

/// The production [`Systemd`]: the system manager reached over a D-Bus connection.
#[derive(Clone, Debug)]
pub struct DbusSystemd {
    manager: ManagerProxy<'static>,
    unit_dir: PathBuf,
    job_timeout: Duration,
    busctl: String,
}

/// The outcome of a job, as `JobRemoved` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutcome {
    pub job: OwnedObjectPath,
    /// `done`, `canceled`, `timeout`, `failed`, `dependency`, `skipped`, ...
    pub result: String,
}

/// A unit's state as the manager reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitState {
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    /// `ActiveEnterTimestamp`, µs since the epoch (0: never active).
    pub active_enter_usec: u64,
    /// `InactiveExitTimestamp`, µs since the epoch: when the current run began to start.
    pub inactive_exit_usec: u64,
}

/// A machine as `ListMachines` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineEntry {
    pub name: String,
    /// `container`, `vm` or `host` (the `.host` entry machined always lists).
    pub class: String,
    /// Who registered it (`systemd-nspawn`, …).
    pub service: String,
    pub path: OwnedObjectPath,
}

/// One machine's state, from its `org.freedesktop.machine1.Machine` properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineInfo {
    pub name: String,
    pub class: String,
    pub service: String,
    /// The unit (or scope) that holds the machine, e.g. `systemd-nspawn@kube1.service`.
    pub unit: String,
    /// The machine's PID 1, as seen from the manager's PID namespace.
    pub leader: u32,
    /// `opening`, `running` or `closing`.
    pub state: String,
    /// When machined registered it (wall clock); `None` if machined reports 0.
    pub registered_at: Option<Timestamp>,
}

impl DbusSystemd {
    /// The manager on `conn` (the system bus, or a container's bus reached by address). Subscribes
    /// to the manager's signals, so job completions are delivered.
    pub async fn new(conn: Connection) -> EffectResult<Self> {
        let manager = ManagerProxy::builder(&conn)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed("connect to systemd", e))?;
        if let Err(e) = manager.subscribe().await {
            // Subscribing twice on one connection is refused; anything else is real.
            if !is_error(&e, "org.freedesktop.systemd1.AlreadySubscribed") {
                return Err(bus_failed("subscribe to systemd signals", e));
            }
        }
        Ok(Self {
            manager,
            unit_dir: PathBuf::from(DEFAULT_UNIT_DIR),
            job_timeout: DEFAULT_JOB_TIMEOUT,
            busctl: BUSCTL.to_string(),
        })
    }

    /// The host's system manager on the system bus.
    pub async fn system() -> EffectResult<Self> {
        let conn = Connection::system()
            .await
            .map_err(|e| bus_failed("connect to the system bus", e))?;
        Self::new(conn).await
    }

    /// The manager on the bus at `address` (e.g. `unix:path=/run/dbus/system_bus_socket`).
    pub async fn at_address(address: &str) -> EffectResult<Self> {
        let conn = zbus::connection::Builder::address(address)
            .build()
            .await
            .map_err(|e| bus_failed(&format!("connect to {address}"), e))?;
        Self::new(conn).await
    }

    /// Unit files are written to and removed from `dir` (default [`DEFAULT_UNIT_DIR`]). It must be
    /// a directory the manager reads units from, seen from this process.
    pub fn with_unit_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.unit_dir = dir.into();
        self
    }

    /// How long to wait for a job (default [`DEFAULT_JOB_TIMEOUT`]).
    pub fn with_job_timeout(mut self, timeout: Duration) -> Self {
        self.job_timeout = timeout;
        self
    }

    /// The `busctl` path the scheduled-restart service runs, as seen by the manager.
    pub fn with_busctl(mut self, path: impl Into<String>) -> Self {
        self.busctl = path.into();
        self
    }

    pub fn unit_dir(&self) -> &Path {
        &self.unit_dir
    }

    pub fn manager(&self) -> &ManagerProxy<'static> {
        &self.manager
    }

    /// A unit's state, or `None` when the manager has not loaded it (never referenced, or
    /// garbage-collected).
    pub async fn unit_state(&self, unit: &str) -> EffectResult<Option<UnitState>> {
        let Some(proxy) = self.unit_proxy(unit).await? else {
            return Ok(None);
        };
        let what = format!("read state of {unit}");
        let state = UnitState {
            load_state: proxy.load_state().await.map_err(|e| bus_failed(&what, e))?,
            active_state: proxy
                .active_state()
                .await
                .map_err(|e| bus_failed(&what, e))?,
            sub_state: proxy.sub_state().await.map_err(|e| bus_failed(&what, e))?,
            active_enter_usec: proxy
                .active_enter_timestamp()
                .await
                .map_err(|e| bus_failed(&what, e))?,
            inactive_exit_usec: proxy
                .inactive_exit_timestamp()
                .await
                .map_err(|e| bus_failed(&what, e))?,
        };
        Ok(Some(state))
    }

    /// Units currently loaded whose name starts with `prefix` (e.g. the restart timers).
    pub async fn loaded_units_with_prefix(&self, prefix: &str) -> EffectResult<Vec<String>> {
        let units = self
            .manager
            .list_units()
            .await
            .map_err(|e| bus_failed("list units", e))?;
        Ok(units
            .into_iter()
            .map(|u| u.0)
            .filter(|n| n.starts_with(prefix))
            .collect())
    }

    /// The transient timer + service names `schedule_restart` used, returned so callers (and
    /// tests) can watch them. Like [`Systemd::schedule_restart`].
    pub async fn schedule_restart_named(
        &self,
        unit: &str,
        delay_ms: u64,
    ) -> EffectResult<(String, String)> {
        check_unit_name(unit)?;
        let n = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or_default();
        let timer = format!("{RESTART_UNIT_PREFIX}{n}.timer");
        let service = format!("{RESTART_UNIT_PREFIX}{n}.service");
        let what = format!("schedule restart of {unit}");
        let v = |r: zbus::Result<OwnedVariant>| r.map_err(|e| bus_failed(&what, e));

        let call = |method: &str, args: Vec<String>| {
            let mut argv = vec![
                "busctl".to_string(),
                "call".to_string(),
                "org.freedesktop.systemd1".to_string(),
                "/org/freedesktop/systemd1".to_string(),
                "org.freedesktop.systemd1.Manager".to_string(),
                method.to_string(),
            ];
            argv.extend(args);
            argv
        };
        // A failed unit may not start again until reset; the reset itself may fail (unit not
        // loaded, nothing to reset) without stopping the restart.
        let exec: Vec<(String, Vec<String>, bool)> = vec![
            (
                self.busctl.clone(),
                call("ResetFailedUnit", vec!["s".into(), unit.into()]),
                true,
            ),
            (
                self.busctl.clone(),
                call(
                    "RestartUnit",
                    vec!["ss".into(), unit.into(), "replace".into()],
                ),
                false,
            ),
        ];
        let service_props = vec![
            (
                "Description".to_string(),
                v(owned(format!("flexnode: restart {unit}")))?,
            ),
            ("Type".to_string(), v(owned("oneshot"))?),
            ("ExecStart".to_string(), v(owned(exec))?),
            ("CollectMode".to_string(), v(owned("inactive-or-failed"))?),
        ];
        let timer_props = vec![
            (
                "Description".to_string(),
                v(owned(format!("flexnode: restart {unit} in {delay_ms} ms")))?,
            ),
            (
                "TimersMonotonic".to_string(),
                v(owned(vec![(
                    "OnActiveSec".to_string(),
                    delay_ms.saturating_mul(1000),
                )]))?,
            ),
            (
                "AccuracyUSec".to_string(),
                OwnedVariant::from(RESTART_ACCURACY_USEC),
            ),
            ("RemainAfterElapse".to_string(), OwnedVariant::from(false)),
            ("CollectMode".to_string(), v(owned("inactive-or-failed"))?),
        ];
        self.run_job(
            "start",
            &timer,
            self.manager.start_transient_unit(
                timer.clone(),
                "fail".to_string(),
                timer_props,
                vec![(service.clone(), service_props)],
            ),
        )
        .await?;
        Ok((timer, service))
    }

    /// Reboots the system the bus belongs to: `org.freedesktop.login1.Manager.Reboot(false)`
    /// (not interactive: no polkit prompt; root is always allowed). Returns once logind has
    /// accepted the request; the shutdown itself follows and this connection then drops.
    pub async fn reboot(&self) -> EffectResult {
        let login = LoginManagerProxy::builder(self.manager.inner().connection())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed("reboot: connect to logind", e))?;
        login
            .reboot(false)
            .await
            .map_err(|e| bus_failed("reboot (login1 Reboot)", e))
    }

    async fn machined_proxy(&self, what: &str) -> EffectResult<MachineManagerProxy<'static>> {
        MachineManagerProxy::builder(self.manager.inner().connection())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed(&format!("{what}: connect to machined"), e))
    }

    /// Every machine machined knows, `.host` included.
    pub async fn list_machines(&self) -> EffectResult<Vec<MachineEntry>> {
        let machined = self.machined_proxy("list machines").await?;
        let list = machined
            .list_machines()
            .await
            .map_err(|e| bus_failed("list machines", e))?;
        Ok(list
            .into_iter()
            .map(|(name, class, service, path)| MachineEntry {
                name,
                class,
                service,
                path,
            })
            .collect())
    }

    /// A machine's state, or `None` when machined does not know it (or machined is not
    /// installed on that system).
    pub async fn machine(&self, name: &str) -> EffectResult<Option<MachineInfo>> {
        check_machine_name(name)?;
        let what = format!("machine {name}");
        let machined = self.machined_proxy(&what).await?;
        let path = match machined.get_machine(name.to_string()).await {
            Ok(p) => p,
            Err(e) if is_error(&e, NO_SUCH_MACHINE) || is_error(&e, SERVICE_UNKNOWN) => {
                return Ok(None);
            }
            Err(e) => return Err(bus_failed(&what, e)),
        };
        let m = MachineProxy::builder(self.manager.inner().connection())
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map_err(|e| bus_failed(&what, e))?;
        let read = async {
            let usec = m.timestamp().await?;
            zbus::Result::Ok(MachineInfo {
                name: m.name().await?,
                class: m.class().await?,
                service: m.service().await?,
                unit: m.unit().await?,
                leader: m.leader().await?,
                state: m.state().await?,
                registered_at: (usec > 0).then(|| usec_to_timestamp(usec)),
            })
        };
        match read.await {
            Ok(info) => Ok(Some(info)),
            // Gone between GetMachine and the property reads.
            Err(e) if is_error(&e, UNKNOWN_OBJECT) || is_error(&e, NO_SUCH_MACHINE) => Ok(None),
            Err(e) => Err(bus_failed(&what, e)),
        }
    }

    /// Terminates a machine (`TerminateMachine`: machined stops its unit, or kills its scope)
    /// and waits, up to the job timeout, until machined no longer lists it. Unknown: nothing
    /// to do.
    pub async fn terminate_machine(&self, name: &str) -> EffectResult {
        check_machine_name(name)?;
        let what = format!("terminate machine {name}");
        let machined = self.machined_proxy(&what).await?;
        match machined.terminate_machine(name.to_string()).await {
            Ok(()) => {}
            Err(e) if is_error(&e, NO_SUCH_MACHINE) || is_error(&e, SERVICE_UNKNOWN) => {
                return Ok(());
            }
            Err(e) => return Err(bus_failed(&what, e)),
        }
        let gone = async {
            loop {
                if self.machine(name).await?.is_none() {
                    return Ok::<_, EffectError>(());
                }
                tokio::time::sleep(MACHINE_POLL).await;
            }
        };
        tokio::time::timeout(self.job_timeout, gone)
            .await
            .map_err(|_| {
                EffectError::Failed(format!(
                    "{what}: still registered after {} s",
                    self.job_timeout.as_secs()
                ))
            })?
    }

    /// Registers for `JobRemoved`, then makes the call that queues the job, then waits for that
    /// job's removal. `call` is lazy: it runs only after the match is in place.
    pub async fn run_job(
        &self,
        verb: &str,
        unit: &str,
        call: impl Future<Output = zbus::Result<OwnedObjectPath>>,
    ) -> EffectResult<JobOutcome> {
        self.try_job(verb, unit, call).await.map_err(|e| match e {
            JobError::Call(e) => bus_failed(&format!("{verb} {unit}"), e),
            JobError::Effect(e) => e,
        })
    }

    async fn try_job(
        &self,
        verb: &str,
        unit: &str,
        call: impl Future<Output = zbus::Result<OwnedObjectPath>>,
    ) -> Result<JobOutcome, JobError> {
        let mut removed = self
            .manager
            .receive_job_removed()
            .await
            .map_err(|e| bus_failed(&format!("{verb} {unit}: watch jobs"), e))?;
        let job = call.await.map_err(JobError::Call)?;
        let wait = async {
            while let Some(signal) = removed.next().await {
                let args = signal
                    .args()
                    .map_err(|e| bus_failed(&format!("{verb} {unit}: JobRemoved"), e))?;
                if *args.job == *job {
                    return Ok(args.result.clone());
                }
            }
            Err(EffectError::Failed(format!(
                "{verb} {unit}: connection to systemd closed while job {} ran",
                job.as_str()
            )))
        };
        let result = tokio::time::timeout(self.job_timeout, wait)
            .await
            .map_err(|_| {
                EffectError::Failed(format!(
                    "{verb} {unit}: job {} did not finish within {} s",
                    job.as_str(),
                    self.job_timeout.as_secs()
                ))
            })??;
        if result == "done" {
            return Ok(JobOutcome { job, result });
        }
        let detail = self.failure_detail(unit).await;
        Err(EffectError::Failed(format!("{verb} {unit}: job {result}{detail}")).into())
    }

    /// ", unit failed (failed), result exit-code" and the like, best effort.
    async fn failure_detail(&self, unit: &str) -> String {
        let Ok(Some(path)) = self.get_unit(unit).await else {
            return String::new();
        };
        let conn = self.manager.inner().connection();
        let mut detail = String::new();
        if let Ok(p) = UnitProxy::builder(conn)
            .path(path.clone())
            .cache_properties(CacheProperties::No)
            .build()
            .await
            && let (Ok(active), Ok(sub)) = (p.active_state().await, p.sub_state().await)
        {
            detail = format!(", unit {active} ({sub})");
        }
        if unit.ends_with(".service")
            && let Ok(s) = ServiceProxy::builder(conn)
                .path(path)
                .cache_properties(CacheProperties::No)
                .build()
                .await
            && let Ok(r) = s.result().await
            && r != "success"
        {
            detail.push_str(&format!(", result {r}"));
        }
        detail
    }

    async fn get_unit(&self, unit: &str) -> EffectResult<Option<OwnedObjectPath>> {
        match self.manager.get_unit(unit.to_string()).await {
            Ok(p) => Ok(Some(p)),
            Err(e) if is_error(&e, NO_SUCH_UNIT) => Ok(None),
            Err(e) => Err(bus_failed(&format!("look up {unit}"), e)),
        }
    }

    async fn unit_proxy(&self, unit: &str) -> EffectResult<Option<UnitProxy<'static>>> {
        check_unit_name(unit)?;
        let Some(path) = self.get_unit(unit).await? else {
            return Ok(None);
        };
        UnitProxy::builder(self.manager.inner().connection())
            .path(path)
            .cache_properties(CacheProperties::No)
            .build()
            .await
            .map(Some)
            .map_err(|e| bus_failed(&format!("look up {unit}"), e))
    }

    /// When `unit` entered its active state, if it is active (or reloading) now.
    async fn active_enter(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        let Some(state) = self.unit_state(unit).await? else {
            return Ok(None);
        };
        Ok(match state.active_state.as_str() {
            "active" | "reloading" if state.active_enter_usec > 0 => {
                Some(usec_to_timestamp(state.active_enter_usec))
            }
            _ => None,
        })
    }
}

impl Systemd for DbusSystemd {
    async fn write_unit(&self, name: &str, contents: &str) -> EffectResult {
        check_unit_name(name)?;
        let dir = self.unit_dir.clone();
        let name = name.to_string();
        let contents = contents.to_string();
        tokio::task::spawn_blocking(move || {
            write_file_atomic(&dir.join(&name), contents.as_bytes(), 0o644)
        })
        .await
        .map_err(|e| EffectError::Failed(format!("write unit: {e}")))?
    }

    async fn remove_unit(&self, name: &str) -> EffectResult {
        check_unit_name(name)?;
        let dir = self.unit_dir.clone();
        let name = name.to_string();
        tokio::task::spawn_blocking(move || {
            let path = dir.join(&name);
            match std::fs::remove_file(&path) {
                Ok(()) => sync_dir(&dir),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(EffectError::Failed(format!(
                    "remove {}: {e}",
                    path.display()
                ))),
            }
        })
        .await
        .map_err(|e| EffectError::Failed(format!("remove unit: {e}")))?
    }

    async fn unit_file_present(&self, name: &str) -> EffectResult<bool> {
        check_unit_name(name)?;
        let path = self.unit_dir.join(name);
        tokio::task::spawn_blocking(move || match std::fs::symlink_metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(EffectError::Failed(format!(
                "inspect {}: {e}",
                path.display()
            ))),
        })
        .await
        .map_err(|e| EffectError::Failed(format!("inspect unit file: {e}")))?
    }

    async fn is_enabled(&self, unit: &str) -> EffectResult<bool> {
        check_unit_name(unit)?;
        match self.manager.get_unit_file_state(unit.to_string()).await {
            Ok(state) => Ok(matches!(state.as_str(), "enabled" | "enabled-runtime")),
            // No unit file: nothing is enabled.
            Err(e) if is_error(&e, NO_SUCH_UNIT) || is_error(&e, FILE_NOT_FOUND) => Ok(false),
            Err(e) => Err(bus_failed(&format!("read the enablement of {unit}"), e)),
        }
    }

    async fn daemon_reload(&self) -> EffectResult {
        // The reply comes once the manager has reloaded.
        self.manager
            .reload()
            .await
            .map_err(|e| bus_failed("daemon-reload", e))
    }

    async fn enable(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        let (has_install, changes) = self
            .manager
            .enable_unit_files(vec![unit.to_string()], false, false)
            .await
            .map_err(|e| bus_failed(&format!("enable {unit}"), e))?;
        if !has_install {
            tracing::warn!(%unit, "unit has no [Install] section; enabling it did nothing");
        }
        tracing::debug!(%unit, ?changes, "enabled");
        // As `systemctl enable` does: the manager sees the new symlinks after a reload.
        self.daemon_reload().await
    }

    async fn disable(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        match self
            .manager
            .disable_unit_files(vec![unit.to_string()], false)
            .await
        {
            Ok(changes) => tracing::debug!(%unit, ?changes, "disabled"),
            // No unit file: nothing is enabled.
            Err(e) if is_error(&e, NO_SUCH_UNIT) => return Ok(()),
            Err(e) => return Err(bus_failed(&format!("disable {unit}"), e)),
        }
        self.daemon_reload().await
    }

    async fn start(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        self.run_job(
            "start",
            unit,
            self.manager
                .start_unit(unit.to_string(), "replace".to_string()),
        )
        .await
        .map(drop)
    }

    async fn stop(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        let call = self
            .manager
            .stop_unit(unit.to_string(), "replace".to_string());
        match self.try_job("stop", unit, call).await {
            Ok(_) => Ok(()),
            // A unit the manager does not know is not running.
            Err(JobError::Call(e)) if is_error(&e, NO_SUCH_UNIT) => Ok(()),
            Err(JobError::Call(e)) => Err(bus_failed(&format!("stop {unit}"), e)),
            Err(JobError::Effect(e)) => Err(e),
        }
    }

    async fn restart(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        self.run_job(
            "restart",
            unit,
            self.manager
                .restart_unit(unit.to_string(), "replace".to_string()),
        )
        .await
        .map(drop)
    }

    async fn start_no_wait(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        self.manager
            .start_unit(unit.to_string(), "replace".to_string())
            .await
            .map(drop)
            .map_err(|e| bus_failed(&format!("start {unit}"), e))
    }

    async fn restart_no_wait(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        self.manager
            .restart_unit(unit.to_string(), "replace".to_string())
            .await
            .map(drop)
            .map_err(|e| bus_failed(&format!("restart {unit}"), e))
    }

    async fn reset_failed(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        match self.manager.reset_failed_unit(unit.to_string()).await {
            Ok(()) => Ok(()),
            // Not loaded: nothing to reset.
            Err(e) if is_error(&e, NO_SUCH_UNIT) => Ok(()),
            Err(e) => Err(bus_failed(&format!("reset-failed {unit}"), e)),
        }
    }

    async fn schedule_restart(&self, unit: &str, delay_ms: u64) -> EffectResult {
        self.schedule_restart_named(unit, delay_ms).await.map(drop)
    }

    /// machined's view when it knows the machine (running while its state is `running`, started
    /// when it was registered); otherwise the `systemd-nspawn@<side>.service` unit's.
    async fn machine_status(&self, side: Side) -> EffectResult<MachineStatus> {
        if let Some(m) = self.machine(side.name()).await? {
            let running = m.state == "running";
            return Ok(MachineStatus {
                running,
                started_at: if running { m.registered_at } else { None },
            });
        }
        let unit = machine_unit(side);
        let started_at = self.active_enter(&unit).await?;
        Ok(MachineStatus {
            running: started_at.is_some(),
            started_at,
        })
    }

    async fn active_since(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        self.active_enter(unit).await
    }

    async fn started_since(&self, unit: &str) -> EffectResult<Option<Timestamp>> {
        let Some(state) = self.unit_state(unit).await? else {
            return Ok(None);
        };
        Ok(match state.active_state.as_str() {
            "activating" | "active" | "reloading" if state.inactive_exit_usec > 0 => {
                Some(usec_to_timestamp(state.inactive_exit_usec))
            }
            _ => None,
        })
    }
}

/// The method call that queues a job failed, or the job did.
enum JobError {
    Call(zbus::Error),
    Effect(EffectError),
}

impl From<EffectError> for JobError {
    fn from(e: EffectError) -> Self {
        Self::Effect(e)
    }
}

fn owned<'a>(v: impl Into<Variant<'a>>) -> zbus::Result<OwnedVariant> {
    OwnedVariant::try_from(v.into())
}

/// Whether `e` is a D-Bus error reply named `name`. zbus reports the names it defines itself
/// (`org.freedesktop.DBus.Error.*`, e.g. ServiceUnknown, UnknownObject) as `Error::FDO`, the
/// others as `Error::MethodError`.
fn is_error(e: &zbus::Error, name: &str) -> bool {
    use zbus::DBusError;
    match e {
        zbus::Error::MethodError(n, _, _) => n.as_str() == name,
        zbus::Error::FDO(f) => f.name().as_str() == name,
        zbus::Error::DBus(d) => d.name().as_str() == name,
        _ => false,
    }
}

fn bus_failed(what: &str, e: zbus::Error) -> EffectError {
    EffectError::Failed(format!("{what}: {e}"))
}

/// ActiveEnterTimestamp is µs of CLOCK_REALTIME; the core counts milliseconds.
fn usec_to_timestamp(usec: u64) -> Timestamp {
    Timestamp::from_millis(i64::try_from(usec / 1000).unwrap_or(i64::MAX))
}

/// A machine name as machined accepts it (a hostname label sequence, or `.host`), never a
/// path.
fn check_machine_name(name: &str) -> EffectResult {
    let ok = name == ".host"
        || !name.is_empty()
            && name.len() <= 64
            && !name.starts_with(['.', '-'])
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EffectError::Failed(format!(
            "invalid machine name {name:?}"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unit_names_are_file_names() {
        for ok in [
            "flexnode-agent.service",
            "systemd-nspawn@kube1.service",
            "flexnode-agent-restart-1.timer",
        ] {
            assert!(check_unit_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            ".service",
            "../x.service",
            "a/b.service",
            "x",
            "x.conf",
            ".hidden.service",
        ] {
            assert!(check_unit_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn write_is_atomic_with_mode_0644() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        write_file_atomic(&dir.path().join("a.service"), b"[Unit]\n", 0o644).expect("write");
        write_file_atomic(
            &dir.path().join("a.service"),
            b"[Unit]\nDescription=x\n",
            0o644,
        )
        .expect("rewrite");
        let p = dir.path().join("a.service");
        assert_eq!(
            std::fs::read_to_string(&p).expect("read"),
            "[Unit]\nDescription=x\n"
        );
        let mode = std::fs::metadata(&p).expect("stat").permissions().mode() & 0o7777;
        assert_eq!(mode, 0o644);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.service")]);
    }

    #[test]
    fn error_names_match_in_every_zbus_variant() {
        let fdo = zbus::Error::FDO(Box::new(zbus::fdo::Error::UnknownObject("gone".into())));
        assert!(is_error(&fdo, UNKNOWN_OBJECT));
        assert!(!is_error(&fdo, SERVICE_UNKNOWN));
        let fdo = zbus::Error::FDO(Box::new(zbus::fdo::Error::ServiceUnknown("none".into())));
        assert!(is_error(&fdo, SERVICE_UNKNOWN));
        assert!(!is_error(&zbus::Error::InvalidReply, SERVICE_UNKNOWN));
    }

    #[test]
    fn machine_names_are_not_paths() {
        for ok in ["kube1", "kube2", "fx-1.test", ".host"] {
            assert!(check_machine_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "../kube1", "a/b", "-x", ".hidden", &"x".repeat(65)] {
            assert!(check_machine_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn timestamps_are_milliseconds() {
        assert_eq!(
            usec_to_timestamp(1_700_000_000_123_456),
            Timestamp::from_millis(1_700_000_000_123)
        );
    }
}
