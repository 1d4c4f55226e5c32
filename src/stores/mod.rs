//! Store batteries: implementations of the `AuditStore`, `RunIndex`,
//! `BudgetLedger` and `Checkpointer` ports. In memory (a host built with nothing), and on
//! embedded SQLite (the CLI's default; full history, budgets that hold
//! across processes). Postgres comes with the multi-host work. Stores know
//! nothing of actors.

pub mod memory;
pub mod memory_checkpoint;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
pub use memory_checkpoint::MemoryCheckpointer;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, StoreError};
