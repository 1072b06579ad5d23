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

mod jobs;
mod machined;

use jobs::JobError;
pub use jobs::JobOutcome;
pub use machined::{MachineEntry, MachineInfo};

use super::fs::{ensure_real_dir, read_small, sync_dir, write_file_atomic};
use super::{EffectError, EffectResult, MachineStatus, Systemd, check_unit_name, machine_unit};
use crate::lifecycle::Timestamp;
use crate::lifecycle::state::Side;
use std::path::{Path, PathBuf};
use std::time::Duration;
use zbus::proxy::CacheProperties;
use zbus::{Connection, OwnedObjectPath};
use zbus_systemd::systemd1::{ManagerProxy, UnitProxy};

/// Where the agent's unit files live on a normal system.
pub const DEFAULT_UNIT_DIR: &str = "/etc/systemd/system";
/// flexnode's drop-in, in `<unit>.d/`.
pub const DROP_IN: &str = "flexnode.conf";
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
/// Timer accuracy for scheduled restarts (systemd's default is one minute): a one-shot
/// timer's own wake-up costs nothing worth coalescing.
const RESTART_ACCURACY_USEC: u64 = 10_000;

/// The production [`Systemd`]: the system manager reached over a D-Bus connection.
#[derive(Clone, Debug)]
pub struct DbusSystemd {
    manager: ManagerProxy<'static>,
    unit_dir: PathBuf,
    job_timeout: Duration,
    busctl: String,
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
    async fn write_unit(&self, name: &str, contents: &str) -> EffectResult<bool> {
        check_unit_name(name)?;
        let path = self.unit_dir.join(name);
        let contents = contents.to_string();
        tokio::task::spawn_blocking(move || {
            if read_small(&path, 1 << 20, false)?.as_deref() == Some(contents.as_str()) {
                return Ok(false);
            }
            write_file_atomic(&path, contents.as_bytes(), 0o644).map(|()| true)
        })
        .await
        .map_err(|e| EffectError::Failed(format!("write unit: {e}")))?
    }

    async fn write_drop_in(&self, unit: &str, contents: &str) -> EffectResult<bool> {
        check_unit_name(unit)?;
        let dir = self.unit_dir.join(format!("{unit}.d"));
        let contents = contents.to_string();
        tokio::task::spawn_blocking(move || {
            let path = dir.join(DROP_IN);
            if read_small(&path, 1 << 20, false)?.as_deref() == Some(contents.as_str()) {
                return Ok(false);
            }
            ensure_real_dir(&dir, 0o755)?;
            write_file_atomic(&path, contents.as_bytes(), 0o644).map(|()| true)
        })
        .await
        .map_err(|e| EffectError::Failed(format!("write drop-in: {e}")))?
    }

    async fn remove_drop_in(&self, unit: &str) -> EffectResult<bool> {
        check_unit_name(unit)?;
        let dir = self.unit_dir.join(format!("{unit}.d"));
        tokio::task::spawn_blocking(move || {
            let path = dir.join(DROP_IN);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    sync_dir(&dir)?;
                    // Only an empty directory goes with it: others' drop-ins stay.
                    let _ = std::fs::remove_dir(&dir);
                    Ok(true)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                Err(e) => Err(EffectError::Failed(format!(
                    "remove {}: {e}",
                    path.display()
                ))),
            }
        })
        .await
        .map_err(|e| EffectError::Failed(format!("remove drop-in: {e}")))?
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

    async fn needs_reload(&self, unit: &str) -> EffectResult<bool> {
        let Some(proxy) = self.unit_proxy(unit).await? else {
            return Ok(false);
        };
        proxy
            .need_daemon_reload()
            .await
            .map_err(|e| bus_failed(&format!("read NeedDaemonReload of {unit}"), e))
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

    async fn mask(&self, unit: &str) -> EffectResult {
        check_unit_name(unit)?;
        let changes = self
            .manager
            .mask_unit_files(vec![unit.to_string()], false, true)
            .await
            .map_err(|e| bus_failed(&format!("mask {unit}"), e))?;
        tracing::debug!(%unit, ?changes, "masked");
        Ok(())
    }

    async fn swap_units(&self) -> EffectResult<Vec<String>> {
        let units = self
            .manager
            .list_units_by_patterns(Vec::new(), vec!["*.swap".to_string()])
            .await
            .map_err(|e| bus_failed("list the swap units", e))?;
        Ok(units.into_iter().map(|u| u.0).collect())
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

#[cfg(test)]
mod tests {
    use super::machined::check_machine_name;
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
