//! Operations seen and their results: an outbox, so a result is persisted before it is
//! published and re-published (never re-executed) after a crash.

use super::{Store, StoreError, StoreReader};
use crate::lifecycle::Timestamp;
use crate::lifecycle::result::{OpResult, ResultReason};
use crate::lifecycle::state::OpRef;
use rusqlite::{Connection, OptionalExtension, params};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredResult {
    pub op: OpRef,
    /// The operation's kind as claimed; empty for one refused before its claim was stored.
    pub kind: String,
    pub result: OpResult,
    pub completed_at: Timestamp,
    pub published_at: Option<Timestamp>,
}

/// A reason the store holds is one flexnode wrote: anything else is damage, never a guess.
fn reason_from(column: usize, s: &str) -> rusqlite::Result<ResultReason> {
    ResultReason::parse(s).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            column,
            rusqlite::types::Type::Text,
            format!("unknown result reason {s:?}").into(),
        )
    })
}

const SELECT: &str = "SELECT uid, name, result_reason, result_message, started_at, completed_at,
    machine_generation, published_at, kind FROM operations WHERE result_reason IS NOT NULL";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<StoredResult> {
    let reason: String = r.get(2)?;
    Ok(StoredResult {
        op: OpRef {
            uid: r.get(0)?,
            name: r.get(1)?,
        },
        kind: r.get(8)?,
        result: OpResult {
            reason: reason_from(2, &reason)?,
            message: r.get(3)?,
            started_at: Timestamp::from_millis(r.get(4)?),
            machine_generation: r.get(6)?,
        },
        completed_at: Timestamp::from_millis(r.get(5)?),
        published_at: r.get::<_, Option<i64>>(7)?.map(Timestamp::from_millis),
    })
}

/// Remembers a claimed operation (idempotent); written with the claim's intent.
pub(super) fn record_claim(
    conn: &Connection,
    op: &OpRef,
    kind: &str,
    generation: i64,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO operations (uid, name, generation, kind, first_seen_at)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT(uid) DO UPDATE SET generation = excluded.generation",
    )?
    .execute(params![op.uid, op.name, generation, kind, now.millis()])?;
    Ok(())
}

/// Persists a terminal result; the first one recorded for a UID wins. Written with the
/// intent of the step that decides it.
pub(super) fn record_result(
    conn: &Connection,
    op: &OpRef,
    result: &OpResult,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO operations (uid, name, kind, first_seen_at, result_reason, result_message,
             started_at, completed_at, machine_generation)
         VALUES (?1, ?2, '', ?3, ?4, ?5, ?6, ?3, ?7)
         ON CONFLICT(uid) DO UPDATE SET
             result_reason = excluded.result_reason,
             result_message = excluded.result_message,
             started_at = excluded.started_at,
             completed_at = excluded.completed_at,
             machine_generation = excluded.machine_generation
         WHERE operations.result_reason IS NULL",
    )?
    .execute(params![
        op.uid,
        op.name,
        now.millis(),
        result.reason.as_str(),
        result.message,
        result.started_at.millis(),
        result.machine_generation
    ])?;
    Ok(())
}

fn last_result(conn: &Connection) -> Result<Option<StoredResult>, StoreError> {
    Ok(conn
        .query_row(
            &format!("{SELECT} ORDER BY completed_at DESC LIMIT 1"),
            [],
            row,
        )
        .optional()?)
}

impl Store {
    pub fn mark_published(&self, uid: &str, now: Timestamp) -> Result<(), StoreError> {
        self.conn()
            .prepare_cached(
                "UPDATE operations SET published_at = ?2 WHERE uid = ?1 AND published_at IS NULL",
            )?
            .execute(params![uid, now.millis()])?;
        Ok(())
    }

    pub fn result_for(&self, uid: &str) -> Result<Option<StoredResult>, StoreError> {
        Ok(self
            .conn()
            .query_row(&format!("{SELECT} AND uid = ?1"), params![uid], row)
            .optional()?)
    }

    /// Results that still have to reach the API server, oldest first.
    pub fn unpublished(&self) -> Result<Vec<StoredResult>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare(&format!(
            "{SELECT} AND published_at IS NULL ORDER BY completed_at"
        ))?;
        let rows = stmt.query_map([], row)?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }

    pub fn last_result(&self) -> Result<Option<StoredResult>, StoreError> {
        last_result(&self.conn())
    }

    /// Remembers an image this agent pulled (idempotent).
    pub fn record_agent_image(
        &self,
        digest: &str,
        reference: &str,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO agent_images (digest, reference, pulled_at) VALUES (?1, ?2, ?3)
             ON CONFLICT(digest) DO NOTHING",
            params![digest, reference, now.millis()],
        )?;
        Ok(())
    }

    pub fn is_agent_image(&self, digest: &str) -> Result<bool, StoreError> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM agent_images WHERE digest = ?1",
                params![digest],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The digests of the images upgrades pulled, oldest first.
    pub fn agent_images(&self) -> Result<Vec<String>, StoreError> {
        let conn = self.conn();
        let mut stmt =
            conn.prepare("SELECT digest FROM agent_images ORDER BY pulled_at, digest")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub fn forget_agent_image(&self, digest: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "DELETE FROM agent_images WHERE digest = ?1",
            params![digest],
        )?;
        Ok(())
    }
}

impl StoreReader {
    pub fn last_result(&self) -> Result<Option<StoredResult>, StoreError> {
        last_result(self.conn())
    }

    /// The Node as last seen (its JSON, as recorded) and when.
    pub fn node_seen(&self) -> Result<Option<(String, Timestamp)>, StoreError> {
        node_seen(self.conn())
    }
}

impl Store {
    /// Remembers the Node as seen at `now` (only the latest), as JSON.
    pub fn record_node_seen(&self, json: &str, now: Timestamp) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO node_seen (id, seen, seen_at) VALUES (1, ?1, ?2)
             ON CONFLICT(id) DO UPDATE SET seen = ?1, seen_at = ?2",
            params![json, now.millis()],
        )?;
        Ok(())
    }
}

fn node_seen(conn: &Connection) -> Result<Option<(String, Timestamp)>, StoreError> {
    // A reader may meet a store the daemon has not migrated yet (schema 3 added the table).
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version < 3 {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT seen, seen_at FROM node_seen WHERE id = 1",
            [],
            |r| Ok((r.get(0)?, Timestamp::from_millis(r.get(1)?))),
        )
        .optional()?)
}
