//! Ordered schema migrations under `state/`, applied by `PRAGMA user_version`.

use rusqlite::{Connection, TransactionBehavior};

/// Index `i` holds the SQL that takes the schema from version `i` to `i + 1`.
pub const MIGRATIONS: &[&str] = &[
    include_str!("../../state/0001_init.sql"),
    include_str!("../../state/0002_agent_images.sql"),
    include_str!("../../state/0003_node_seen.sql"),
    include_str!("../../state/0004_step_report.sql"),
    include_str!("../../state/0005_machine_images.sql"),
    include_str!("../../state/0006_cordon.sql"),
];

pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("the store has schema version {found}, newer than this flexnode knows ({known})")]
    TooNew { found: i64, known: i64 },
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
}

/// Applies the missing migrations in one immediate transaction: all or nothing.
pub fn migrate(conn: &mut Connection) -> Result<(), MigrationError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    apply(&tx)?;
    Ok(tx.commit()?)
}

/// Applies the missing migrations inside the caller's transaction (`tx`).
pub fn apply(tx: &Connection) -> Result<(), MigrationError> {
    let found: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > SCHEMA_VERSION {
        return Err(MigrationError::TooNew {
            found,
            known: SCHEMA_VERSION,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
    }
    Ok(())
}
