//! Run with: cargo run --example hello
//!
//! Build a host with the embedded defaults, submit one run, print its result.

use agentvisor::{AgentSpec, Host, Invocation};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let host = Host::builder().build().await?;
    let spec = AgentSpec::from_file("examples/agents/hello.yaml")?;
    let result = host
        .submit(spec, Invocation::prompt("Add 2 and 3."))
        .await?
        .await;
    println!("{} → {}", result.status, result.output.unwrap_or_default());
    println!("{}", serde_json::to_string_pretty(&result.steps)?);
    host.shutdown().await;
    Ok(())
}
