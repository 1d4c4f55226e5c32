//! Store batteries: implementations of the `AuditStore`, `RunIndex` and
//! `BudgetLedger` ports. In memory (a host built with nothing), and on
//! embedded SQLite (the CLI's default; full history, budgets that hold
//! across processes). Postgres comes with the multi-host work. Stores know
//! nothing of actors.

pub mod memory;
pub mod sqlite;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
pub use sqlite::{SqliteStore, StoreError};
