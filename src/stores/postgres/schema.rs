//! The PostgreSQL schema and its migrations.

use super::{described, PostgresError, PostgresStore};

/// The schema version this build writes.
pub const SCHEMA_VERSION: i32 = 6;

/// Every migration, by the version it brings the schema to.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        include_str!("../../../migrations/postgres/0001_audit.sql"),
    ),
    (
        2,
        include_str!("../../../migrations/postgres/0002_budget.sql"),
    ),
    (
        3,
        include_str!("../../../migrations/postgres/0003_checkpoints.sql"),
    ),
    (
        4,
        include_str!("../../../migrations/postgres/0004_sessions.sql"),
    ),
    (
        5,
        include_str!("../../../migrations/postgres/0005_queue.sql"),
    ),
    (
        6,
        include_str!("../../../migrations/postgres/0006_outbox_schedules.sql"),
    ),
];

/// A fixed key for `pg_advisory_xact_lock`: hosts that start together
/// migrate one after the other, the later ones finding nothing to do.
const MIGRATION_LOCK: i64 = 0x6167_656e_7476_6973; // "agentvis"

/// Brings the database's schema to [`SCHEMA_VERSION`], in one transaction.
pub(super) async fn migrate(store: &PostgresStore) -> Result<(), PostgresError> {
    let target = store.target.clone();
    let connect = |reason: String| PostgresError::Connect {
        target: target.clone(),
        reason: crate::secrets::redact_string(reason),
    };
    let mut client = store.client().await.map_err(connect)?;
    let tx = client
        .transaction()
        .await
        .map_err(|e| connect(described(&e)))?;
    let step = |version: i32, e: tokio_postgres::Error| PostgresError::Migrate {
        target: target.clone(),
        version,
        reason: described(&e),
    };
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| step(0, e))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS agentvisor_schema \
         (version INTEGER NOT NULL PRIMARY KEY, applied_at BIGINT NOT NULL)",
    )
    .await
    .map_err(|e| step(0, e))?;
    let at: i32 = tx
        .query_one(
            "SELECT COALESCE(MAX(version), 0) FROM agentvisor_schema",
            &[],
        )
        .await
        .map_err(|e| step(0, e))?
        .get(0);
    if at > SCHEMA_VERSION {
        return Err(PostgresError::NewerSchema {
            target: target.clone(),
            found: at,
            supported: SCHEMA_VERSION,
        });
    }
    for &(version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > at) {
        tx.batch_execute(sql).await.map_err(|e| step(version, e))?;
        let now = crate::ports::run::unix_ms() as i64;
        tx.execute(
            "INSERT INTO agentvisor_schema (version, applied_at) VALUES ($1, $2)",
            &[&version, &now],
        )
        .await
        .map_err(|e| step(version, e))?;
    }
    tx.commit().await.map_err(|e| step(SCHEMA_VERSION, e))?;
    Ok(())
}
