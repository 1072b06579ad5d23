//! The daemon in a bad environment (src/machine/fault.rs names the faults): finding one in an
//! error or on the filesystems, reporting it once through every channel that still works —
//! the log (`reason=`, `remedy=` fields), systemd's STATUS, the Machine's `NodeUpdated`
//! condition and a Warning Event — and, for a fault that can pass by itself, holding new work
//! until it has passed, then saying so on the same channels.
//!
//! Holding is what keeps a full disk or a read-only mount from costing an operation: a step
//! whose intent cannot be written never runs (the executor writes the intent first), a claim
//! that cannot be recorded is not made (the operation stays `Pending`, told why), and what a
//! crash-like failure left half-done is finished from its intent once the store takes writes
//! again, as after a crash.

use super::owner::DaemonError;
use crate::config::Config;
use crate::effects::kube::KubePublisher;
use crate::exec::ExecError;
use crate::machine::NodeState;
use crate::machine::fault::{Fault, FaultKind};
use crate::machine::result::MachinePhase;
use crate::store::migrations::MigrationError;
use crate::store::{Store, StoreError};
use rusqlite::ffi::ErrorCode;
use std::path::{Path, PathBuf};

/// Less free space than this on the store's filesystem is reported as full by
/// `flexnode status` (a step writes a few pages; SQLite needs room to grow its WAL).
pub const LOW_SPACE: u64 = 1 << 20;

/// The fault of a store error, or `None` when it is none (another writer, a bug). `path` is
/// the store file.
pub fn of_store(e: &StoreError, path: &Path) -> Option<Fault> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    match e {
        StoreError::Missing(p) => Some(Fault::new(FaultKind::StoreMissing, p, "")),
        StoreError::Corrupt { detail, .. } => {
            Some(Fault::new(FaultKind::StoreCorrupt, path, detail.clone()))
        }
        StoreError::Migration(MigrationError::TooNew { found, known }) => Some(Fault::new(
            FaultKind::StoreSchemaTooNew,
            path,
            format!("schema {found}; this build knows {known}"),
        )),
        StoreError::Migration(MigrationError::Sqlite(e)) | StoreError::Sqlite(e) => {
            of_sqlite(e, path, dir)
        }
        StoreError::InsecureDirectory(d) => {
            Some(Fault::new(FaultKind::StoreDirectoryInsecure, d, ""))
        }
        StoreError::ForeignDirectory { dir, owner } => Some(Fault::new(
            FaultKind::StoreDirectoryInsecure,
            dir,
            format!("owned by uid {owner}"),
        )),
        StoreError::Io { source, .. } => Some(of_io(source, dir)),
        StoreError::Locked(_) => None,
    }
}

/// The fault of a daemon's error, if it is one.
pub fn of_daemon(e: &DaemonError, path: &Path) -> Option<Fault> {
    match e {
        DaemonError::Exec(ExecError::Store(e)) | DaemonError::Store(e) => of_store(e, path),
        DaemonError::Exec(ExecError::Crashed) => None,
    }
}

fn of_sqlite(e: &rusqlite::Error, path: &Path, dir: &Path) -> Option<Fault> {
    let f = match e {
        rusqlite::Error::SqliteFailure(f, _) => f,
        // A row whose value is not what the schema stores: damage the page check missed.
        rusqlite::Error::FromSqlConversionFailure(..) | rusqlite::Error::InvalidColumnType(..) => {
            return Some(Fault::new(FaultKind::StoreCorrupt, path, e.to_string()));
        }
        _ => return None,
    };
    let detail = e.to_string();
    let kind = match f.code {
        ErrorCode::DiskFull => FaultKind::DiskFull,
        ErrorCode::ReadOnly => FaultKind::StoreReadOnly,
        ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase => {
            return Some(Fault::new(FaultKind::StoreCorrupt, path, detail));
        }
        // SQLite reports a write the filesystem refused as an I/O error or as a file it
        // cannot open (the WAL, its index): the filesystem says which.
        ErrorCode::SystemIoFailure | ErrorCode::CannotOpen => {
            probe_dir(dir).unwrap_or(FaultKind::StoreIOError)
        }
        _ => return None,
    };
    Some(Fault::new(kind, dir, detail))
}

/// An I/O error under the store's directory.
pub fn of_io(e: &std::io::Error, dir: &Path) -> Fault {
    use rustix::io::Errno;
    let kind = match e.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOSPC | Errno::DQUOT) => FaultKind::DiskFull,
        Some(Errno::ROFS) => FaultKind::StoreReadOnly,
        _ => probe_dir(dir).unwrap_or(FaultKind::StoreIOError),
    };
    Fault::new(kind, dir, e.to_string())
}

