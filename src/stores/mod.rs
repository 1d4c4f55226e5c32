//! Store batteries: implementations of the `AuditStore`, `RunIndex`,
//! `BudgetLedger`, `Checkpointer`, `SessionStore`, `OutboxStore`,
//! `ScheduleStore` and `WriteIntents` (parked git writes of skills' memory) ports. In memory (a host built with nothing), and on
//! embedded SQLite (the CLI's default; full history, budgets that hold
//! across processes), and on PostgreSQL (the `postgres` feature: the audit
//! log, run index, budget ledger, checkpoints with their leases, and
//! sessions, for many hosts on one database).
//! Stores know nothing
//! of actors.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod checkpoint_parts;
pub mod memory;
pub mod memory_checkpoint;
pub mod memory_outbox;
pub mod memory_schedule;
pub mod memory_session;
pub mod memory_writeback;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
pub use memory_checkpoint::MemoryCheckpointer;
pub use memory_outbox::MemoryOutbox;
pub use memory_schedule::MemoryScheduleStore;
pub use memory_session::MemorySessionStore;
pub use memory_writeback::MemoryWriteIntents;
#[cfg(feature = "postgres")]
pub use postgres::{PostgresError, PostgresStore};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, StoreError};
