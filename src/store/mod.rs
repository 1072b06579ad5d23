//! The node's durable memory: SQLite in WAL mode with `synchronous=FULL`, file 0600 in a 0700
//! directory, one writer at a time.
//!
//! A step is persisted as intent (next state + its effects, journal entry without outcome)
//! before any effect runs, and its outcome after. After a crash the intent is still there.

pub mod cordon;
pub mod fault;
pub mod journal;
pub mod machine_images;
pub mod migrations;
pub mod operations;

use crate::lifecycle::{Effect, Input, NodeState, Timestamp};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use journal::JournalEntry;
pub use machine_images::MachineImage;
pub use operations::StoredResult;

pub const DEFAULT_PATH: &str = "/var/lib/flexnode/state.db";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("no flexnode store at {0} (has this node joined?)")]
    Missing(PathBuf),
    #[error("another flexnode process is writing {0}; only one writer may open the store")]
    Locked(PathBuf),
    #[error(
        "the store {path} is damaged ({detail}); it was not read. Restore it or reset the node"
    )]
    Corrupt { path: PathBuf, detail: String },
    #[error("the store directory {0} is accessible by group or others; it must be mode 0700")]
    InsecureDirectory(PathBuf),
    #[error(
        "the store directory {dir} belongs to uid {owner}, not to this user; it must be this \
         user's own (chown it, or remove it if it is not flexnode's)"
    )]
    ForeignDirectory { dir: PathBuf, owner: u32 },
    #[error(transparent)]
    Migration(#[from] migrations::MigrationError),
    #[error("cannot use the store {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("store error: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl StoreError {
    fn io(path: &Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// The persisted node state plus the intent of a step whose outcome is not recorded yet, or
/// the recorded outcome of one the core has not been told yet.
#[derive(Clone, Debug, PartialEq)]
pub struct Persisted {
    pub state: NodeState,
    pub pending: Option<Intent>,
    pub report: Option<Input>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Intent {
    pub seq: i64,
    /// When the intent was recorded: an effect observed to have happened after it is done.
    pub at: Timestamp,
    pub effects: Vec<Effect>,
}

/// The single writer. Holds an exclusive lock on `<store>.lock` while open.
#[derive(Debug)]
pub struct Store {
    /// Behind a mutex so the daemon's futures stay `Send`; one writer uses it at a time.
    conn: std::sync::Mutex<Connection>,
    path: PathBuf,
    _lock: File,
}

/// A read-only view for `flexnode status` and `history`; works while the daemon runs or not.
#[derive(Debug)]
pub struct StoreReader {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens the store, waiting up to `patience` while another process holds it (the join
    /// or recovery command that started this daemon is finishing its step).
    pub async fn open_waiting(path: &Path, patience: Duration) -> Result<Self, StoreError> {
        let deadline = std::time::Instant::now() + patience;
        loop {
            match Self::open(path) {
                Err(StoreError::Locked(_)) if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                other => return other,
            }
        }
    }

    /// Opens (creating if needed) the store for writing.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        ensure_private_dir(dir)?;
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(lock_path(path))
            .map_err(|e| StoreError::io(path, e))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => return Err(StoreError::Locked(path.into())),
            Err(fs::TryLockError::Error(e)) => return Err(StoreError::io(path, e)),
        }
        let fresh = match fs::symlink_metadata(path) {
            Ok(_) => false,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(StoreError::io(path, e)),
        };
        if fresh {
            create(path)?;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(0o600))
            .map_err(|e| StoreError::io(path, e))?;
        let mut conn = Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        check_integrity(&conn, path)?;
        // A store is created whole (`create`), so an existing file without a schema (empty,
        // truncated to nothing) is damage, never a store to start afresh in.
        let version: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(|e| corrupt(path, e))?;
        if version == 0 {
            return Err(StoreError::Corrupt {
                path: path.into(),
                detail: "no schema: the file is empty or not a flexnode store".into(),
            });
        }
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", true)?;
        // What can refuse the store runs before anything changes it: the migrations and the
        // node row's seed commit together or not at all, and only then does the store turn
        // to WAL, which rewrites the file's header
        // (`fuzz/regressions/store/damaged-node-table-before-wal`).
        {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            migrations::apply(&tx).map_err(|e| corrupt_or(e, path))?;
            seed(&tx)?;
            tx.commit()?;
        }
        let mode: String =
            conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::Corrupt {
                path: path.into(),
                detail: format!("journal mode is {mode}, not wal"),
            });
        }
        Ok(Self {
            conn: std::sync::Mutex::new(conn),
            path: path.into(),
            _lock: lock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn load(&self) -> Result<Persisted, StoreError> {
        load(&self.conn(), &self.path)
    }

    /// Intent: the next state, its effects and a journal entry without outcome, in one
    /// transaction, before any effect runs. With it go what must not depend on the effects
    /// running: a claimed operation is remembered, and a result the step decides enters the
    /// outbox (its `completedAt` is this moment), so abandoning or crashing the step loses
    /// neither. It consumes the outcome report it was taken on, if any.
    pub fn begin_step(
        &mut self,
        from: &NodeState,
        input: &Input,
        next: &NodeState,
        effects: &[Effect],
        now: Timestamp,
    ) -> Result<i64, StoreError> {
        self.begin_step_superseding(from, input, next, effects, now, None)
    }

    /// The same, closing in the same transaction the interrupted step `superseded` (its
    /// journal entry's outcome: superseded by `input`), so no crash leaves the one closed and
    /// the other not begun.
    pub fn begin_step_superseding(
        &mut self,
        from: &NodeState,
        input: &Input,
        next: &NodeState,
        effects: &[Effect],
        now: Timestamp,
        superseded: Option<i64>,
    ) -> Result<i64, StoreError> {
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        if let Some(seq) = superseded {
            tx.prepare_cached(
                "UPDATE journal SET outcome = ?2, outcome_at = ?3 WHERE seq = ?1 AND outcome IS NULL",
            )?
            .execute(params![seq, format!("superseded by {input}"), now.millis()])?;
        }
        if let Input::OperationClaimed(claim) = input {
            operations::record_claim(
                &tx,
                &claim.op,
                claim.kind.name(),
                claim.machine_generation,
                now,
            )?;
        }
        for effect in effects {
            if let Effect::PublishResult { op, result } = effect {
                operations::record_result(&tx, op, result, now)?;
            }
        }
        let summaries: Vec<String> = effects.iter().map(ToString::to_string).collect();
        tx.prepare_cached("INSERT INTO journal (at, from_state, input, to_state, effects) VALUES (?1, ?2, ?3, ?4, ?5)")?.execute(params![
                now.millis(),
                from.to_string(),
                input.to_string(),
                next.to_string(),
                to_json(&summaries)?
            ])?;
        let seq = tx.last_insert_rowid();
        let pending = (!effects.is_empty())
            .then(|| to_json(&effects))
            .transpose()?;
        tx.prepare_cached(
            "UPDATE node SET state = ?1, pending = ?2, pending_seq = ?3, report = NULL,
                 updated_at = ?4 WHERE id = 1",
        )?
        .execute(params![
            to_json(next)?,
            pending,
            pending.as_ref().map(|_| seq),
            now.millis()
        ])?;
        if pending.is_none() {
            tx.prepare_cached("UPDATE journal SET outcome = 'ok', outcome_at = ?2 WHERE seq = ?1")?
                .execute(params![seq, now.millis()])?;
        }
        commit(tx)?;
        Ok(seq)
    }

    /// Outcome: closes the journal entry and clears the intent, keeping `report` (what the
    /// core must still be told) in the same transaction, so no crash can lose it.
    pub fn finish_step(
        &mut self,
        seq: i64,
        outcome: &str,
        report: Option<&Input>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let report = report.map(to_json).transpose()?;
        let mut conn = self.conn();
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.prepare_cached(
            "UPDATE journal SET outcome = ?2, outcome_at = ?3 WHERE seq = ?1 AND outcome IS NULL",
        )?
        .execute(params![seq, outcome, now.millis()])?;
        tx.prepare_cached(
            "UPDATE node SET pending = NULL, pending_seq = NULL, report = ?2
             WHERE id = 1 AND pending_seq = ?1",
        )?
        .execute(params![seq, report])?;
        commit(tx)?;
        Ok(())
    }

    /// An outcome report the core refused (nobody waited for it) is dropped.
    pub fn clear_report(&mut self) -> Result<(), StoreError> {
        self.conn()
            .execute("UPDATE node SET report = NULL WHERE id = 1", [])?;
        Ok(())
    }

    pub(crate) fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A committed write that changes nothing: whether the store can be written again after a
    /// full disk or a read-only mount (src/reconcile/fault.rs asks before it lets steps run).
    pub fn check_writable(&self) -> Result<(), StoreError> {
        self.conn()
            .execute("UPDATE node SET updated_at = updated_at WHERE id = 1", [])?;
        Ok(())
    }

    /// Moves WAL content into the main file on a clean shutdown.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        self.conn()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }
}

impl StoreReader {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing(path.into()));
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(Duration::from_secs(5))?;
        check_integrity(&conn, path)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version == 0 {
            return Err(StoreError::Corrupt {
                path: path.into(),
                detail: "no schema".into(),
            });
        }
        if version > migrations::SCHEMA_VERSION {
            return Err(migrations::MigrationError::TooNew {
                found: version,
                known: migrations::SCHEMA_VERSION,
            }
            .into());
        }
        Ok(Self {
            conn,
            path: path.into(),
        })
    }

    pub fn load(&self) -> Result<Persisted, StoreError> {
        load(&self.conn, &self.path)
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }
}

/// state, pending effects, their journal entry, its time, and the unreported outcome.
type NodeRow = (
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
);

fn load(conn: &Connection, path: &Path) -> Result<Persisted, StoreError> {
    // A reader may meet a store the daemon has not migrated yet (schema 4 added the report).
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| corrupt(path, e))?;
    let report = if version < 4 { "NULL" } else { "n.report" };
    let row: Option<NodeRow> = conn
        .prepare_cached(&format!(
            "SELECT n.state, n.pending, n.pending_seq, j.at, {report} FROM node n
             LEFT JOIN journal j ON j.seq = n.pending_seq WHERE n.id = 1"
        ))
        .and_then(|mut stmt| {
            stmt.query_row([], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
            })
            .optional()
        })
        .map_err(|e| corrupt(path, e))?;
    let Some((state, pending, seq, at, report)) = row else {
        // A reader of a store its writer has not seeded yet; with any history, damage.
        let history: bool = conn
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM journal) OR EXISTS (SELECT 1 FROM operations)",
                [],
                |r| r.get(0),
            )
            .map_err(|e| corrupt(path, e))?;
        if history {
            return Err(StoreError::Corrupt {
                path: path.into(),
                detail: "the node's state is missing but its journal is not".into(),
            });
        }
        return Ok(Persisted {
            state: NodeState::default(),
            pending: None,
            report: None,
        });
    };
    let report = report
        .map(|json| serde_json::from_str::<Input>(&json))
        .transpose()
        .map_err(|e| StoreError::Corrupt {
            path: path.into(),
            detail: format!("the recorded outcome does not decode: {e}"),
        })?;
    let state: NodeState = serde_json::from_str(&state).map_err(|e| StoreError::Corrupt {
        path: path.into(),
        detail: format!("node state does not decode: {e}"),
    })?;
    let pending = match (pending, seq.zip(at)) {
        (Some(json), Some((seq, at))) => Some(Intent {
            seq,
            at: Timestamp::from_millis(at),
            effects: serde_json::from_str(&json).map_err(|e| StoreError::Corrupt {
                path: path.into(),
                detail: format!("pending effects do not decode: {e}"),
            })?,
        }),
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            return Err(StoreError::Corrupt {
                path: path.into(),
                detail: "pending effects without their journal entry".into(),
            });
        }
    };
    if pending.is_some() && report.is_some() {
        return Err(StoreError::Corrupt {
            path: path.into(),
            detail: "an unfinished step and an unreported outcome at once".into(),
        });
    }
    Ok(Persisted {
        state,
        pending,
        report,
    })
}

