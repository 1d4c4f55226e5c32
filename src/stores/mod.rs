//! Store batteries: implementations of the `AuditStore` and `BudgetLedger`
//! ports. In memory today; SQLite (the embedded default) and Postgres come
//! with the persistence work. Stores know nothing of actors.

pub mod memory;

pub use memory::{MemoryAuditStore, MemoryBudgetLedger};
