//! The library's facade: the `host` (build one, submit runs, recover,
//! shut down) and the `handle`s a caller holds on a run. Everything above
//! it (orchestration, the CLI, the server) goes through it; nothing below
//! it (actors, kernel, ports, batteries) imports it.

mod builtins;
pub mod handle;
pub mod host;
