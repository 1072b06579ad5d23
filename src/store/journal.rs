//! The append-only transition journal, read by `flexnode history` and `status`.

use super::{StoreError, StoreReader};
use crate::lifecycle::Timestamp;
use rusqlite::{Connection, params};
use serde::Serialize;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JournalEntry {
    pub seq: i64,
    pub at: Timestamp,
    pub from: String,
    pub input: String,
    pub to: String,
    pub effects: Vec<String>,
    /// `None` while the step's effects run (or were interrupted by a crash).
    pub outcome: Option<String>,
}

/// The newest `limit` entries, oldest first.
pub fn recent(conn: &Connection, limit: i64) -> Result<Vec<JournalEntry>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT seq, at, from_state, input, to_state, effects, outcome FROM journal
         ORDER BY seq DESC LIMIT ?1",
    )?;
    let rows = stmt.query_map(params![limit], |r| {
        let effects: String = r.get(5)?;
        let effects = serde_json::from_str(&effects).map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(5, rusqlite::types::Type::Text, Box::new(e))
        })?;
        Ok(JournalEntry {
            seq: r.get(0)?,
            at: Timestamp::from_millis(r.get(1)?),
            from: r.get(2)?,
            input: r.get(3)?,
            to: r.get(4)?,
            effects,
            outcome: r.get(6)?,
        })
    })?;
    let mut out = rows.collect::<Result<Vec<_>, _>>()?;
    out.reverse();
    Ok(out)
}

impl StoreReader {
    pub fn journal(&self, limit: i64) -> Result<Vec<JournalEntry>, StoreError> {
        recent(self.conn(), limit)
    }
}

impl super::Store {
    pub fn journal(&self, limit: i64) -> Result<Vec<JournalEntry>, StoreError> {
        recent(&self.conn(), limit)
    }
}