/// The installed configuration, or the fault that keeps it from being read: missing,
/// unreadable (an I/O error, not text), or a setting that cannot work.
pub fn load_config(path: &Path, hostname: &str) -> Result<Config, Fault> {
    match std::fs::read(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Fault::new(FaultKind::ConfigMissing, path, ""));
        }
        Err(e) => return Err(Fault::new(FaultKind::ConfigUnreadable, path, e.to_string())),
        Ok(bytes) if std::str::from_utf8(&bytes).is_err() => {
            return Err(Fault::new(
                FaultKind::ConfigUnreadable,
                path,
                "it is not text",
            ));
        }
        Ok(_) => {}
    }
    Config::load(path, hostname)
        .map_err(|e| Fault::new(FaultKind::ConfigInvalid, path, e.to_string()))
}

/// What the filesystem of `dir` says by itself: read-only, or (nearly) full. `None` when
/// neither, or when it cannot be asked.
pub fn probe_dir(dir: &Path) -> Option<FaultKind> {
    let st = rustix::fs::statvfs(dir).ok()?;
    if st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY) {
        return Some(FaultKind::StoreReadOnly);
    }
    (st.f_bavail.saturating_mul(st.f_frsize) < LOW_SPACE).then_some(FaultKind::DiskFull)
}

/// Whether the filesystem of `path` is mounted read-only.
pub fn read_only(path: &Path) -> bool {
    rustix::fs::statvfs(path)
        .is_ok_and(|st| st.f_flag.contains(rustix::fs::StatVfsMountFlags::RDONLY))
}

/// The faults a look at the filesystems finds without writing anything: the store's directory
/// read-only or (nearly) full, `etc` read-only. `flexnode status` asks.
pub fn environment(store: &Path, etc: &Path) -> Vec<Fault> {
    let dir = store.parent().unwrap_or(Path::new("/"));
    let mut found = Vec::new();
    if dir.exists()
        && let Some(kind) = probe_dir(dir)
    {
        let detail = match kind {
            FaultKind::DiskFull => rustix::fs::statvfs(dir)
                .map(|st| {
                    format!(
                        "{} KiB free",
                        st.f_bavail.saturating_mul(st.f_frsize) / 1024
                    )
                })
                .unwrap_or_default(),
            _ => String::new(),
        };
        found.push(Fault::new(kind, dir, detail));
    }
    if read_only(etc) {
        found.push(Fault::new(FaultKind::EtcReadOnly, etc, ""));
    }
    found
}

/// The Machine phase the core reports for `state` (for a Machine a fault marked `Failed`).
pub fn machine_phase(state: &NodeState) -> Option<MachinePhase> {
    match state {
        NodeState::Unjoined { .. } => None,
        NodeState::Joining { .. } => Some(MachinePhase::Joining),
        NodeState::Rebooting { .. } => Some(MachinePhase::Rebooting),
        NodeState::Repaving { .. } => Some(MachinePhase::Provisioning),
        NodeState::Ready { .. } | NodeState::Upgrading { .. } | NodeState::Resetting { .. } => {
            Some(MachinePhase::Ready)
        }
    }
}

/// Tells systemd (`systemctl status`, `StatusText`); a no-op outside a `Type=notify` unit.
pub fn status_text(text: &str) {
    // STATUS is one line.
    let line: String = text
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(480)
        .collect();
    super::liveness::notify(&[sd_notify::NotifyState::Status(&line)]);
}

/// Waiting for the store counts as started for systemd (so it neither kills the agent for a
/// slow start nor restarts it); STATUS says what it waits for. The watchdog is fed meanwhile.
pub fn ready_while_waiting() {
    super::liveness::notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Watchdog,
    ]);
}

/// `fault` through every channel: the log, STATUS, and (with a publisher) the Machine's
/// condition and a Warning Event. A failed Machine write is logged: the other channels stand.
pub async fn report(fault: &Fault, publisher: Option<&KubePublisher>) {
    let kind = fault.kind;
    tracing::error!(
        reason = %kind,
        path = %fault.path.display(),
        detail = %fault.detail,
        remedy = %fault.remedy(),
        waits = !kind.needs_operator(),
        "{}",
        fault.message()
    );
    status_text(&format!("{fault}; {}", fault.remedy()));
    if let Some(p) = publisher
        && let Err(e) = p.report_fault(fault).await
    {
        tracing::warn!(reason = %kind, error = %e, "the Machine does not show the fault");
    }
}

/// The daemon's account of a fault it waits out. At most one at a time: the first found.
#[derive(Debug)]
pub struct Health {
    current: Option<Fault>,
    /// The host's `/etc` as this process reaches it; `None`: not looked at (a simulated host).
    etc: Option<PathBuf>,
}

impl Health {
    pub fn new(etc: Option<PathBuf>) -> Self {
        Self { current: None, etc }
    }

    pub fn fault(&self) -> Option<&Fault> {
        self.current.as_ref()
    }

    /// A fault the daemon waits out; reported when it is new.
    pub async fn enter(&mut self, fault: Fault, publisher: &KubePublisher) {
        if self.current.as_ref().map(|f| f.kind) == Some(fault.kind) {
            return;
        }
        report(&fault, Some(publisher)).await;
        self.current = Some(fault);
    }

