//! What the commands that run agents keep in the database: `--retain`
//! (which finished runs stay: `max_age=7d,max_runs=N,max_bytes=SIZE`; the
//! oldest beyond are pruned in the background) and `--audit` (how much of
//! each run: `full` or `summary`). A bad value exits 2, naming the flag.

use clap::Args;

use agentvisor::ports::audit::AuditDetail;
use agentvisor::ports::retention::Retention;

/// Flags of `run`, `swarm`, `soak` and `serve` about what is kept.
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct KeepArgs {
    /// Which finished runs the database keeps: any of `max_age=DURATION`
    /// (`7d`, `12h`), `max_runs=N`, `max_bytes=SIZE` (`500MB`, `2GiB`),
    /// comma-separated. The oldest finished runs beyond are pruned in the
    /// background; runs in flight, checkpointed or waiting for approval
    /// never are. Default: everything is kept.
    #[arg(long, value_name = "POLICY", value_parser = retain_flag)]
    pub(crate) retain: Option<Retention>,
    /// How much of each run the audit log keeps, for manifests without an
    /// `audit:` key: `full` (every event; the default) or `summary` (the
    /// run's start, result, critic decisions, approvals, errors and
    /// warnings; not the step events: `replay` needs `full`).
    #[arg(long, value_name = "DETAIL", value_parser = audit_flag)]
    pub(crate) audit: Option<AuditDetail>,
}

/// `--audit`: `full` or `summary`.
fn audit_flag(s: &str) -> Result<AuditDetail, String> {
    s.parse::<AuditDetail>()
}

/// `--retain`: a retention policy.
fn retain_flag(s: &str) -> Result<Retention, String> {
    s.parse::<Retention>().map_err(|e| e.to_string())
}
