//! Store batteries: implementations of the `AuditStore`, `RunIndex`,
//! `BudgetLedger`, `Checkpointer`, `SessionStore` and `WriteIntents`
//! (parked git writes of skills' memory) ports. In memory (a host built with nothing), and on
//! embedded SQLite (the CLI's default; full history, budgets that hold
//! across processes). Postgres comes with the multi-host work. Stores know
//! nothing of actors.

pub mod memory;
pub mod memory_checkpoint;
pub mod memory_session;
pub mod memory_writeback;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
pub use memory_checkpoint::MemoryCheckpointer;
pub use memory_session::MemorySessionStore;
pub use memory_writeback::MemoryWriteIntents;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, StoreError};
