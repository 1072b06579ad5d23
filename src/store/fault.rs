//! The faults the node's filesystems and its store show (src/lifecycle/fault.rs names them):
//! in a store error, an I/O error under the store's directory, or a look at the filesystems
//! (`statvfs`) that writes nothing. The daemon waits out those that can pass by themselves
//! (src/reconcile/fault.rs); `flexnode status` and the commands report them.

use super::StoreError;
use super::migrations::MigrationError;
use crate::lifecycle::fault::{Fault, FaultKind};
use rusqlite::ffi::ErrorCode;
use std::path::Path;

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
}
