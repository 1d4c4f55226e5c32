//! The `agentvisor` binary as the command-line tests run it.

use std::process::{Command, Output};

use serde_json::Value;

/// The binary with `args`, run from the crate's directory, with no
/// database taken from the environment.
pub(crate) fn command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_agentvisor"));
    c.args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("AGENTVISOR_DB");
    c
}

/// Runs the binary with `args` to its end.
pub(crate) fn agentvisor(args: &[&str]) -> Output {
    command(args).output().expect("the binary runs")
}

/// The JSON a command that exited 0 printed (the test fails with its
/// stderr otherwise).
pub(crate) fn ok_json(out: &Output) -> Value {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
