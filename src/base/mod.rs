//! Base types every layer may use: caught panics and secret redaction.
//! They import nothing of the crate.

pub mod panics;
pub mod secrets;