/// The node's row, on a store that has none and no history (a new store, or one made by a
/// build that seeded it at its first open, and stopped before): a store whose row is gone but
/// whose journal or operations are not is damage, which `load` reports.
fn seed(conn: &Connection) -> Result<(), StoreError> {
    let state = to_json(&NodeState::default())?;
    conn.execute(
        "INSERT INTO node (id, state, updated_at) SELECT 1, ?1, 0
         WHERE NOT EXISTS (SELECT 1 FROM node) AND NOT EXISTS (SELECT 1 FROM journal)
           AND NOT EXISTS (SELECT 1 FROM operations)",
        params![state],
    )?;
    Ok(())
}

/// A new store, whole or not at all: made and migrated under a temporary name (0600 from the
/// first byte; SQLite gives its WAL and index the same mode), then renamed into place. So a
/// crash never leaves a file at `path` that `open` would have to tell from a damaged one.
fn create(path: &Path) -> Result<(), StoreError> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    let tmp = PathBuf::from(tmp);
    for leftover in [tmp.clone(), sidecar(&tmp, "-wal"), sidecar(&tmp, "-shm")] {
        match fs::remove_file(&leftover) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(StoreError::io(&leftover, e));
            }
            _ => {}
        }
    }
    OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| StoreError::io(path, e))?;
    {
        let mut conn = Connection::open(&tmp)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        migrations::migrate(&mut conn).map_err(|e| corrupt_or(e, path))?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
    }
    fs::rename(&tmp, path).map_err(|e| StoreError::io(path, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io(dir, e))
}

