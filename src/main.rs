//! The `agentvisor` command line: run one agent, run a swarm of them.
//!
//! Exit codes: 0 when every run ended `ok`; 1 when a run ended otherwise;
//! 2 when the input was refused before any run (a bad manifest, a bad flag).
//! A closed stdout or stderr ends no command early (see `cli`'s output).
#![deny(clippy::print_stdout, clippy::print_stderr)]

mod cli;

use std::process::ExitCode;

use clap::Parser;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    cli::keep_tracing(cli::init_tracing());
    // A panic the kernel catches (a run's, a model's or a tool's) is one
    // warn line naming the run, not the default hook's message and trace.
    agentvisor::panics::install_quiet_hook();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            cli::write_line(
                true,
                format_args!("error: cannot start the async runtime: {e}"),
            );
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(cli::dispatch(args));
    // Spans still buffered are exported before the process exits.
    cli::finish_tracing();
    code
}
