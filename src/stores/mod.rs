//! Store batteries: implementations of the `AuditStore`, `RunIndex`,
//! `BudgetLedger`, `Checkpointer`, `SessionStore`, `OutboxStore`,
//! `ScheduleStore` and `WriteIntents` (parked git writes of skills' memory) ports. In memory (a host built with nothing), and on
//! embedded SQLite (the CLI's default; full history, budgets that hold
//! across processes), and on PostgreSQL (the `postgres` feature: the audit
//! log, run index, budget ledger, checkpoints with their leases, and
//! sessions, for many hosts on one database).
//! The `RunQueue` port's batteries are here too: in memory, on PostgreSQL
//! (`postgres`) and on NATS JetStream (the `nats` feature, `nats_queue`).
//! Stores know nothing
//! of actors.

#[cfg(any(feature = "sqlite", feature = "postgres"))]
mod checkpoint_parts;
pub mod memory;
pub mod memory_checkpoint;
pub mod memory_outbox;
pub mod memory_queue;
pub mod memory_schedule;
pub mod memory_session;
pub mod memory_writeback;
#[cfg(feature = "nats")]
pub mod nats_queue;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
pub use memory_checkpoint::MemoryCheckpointer;
pub use memory_outbox::MemoryOutbox;
pub use memory_queue::MemoryQueue;
pub use memory_schedule::MemoryScheduleStore;
pub use memory_session::MemorySessionStore;
pub use memory_writeback::MemoryWriteIntents;
#[cfg(feature = "nats")]
pub use nats_queue::{NatsQueue, NatsQueueConfig};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresError, PostgresQueue, PostgresStore};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, StoreError};
