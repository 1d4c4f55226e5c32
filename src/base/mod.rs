//! Base types every layer may use: caught panics, secret redaction, and
//! the TLS of outbound HTTP clients.
//! They import nothing of the crate.

pub mod panics;
pub mod secrets;
#[cfg(any(feature = "openai", feature = "anthropic", feature = "publishers"))]
pub(crate) mod tls;
