//! The node image chosen for each side (`state/0005_machine_images.sql`).

use super::{Store, StoreError, StoreReader};
use crate::lifecycle::Timestamp;
use crate::lifecycle::state::Side;
use rusqlite::{Connection, OptionalExtension, params};

/// A side's node image as chosen for a goal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineImage {
    pub generation: i64,
    pub kubernetes_version: String,
    /// `registry/repository[:tag]@sha256:…`, as chosen.
    pub reference: String,
    /// The hex digest.
    pub digest: String,
    pub chosen_at: Timestamp,
}

impl Store {
    /// Records the image chosen for `side` (replacing the one before).
    pub fn record_machine_image(&self, side: Side, image: &MachineImage) -> Result<(), StoreError> {
        self.conn().execute(
            "INSERT INTO machine_images
                 (side, generation, kubernetes_version, reference, digest, chosen_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT(side) DO UPDATE SET generation = ?2, kubernetes_version = ?3,
                 reference = ?4, digest = ?5, chosen_at = ?6",
            params![
                side.name(),
                image.generation,
                image.kubernetes_version,
                image.reference,
                image.digest,
                image.chosen_at.millis()
            ],
        )?;
        Ok(())
    }

    pub fn machine_image(&self, side: Side) -> Result<Option<MachineImage>, StoreError> {
        machine_image(&self.conn(), side)
    }

    /// Every side's choice forgotten (the node wiped).
    pub fn forget_machine_images(&self) -> Result<(), StoreError> {
        self.conn().execute("DELETE FROM machine_images", [])?;
        Ok(())
    }
}

impl StoreReader {
    pub fn machine_image(&self, side: Side) -> Result<Option<MachineImage>, StoreError> {
        machine_image(self.conn(), side)
    }
}

fn machine_image(conn: &Connection, side: Side) -> Result<Option<MachineImage>, StoreError> {
    // A reader may meet a store the daemon has not migrated yet (schema 5 added the table).
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version < 5 {
        return Ok(None);
    }
    Ok(conn
        .query_row(
            "SELECT generation, kubernetes_version, reference, digest, chosen_at
             FROM machine_images WHERE side = ?1",
            params![side.name()],
            |r| {
                Ok(MachineImage {
                    generation: r.get(0)?,
                    kubernetes_version: r.get(1)?,
                    reference: r.get(2)?,
                    digest: r.get(3)?,
                    chosen_at: Timestamp::from_millis(r.get(4)?),
                })
            },
        )
        .optional()?)
}