    /// A fault an earlier process reported (a damaged store since restored, a configuration
    /// since fixed) is over once a daemon runs: the Machine that still shows one gets the
    /// phase the core reports for `state` back. One read of the Machine per start.
    pub async fn clear_shown(&self, state: &NodeState, publisher: &KubePublisher) {
        let Some(phase) = machine_phase(state) else {
            return;
        };
        let generation = state.node().map(|n| n.applied.generation);
        match publisher
            .clear_fault(phase, "the agent runs again", generation)
            .await
        {
            Ok(true) => tracing::info!("the Machine's fault from an earlier start is cleared"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "the Machine may still show an earlier fault"),
        }
    }

    /// Whether new work may start: after a store fault, its filesystem is writable with at
    /// least [`LOW_SPACE`] free and the store takes a write again; `/etc` is writable. A fault that has passed is said to be over (log, STATUS, the
    /// Machine back at the phase the core reports for `state`).
    pub async fn check(
        &mut self,
        store: &Store,
        state: &NodeState,
        publisher: &KubePublisher,
    ) -> bool {
        let store_fault = self
            .current
            .as_ref()
            .is_some_and(|f| f.kind != FaultKind::EtcReadOnly);
        // Room first: after a write the disk refused, a small one may still fit where the
        // refused one had reached, so a write alone does not say the disk has room again.
        if store_fault
            && (probe_dir(store.path().parent().unwrap_or(Path::new("/"))).is_some()
                || store.check_writable().is_err())
        {
            return false;
        }
        if let Some(etc) = &self.etc
            && read_only(etc)
        {
            let fault = Fault::new(FaultKind::EtcReadOnly, etc, "");
            if store_fault {
                self.current = None;
            }
            self.enter(fault, publisher).await;
            return false;
        }
        if let Some(over) = self.current.take() {
            let message = format!("{} is over: the agent runs again", over.kind);
            tracing::info!(reason = %over.kind, "{message}");
            status_text(&format!("{}; {message}", state.phase_name()));
            if let Some(phase) = machine_phase(state)
                && let Err(e) = publisher
                    .clear_fault(phase, &message, state.node().map(|n| n.applied.generation))
                    .await
            {
                tracing::warn!(error = %e, "the Machine still shows {}", over.kind);
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_map_to_their_fault_and_others_to_none() {
        let p = Path::new("/var/lib/flexnode/state.db");
        let corrupt = StoreError::Corrupt {
            path: p.into(),
            detail: "file is not a database".into(),
        };
        assert_eq!(
            of_store(&corrupt, p).map(|f| f.kind),
            Some(FaultKind::StoreCorrupt)
        );
        let too_new = StoreError::Migration(MigrationError::TooNew { found: 9, known: 4 });
        let f = of_store(&too_new, p).expect("a fault");
        assert_eq!(f.kind, FaultKind::StoreSchemaTooNew);
        assert!(f.message().contains("schema 9"), "{}", f.message());
        assert!(of_store(&StoreError::Locked(p.into()), p).is_none());
        let sqlite = |code| {
            StoreError::Sqlite(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(code),
                None,
            ))
        };
        assert_eq!(
            of_store(&sqlite(rusqlite::ffi::SQLITE_FULL), p).map(|f| f.kind),
            Some(FaultKind::DiskFull)
        );
        assert_eq!(
            of_store(&sqlite(rusqlite::ffi::SQLITE_CORRUPT), p).map(|f| f.kind),
            Some(FaultKind::StoreCorrupt)
        );
        assert!(of_store(&sqlite(rusqlite::ffi::SQLITE_BUSY), p).is_none());
        let enospc = std::io::Error::from_raw_os_error(rustix::io::Errno::NOSPC.raw_os_error());
        assert_eq!(of_io(&enospc, Path::new("/")).kind, FaultKind::DiskFull);
        let erofs = std::io::Error::from_raw_os_error(rustix::io::Errno::ROFS.raw_os_error());
        assert_eq!(of_io(&erofs, Path::new("/")).kind, FaultKind::StoreReadOnly);
    }

    #[test]
    fn a_missing_or_garbled_config_is_told_apart_from_a_bad_setting() {
        let dir = tempfile::tempdir().expect("tmp");
        let missing = dir.path().join("config.yaml");
        let kind = |p: &Path| load_config(p, "host").err().map(|f| f.kind);
        assert_eq!(kind(&missing), Some(FaultKind::ConfigMissing));
        std::fs::write(&missing, [0xff, 0xfe, 0x00, 0x80]).expect("write");
        assert_eq!(kind(&missing), Some(FaultKind::ConfigUnreadable));
        assert_eq!(kind(dir.path()), Some(FaultKind::ConfigUnreadable));
        std::fs::write(&missing, "nodeName: Not_A_Name\n").expect("write");
        assert_eq!(kind(&missing), Some(FaultKind::ConfigInvalid));
    }
}
