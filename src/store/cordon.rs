//! The drain's record (`state/0006_cordon.sql`): who holds the node's cordon, and how the
//! drain goes.

use super::{Store, StoreError, StoreReader};
use crate::lifecycle::Timestamp;
use rusqlite::{Connection, OptionalExtension, params};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CordonRecord {
    pub holder: String,
    /// The Node carries the holder's mark (the agent placed the cordon).
    pub cordoned: bool,
    pub since: Timestamp,
    pub progress: String,
}

impl Store {
    /// Records a drain for `holder` (before its cordon); an earlier record of the same holder
    /// (a drain resumed after a crash) is kept as it is.
    pub fn begin_drain(&self, holder: &str, now: Timestamp) -> Result<CordonRecord, StoreError> {
        let conn = self.conn();
        conn.execute(
            "INSERT INTO cordon (id, holder, cordoned, since, progress)
             VALUES (1, ?1, 0, ?2, '')
             ON CONFLICT(id) DO UPDATE SET holder = ?1, cordoned = 0, since = ?2, progress = ''
                 WHERE holder <> ?1",
            params![holder, now.millis()],
        )?;
        cordon(&conn)?.ok_or(StoreError::Sqlite(rusqlite::Error::QueryReturnedNoRows))
    }

    pub fn mark_cordoned(&self, holder: &str) -> Result<(), StoreError> {
        self.conn().execute(
            "UPDATE cordon SET cordoned = 1 WHERE holder = ?1",
            params![holder],
        )?;
        Ok(())
    }

    pub fn record_drain_progress(&self, progress: &str) -> Result<(), StoreError> {
        self.conn()
            .execute("UPDATE cordon SET progress = ?1", params![progress])?;
        Ok(())
    }

    pub fn cordon(&self) -> Result<Option<CordonRecord>, StoreError> {
        cordon(&self.conn())
    }

    /// The cordon lifted (or never the agent's).
    pub fn forget_cordon(&self) -> Result<(), StoreError> {
        self.conn().execute("DELETE FROM cordon", [])?;
        Ok(())
    }
}

impl StoreReader {
    pub fn cordon(&self) -> Result<Option<CordonRecord>, StoreError> {
        // A reader may meet a store the daemon has not migrated yet (schema 6 added it).
        let version: i64 = self
            .conn()
            .pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version < 6 {
            return Ok(None);
        }
        cordon(self.conn())
    }
}

fn cordon(conn: &Connection) -> Result<Option<CordonRecord>, StoreError> {
    Ok(conn
        .query_row(
            "SELECT holder, cordoned, since, progress FROM cordon WHERE id = 1",
            [],
            |r| {
                Ok(CordonRecord {
                    holder: r.get(0)?,
                    cordoned: r.get(1)?,
                    since: Timestamp::from_millis(r.get(2)?),
                    progress: r.get(3)?,
                })
            },
        )
        .optional()?)
}