/// Commits a step's transaction, timed for `flexnode_store_commit_duration_seconds`.
fn commit(tx: rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let began = std::time::Instant::now();
    tx.commit()?;
    crate::metrics::store_committed(began.elapsed().as_secs_f64());
    Ok(())
}

fn sidecar(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn lock_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

fn ensure_private_dir(dir: &Path) -> Result<(), StoreError> {
    if !dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::io(dir, e))?;
        return Ok(());
    }
    let meta = fs::metadata(dir).map_err(|e| StoreError::io(dir, e))?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(StoreError::InsecureDirectory(dir.into()));
    }
    // Another user's directory, even 0700, is theirs to swap the store in.
    let me = rustix::process::geteuid().as_raw();
    if std::os::unix::fs::MetadataExt::uid(&meta) != me {
        return Err(StoreError::ForeignDirectory {
            dir: dir.into(),
            owner: std::os::unix::fs::MetadataExt::uid(&meta),
        });
    }
    Ok(())
}

/// A file that is not a database, or whose pages are damaged, is reported, never guessed at.
fn check_integrity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let result: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .map_err(|e| corrupt(path, e))?;
    if result != "ok" {
        return Err(StoreError::Corrupt {
            path: path.into(),
            detail: result,
        });
    }
    Ok(())
}

/// SQLite's own verdict of damage (a malformed page, not a database) is `Corrupt`; any other
/// failure (a full disk, a read-only filesystem, an I/O error) stays what it was, so it is
/// never taken for damage (src/store/fault.rs tells those apart).
fn corrupt(path: &Path, e: rusqlite::Error) -> StoreError {
    use rusqlite::ffi::ErrorCode;
    match e {
        rusqlite::Error::SqliteFailure(ref f, _)
            if !matches!(f.code, ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase) =>
        {
            StoreError::Sqlite(e)
        }
        e => StoreError::Corrupt {
            path: path.into(),
            detail: e.to_string(),
        },
    }
}

fn corrupt_or(e: migrations::MigrationError, path: &Path) -> StoreError {
    match e {
        migrations::MigrationError::Sqlite(s) => corrupt(path, s),
        migrations::MigrationError::TooNew { .. } => StoreError::Migration(e),
    }
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v).map_err(|e| StoreError::Corrupt {
        path: PathBuf::new(),
        detail: format!("cannot encode: {e}"),
    })
}
