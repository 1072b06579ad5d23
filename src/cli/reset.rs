//! `flexnode reset --yes` (also what `flexnode-reset.service` runs): the agent is stopped
//! (it holds the store), then the core resets the node as it does for AgentReset: results
//! of interrupted operations are published first, then machines, runtime files, units and
//! links go. The installed builds stay under `/opt/flexnode/lib` for a re-join.

use super::{EXIT_USAGE, wiring};
use crate::config::CONFIG_PATH;
use crate::effects::{AGENT_UNIT, Systemd};
use crate::exec::Fed;
use crate::machine::{Input, NodeState};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// The core bounds its wait for publication; this only guards against a wedged API client.
const RESET_LIMIT: Duration = Duration::from_secs(600);

pub fn run(state: &Path, yes: bool) -> ExitCode {
    if !yes {
        eprintln!(
            "flexnode reset removes this node's machines, runtime files, units and links and \
             stops the agent; run `flexnode reset --yes` to do it"
        );
        return ExitCode::from(EXIT_USAGE);
    }
    super::block_on("reset", async { Ok(reset(state).await?) })
}

async fn reset(state: &Path) -> anyhow::Result<()> {
    wiring::require_root("reset")?;
    match wiring::current_state(state)? {
        None | Some(NodeState::Unjoined { .. }) => {
            println!("flexnode: this host is not joined; nothing to reset");
            return Ok(());
        }
        Some(_) => {}
    }
    let (config, client) = wiring::installed_config(Path::new(CONFIG_PATH)).await?;
    let fx = wiring::host_effects(&config).await?;
    // The agent holds the store; what it was doing is finished as interrupted by the reset.
    fx.systemd.stop(AGENT_UNIT).await?;
    let mut runner = wiring::agent_command_runner(state, &config.node_name, client, fx).await?;
    let started = Instant::now();
    let mut input = Input::ResetRequested;
    loop {
        if let Fed::Refused(r) = runner.feed(input).await? {
            tracing::debug!(refusal = %r, "reset input refused");
        }
        match runner.state()? {
            NodeState::Unjoined { .. } => break,
            other => anyhow::ensure!(
                started.elapsed() < RESET_LIMIT,
                "reset did not finish within {} s (state {other})",
                RESET_LIMIT.as_secs()
            ),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        input = Input::Tick;
    }
    println!(
        "flexnode: {} reset; no flexnode unit, link or runtime file is left (installed builds \
         stay under /opt/flexnode/lib for a re-join)",
        config.node_name
    );
    Ok(())
}
