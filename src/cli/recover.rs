//! `flexnode recover-agent-upgrade`: run by `flexnode-agent-recovery.service` (the agent
//! unit's `OnFailure=`) from the last-good build when the agent keeps failing. Without a
//! pending upgrade it does nothing: a plain crash never swaps builds.

use super::{Failure, wiring};
use crate::config::CONFIG_PATH;
use crate::exec::Fed;
use crate::lifecycle::{Input, NodeState};
use std::path::Path;
use std::process::ExitCode;

pub use crate::lifecycle::input::RECOVERY_MESSAGE;

pub fn run(state: &Path, message: &str) -> ExitCode {
    super::block_on("recover-agent-upgrade", recover(state, message))
}

async fn recover(state: &Path, message: &str) -> Result<(), Failure> {
    wiring::require_root("recover-agent-upgrade")?;
    // A store it cannot read says nothing about an upgrade: nothing is switched on a guess.
    let current = wiring::current_state(state).map_err(|e| wiring::store_failure(e, state))?;
    if !matches!(current, Some(NodeState::Upgrading { .. })) {
        println!("flexnode: no agent upgrade is pending; nothing to recover");
        return Ok(());
    }
    let (config, client) = wiring::installed_config(Path::new(CONFIG_PATH)).await?;
    let fx = wiring::host_effects(&config).await?;
    let mut runner =
        wiring::agent_command_runner(state, &config.node_name, client, fx, wiring::Resume::First)
            .await?;
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
