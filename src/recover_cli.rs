//! `flexnode recover-agent-upgrade`: run by `flexnode-agent-recovery.service` (the agent
//! unit's `OnFailure=`) from the last-good build when the agent keeps failing. Without a
//! pending upgrade it does nothing: a plain crash never swaps builds.

use crate::config::CONFIG_PATH;
use crate::exec::Fed;
use crate::machine::{Input, NodeState};
use crate::node_host;
use std::path::Path;
use std::process::ExitCode;

pub const RECOVERY_MESSAGE: &str = "upgraded daemon failed repeatedly; restored last-good agent";

pub fn run(state: &Path, message: &str) -> ExitCode {
    crate::cli::block_on("recover-agent-upgrade", recover(state, message))
}

async fn recover(state: &Path, message: &str) -> anyhow::Result<()> {
    node_host::require_root("recover-agent-upgrade")?;
    if !matches!(
        node_host::current_state(state)?,
        Some(NodeState::Upgrading { .. })
    ) {
        println!("flexnode: no agent upgrade is pending; nothing to recover");
        return Ok(());
    }
    let (config, client) = node_host::installed_config(Path::new(CONFIG_PATH)).await?;
    let fx = node_host::effects().await?;
    let mut runner = node_host::command_runner(state, &config.node_name, client, fx).await?;
    let message: String = message
        .lines()
        .next()
        .unwrap_or(RECOVERY_MESSAGE)
        .chars()
        .take(256)
        .collect();
    match runner.feed(Input::RecoveryRequested { message }).await? {
        Fed::Accepted(s) => println!("flexnode: recovery done; node is {s}"),
        Fed::Refused(r) => println!("flexnode: nothing to recover: {r}"),
    }
    Ok(())
}
