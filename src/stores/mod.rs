//! Store batteries: implementations of the `AuditStore`, `RunIndex`,
//! `BudgetLedger`, `Checkpointer`, `SessionStore` and `ScheduleStore` ports. In memory (a host built with nothing), and on
//! embedded SQLite (the CLI's default; full history, budgets that hold
//! across processes). Postgres comes with the multi-host work. Stores know
//! nothing of actors.

pub mod memory;
pub mod memory_checkpoint;
pub mod memory_schedule;
pub mod memory_session;
#[cfg(feature = "sqlite")]
pub mod sqlite;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
pub use memory_checkpoint::MemoryCheckpointer;
pub use memory_schedule::MemoryScheduleStore;
pub use memory_session::MemorySessionStore;
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, StoreError};
