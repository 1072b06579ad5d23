//! `flexnode reset --yes` (also what `flexnode-reset.service` runs): the agent is stopped
//! (it holds the store), then the core resets the node as it does for AgentReset: results
//! of interrupted operations are published first, then machines, runtime files, units and
//! links go. The installed builds stay under `/opt/flexnode/lib` for a re-join. A store that
//! is damaged, newer than this build or missing on an installed host is set aside (never
//! deleted) and the same things are removed without it: the operator's way out of a store the
//! agent refuses to guess at.

use super::wiring::Resume;
use super::{EXIT_USAGE, Failure, wiring};
use crate::config::CONFIG_PATH;
use crate::effects::{AGENT_UNIT, Systemd};
use crate::exec::Fed;
use crate::lifecycle::fault::{Fault, FaultKind};
use crate::lifecycle::{Input, NodeState};
use crate::store::fault::of_store;
use std::path::{Path, PathBuf};
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
    super::block_on("reset", reset(state))
}

async fn reset(state: &Path) -> Result<(), Failure> {
    wiring::require_root("reset")?;
    let damaged = match wiring::current_state(state) {
        Ok(Some(NodeState::Unjoined { .. })) => {
            println!("flexnode: this host is not joined; nothing to reset");
            return Ok(());
        }
        Ok(Some(_)) => None,
        Ok(None) if !wiring::on_host(&format!("/etc/systemd/system/{AGENT_UNIT}")).exists() => {
            println!("flexnode: this host is not joined; nothing to reset");
            return Ok(());
        }
        Ok(None) => Some(Fault::new(FaultKind::StoreMissing, state, "")),
        Err(e) => match of_store(&e, state) {
            Some(fault) if fault.kind.needs_operator() => Some(fault),
            _ => return Err(wiring::store_failure(e, state)),
        },
    };
    let (config, client) = wiring::installed_config(Path::new(CONFIG_PATH)).await?;
    let fx = wiring::host_effects(&config).await?;
    // The agent holds the store; what it was doing is finished as interrupted by the reset.
    fx.systemd.stop(AGENT_UNIT).await?;
    if let Some(fault) = damaged {
        println!("flexnode: {fault}");
        if let Some(aside) = set_aside(state)? {
            println!(
                "flexnode: the store is set aside as {} (kept for inspection)",
                aside.display()
            );
        }
        // A new, empty store: the re-join's.
        let mut runner =
            wiring::agent_command_runner(state, &config.node_name, client, fx, Resume::First)
                .await?;
        runner
            .reset_without_state()
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        println!(
            "flexnode: {} reset without its store; operations it was running are not \
             published (their outcome is unknown): delete or re-create them",
            config.node_name
        );
        return Ok(());
    }
    // A drain the agent was running is superseded, not waited for.
    let mut runner =
        wiring::agent_command_runner(state, &config.node_name, client, fx, Resume::ByFirstInput)
            .await?;
    let started = Instant::now();
    let mut input = Input::ResetRequested;
    loop {
        if let Fed::Refused(r) = runner.feed(input).await? {
            tracing::debug!(refusal = %r, "reset input refused");
        }
        match runner.state()? {
            NodeState::Unjoined { .. } => break,
            other => {
                if started.elapsed() >= RESET_LIMIT {
                    return Err(Failure::failed(format!(
                        "reset did not finish within {} s (state {other})",
                        RESET_LIMIT.as_secs()
                    )));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        input = Input::Tick;
    }
    // What the reset could not publish in its time stays in the store for a later daemon;
    // one more try before the command ends.
    runner.flush_outbox().await?;
    println!(
        "flexnode: {} reset; no flexnode unit, link or runtime file is left (installed builds \
         stay under /opt/flexnode/lib for a re-join)",
        config.node_name
    );
    Ok(())
}

/// Renames the store (and its WAL and index) to `<store>.damaged-<ms since the epoch>`; the
/// new name, or `None` when there was no store.
fn set_aside(state: &Path) -> anyhow::Result<Option<PathBuf>> {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let suffixed = |p: &Path, s: &str| {
        let mut o = p.as_os_str().to_owned();
        o.push(s);
        PathBuf::from(o)
    };
    let aside = suffixed(state, &format!(".damaged-{ms}"));
    let mut moved = false;
    for part in ["", "-wal", "-shm"] {
        let from = suffixed(state, part);
        if from.exists() {
            std::fs::rename(&from, suffixed(&aside, part))?;
            moved = true;
        }
    }
    if let Some(dir) = state.parent() {
        crate::effects::fs::sync_existing_dir(dir)?;
    }
    Ok(moved.then_some(aside))
}
