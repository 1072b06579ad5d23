//! Each effect as calls on the effects traits. Every arm first probes whether its effect
//! already happened, so running an interrupted step again finishes it instead of repeating it.

use super::{Clock, Runner};
use crate::effects::{
    AGENT_UNIT, BOOTSTRAP_UNIT, Containerd, EffectError, EffectResult, Host, Publisher,
    RECOVERY_UNIT, RESET_UNIT, Systemd, machine_unit,
};
use crate::lifecycle::agent::{AgentBuild, InstallMode, UpgradeTarget};
use crate::lifecycle::state::Side;
use crate::lifecycle::{Effect, Timestamp};
use crate::store::StoreError;

pub(super) fn store_failed(e: StoreError) -> EffectError {
    EffectError::Failed(format!("store: {e}"))
}

/// `WriteUnits`: the install mode's units as this build ships them, dependencies first, then
/// one reload if anything changed; whether it reloaded. Also what `flexnode join` converges a
/// joined host with, and what the daemon does at every start (after judging a hand-off, so a
/// broken successor never rewrites the recovery unit).
pub async fn write_units(systemd: &impl Systemd, mode: InstallMode) -> EffectResult<bool> {
    let units = crate::units::for_mode(mode);
    let mut reload = false;
    for (name, contents) in units {
        reload |= systemd.write_unit(name, contents).await?;
    }
    // A crash between a write and the reload leaves systemd on the older text: probe it.
    for (name, _) in units {
        if reload {
            break;
        }
        reload = systemd.needs_reload(name).await?;
    }
    if reload {
        systemd.daemon_reload().await?;
    }
    Ok(reload)
}

/// `StartAgent`: enabled, and started without waiting (the agent waits for the store the
/// caller holds); starting a running agent changes nothing.
pub async fn start_agent(systemd: &impl Systemd) -> EffectResult {
    systemd.enable(AGENT_UNIT).await?;
    systemd.start_no_wait(AGENT_UNIT).await
}

impl<S, C, H, P, K> Runner<S, C, H, P, K>
where
    S: Systemd,
    C: Containerd,
    H: Host,
    P: Publisher,
    K: Clock,
{
    pub(super) async fn apply(
        &mut self,
        effect: &Effect,
        resumed: Option<Timestamp>,
    ) -> EffectResult {
        let fx = &self.effects;
        match effect {
            Effect::ReportProgress {
                op,
                message,
                machine_generation,
                started_at,
            } => {
                fx.publisher
                    .report_progress(op, message, *machine_generation, *started_at)
                    .await
            }
            // The result entered the outbox with the intent (`Store::begin_step`); delivery
            // may fail and is retried from there.
            Effect::PublishResult { op, .. } => self.deliver(op).await.or_else(|e| match e {
                EffectError::Crashed => Err(e),
                EffectError::Failed(message) => {
                    tracing::warn!(%op, %message, "result kept for re-publication");
                    Ok(())
                }
            }),
            Effect::AwaitPublished { op } => self.deliver(op).await,
            // Machine status is re-reported on later transitions; a miss is not fatal.
            Effect::ReportMachine {
                phase,
                message,
                observed_generation,
            } => match fx
                .publisher
                .report_machine(*phase, message, *observed_generation)
                .await
            {
                Err(EffectError::Failed(e)) => {
                    tracing::warn!(error = %e, "machine status not reported");
                    Ok(())
                }
                other => other,
            },
            Effect::InstallAgent { mode, build } => fx.host.install_agent(*mode, build).await,
            Effect::WriteUnits { mode } => write_units(&fx.systemd, *mode).await.map(drop),
            Effect::StartAgent => start_agent(&fx.systemd).await,
            Effect::DisableSwap => self.disable_swap().await,
            Effect::StageAgent { target, candidate } => self.stage_agent(target, candidate).await,
            Effect::DiscardCandidate { candidate } => self.discard_candidate(candidate).await,
            Effect::SwitchAgent {
                mode,
                to,
                last_good,
            } => {
                if fx.host.selected_agent(*mode).await?.as_ref() == Some(to) {
                    return Ok(());
                }
                fx.host.select_agent(*mode, to, last_good).await
            }
            // An agent restart is done once the agent unit started again after the intent. A
            // CLI process never resumes a scheduled restart: the old daemon already died.
            Effect::ScheduleAgentRestart { .. } if resumed.is_some() && !self.daemon => Ok(()),
            Effect::ScheduleAgentRestart { .. } | Effect::RestartAgent
                if self.agent_restarted_since(resumed).await? =>
            {
                Ok(())
            }
            Effect::ScheduleAgentRestart { delay_ms } => {
                fx.systemd.schedule_restart(AGENT_UNIT, *delay_ms).await?;
                self.restart_requested = true;
                Ok(())
            }
            Effect::RestartAgent => self.restart_agent().await,
            Effect::ProvisionMachine { side, goal } => self.provision_machine(*side, goal).await,
            Effect::StartMachine { side } => self.start_machine(*side).await,
            Effect::AwaitNode { side } => self.await_node(*side).await,
            Effect::StopMachine { side } => self.stop_machine(*side).await,
            Effect::RestartMachine { side, not_before } => {
                let status = fx.systemd.machine_status(*side).await?;
                if status.running && status.started_at.is_some_and(|t| t >= *not_before) {
                    return Ok(());
                }
                fx.systemd.restart(&machine_unit(*side)).await
            }
            Effect::RemoveMachine { side } => self.remove_machine(*side).await,
            Effect::Drain {
                run,
                holder,
                policy,
                until,
            } => self.drain(run.as_ref(), holder, policy, *until).await,
            Effect::Uncordon => self.uncordon().await,
            Effect::WipeNode => self.wipe_node().await,
            Effect::UninstallAgent => self.uninstall_agent().await,
        }
    }

    /// The fstab first: a crash after it still leaves no swap at the next boot.
    async fn disable_swap(&self) -> EffectResult {
        let fx = &self.effects;
        fx.host.comment_out_swap().await?;
        let units = fx.systemd.swap_units().await?;
        for unit in &units {
            fx.systemd.mask(unit).await?;
            fx.systemd.stop(unit).await?;
        }
        if units.is_empty() {
            return Ok(());
        }
        tracing::info!(?units, "swap off: units stopped and masked");
        fx.systemd.daemon_reload().await
    }

    /// The candidate fetched (an archive into its slot, an image pulled and named) and run
    /// once for its version.
    async fn stage_agent(
        &mut self,
        target: &UpgradeTarget,
        candidate: &AgentBuild,
    ) -> EffectResult {
        let now = self.clock.now();
        let fx = &self.effects;
        match target {
            UpgradeTarget::Archive { url, sha256 } => {
                fx.host.stage_archive(url, sha256, candidate).await?;
            }
            UpgradeTarget::Image { image, digest } => {
                if !fx.containerd.image_present(digest).await? {
                    fx.containerd.pull(&image.pinned(digest), digest).await?;
                }
                // Only images recorded here are ever removed; an image someone else
                // pulled stays theirs (containerd keeps their record).
                if fx.containerd.image_present(digest).await? {
                    self.store
                        .record_agent_image(digest.as_str(), &image.pinned(digest), now)
                        .map_err(store_failed)?;
                }
                fx.containerd.name_agent_image(digest).await?;
            }
        }
        let version = match candidate {
            AgentBuild::Slot { slot } => fx.host.check_candidate(*slot).await?,
            AgentBuild::Image { digest } => fx.containerd.check_image(digest).await?,
        };
        tracing::info!(%candidate, %version, "candidate staged");
        Ok(())
    }

    /// The candidate's files gone, and its image too when this agent pulled it.
    async fn discard_candidate(&mut self, candidate: &AgentBuild) -> EffectResult {
        let fx = &self.effects;
        fx.host.discard_candidate(candidate).await?;
        match candidate {
            AgentBuild::Image { digest }
                if self
                    .store
                    .is_agent_image(digest.as_str())
                    .map_err(store_failed)? =>
            {
                fx.containerd.remove_agent_image(digest).await?;
                self.store
                    .forget_agent_image(digest.as_str())
                    .map_err(store_failed)
            }
            AgentBuild::Image { .. } | AgentBuild::Slot { .. } => Ok(()),
        }
    }

    /// The restart matters, not the failed state: it goes ahead when resetting that fails.
    async fn restart_agent(&mut self) -> EffectResult {
        let fx = &self.effects;
        match fx.systemd.reset_failed(AGENT_UNIT).await {
            Err(EffectError::Failed(message)) => tracing::warn!(
                %message,
                "the agent's failed state was not reset; restarting it all the same"
            ),
            other => other?,
        }
        fx.systemd.restart_no_wait(AGENT_UNIT).await?;
        self.restart_requested = true;
        Ok(())
    }

    /// Enabled too, so the machine comes back when the host boots. The reload loads the
    /// machine's drop-in (`ProvisionMachine`): systemd does not count a new drop-in directory
    /// as a reload due, so one written before a crash would go unnoticed.
    async fn start_machine(&self, side: Side) -> EffectResult {
        let fx = &self.effects;
        let unit = machine_unit(side);
        fx.host.load_kernel_modules().await?;
        fx.systemd.enable(&unit).await?;
        if fx.systemd.machine_status(side).await?.running {
            return Ok(());
        }
        fx.systemd.daemon_reload().await?;
        fx.systemd.start(&unit).await
    }

    async fn wipe_node(&self) -> EffectResult {
        for side in [Side::Kube1, Side::Kube2] {
            self.remove_machine(side).await?;
        }
        // A node joined again (its Machine perhaps made anew at generation 1) chooses afresh.
        self.store.forget_machine_images().map_err(store_failed)?;
        if self.effects.host.runtime_present().await? {
            self.effects.host.wipe_runtime().await?;
        }
        Ok(())
    }

    /// The bootstrap unit goes first (it would re-join), the agent unit last.
    async fn uninstall_agent(&self) -> EffectResult {
        let fx = &self.effects;
        self.disable_unit(BOOTSTRAP_UNIT).await?;
        self.stop_unit(BOOTSTRAP_UNIT).await?;
        self.disable_unit(AGENT_UNIT).await?;
        for unit in [BOOTSTRAP_UNIT, RECOVERY_UNIT, RESET_UNIT, AGENT_UNIT] {
            if fx.systemd.unit_file_present(unit).await? {
                fx.systemd.remove_unit(unit).await?;
            }
        }
        fx.systemd.daemon_reload().await?;
        if fx.host.agent_links_present().await? {
            fx.host.remove_agent_links().await?;
        }
        // The daemon is the agent unit's process: a stop job would wait for its own death. It
        // exits once this step is recorded (the node is Unjoined then), which leaves the unit
        // inactive and, without its file, gone.
        if self.daemon {
            return Ok(());
        }
        self.stop_unit(AGENT_UNIT).await
    }

    /// The agent unit's current run began after `intent`: the restart happened (a daemon
    /// resuming this during its own start-up is that run, still starting).
    async fn agent_restarted_since(&self, intent: Option<Timestamp>) -> EffectResult<bool> {
        let Some(intent) = intent else {
            return Ok(false);
        };
        let since = self.effects.systemd.started_since(AGENT_UNIT).await?;
        Ok(since.is_some_and(|t| t >= intent))
    }

    async fn stop_unit(&self, unit: &str) -> EffectResult {
        if self.effects.systemd.active_since(unit).await?.is_none() {
            return Ok(());
        }
        self.effects.systemd.stop(unit).await
    }

    async fn disable_unit(&self, unit: &str) -> EffectResult {
        if !self.effects.systemd.is_enabled(unit).await? {
            return Ok(());
        }
        self.effects.systemd.disable(unit).await
    }

    async fn remove_machine(&self, side: Side) -> EffectResult {
        self.stop_machine(side).await?;
        // Also a tree without a marker (an unpack a crash cut short).
        if self.effects.host.machine_tree_exists(side).await? {
            self.effects.host.remove_machine(side).await?;
        }
        self.remove_machine_drop_in(side).await
    }

    /// A stopped side stays down at the next boot too (after a rollback the broken side would
    /// otherwise start beside the good one) and keeps no failed state: its failure is told in
    /// the Machine's condition and the journal.
    async fn stop_machine(&self, side: Side) -> EffectResult {
        let unit = machine_unit(side);
        self.disable_unit(&unit).await?;
        if self.effects.systemd.machine_status(side).await?.running {
            self.effects.systemd.stop(&unit).await?;
        }
        self.effects.systemd.reset_failed(&unit).await
    }

    /// Publishes a stored result unless it already reached the API server.
    async fn deliver(&self, op: &crate::lifecycle::state::OpRef) -> EffectResult {
        let stored = self
            .store
            .result_for(&op.uid)
            .map_err(store_failed)?
            .ok_or_else(|| EffectError::Failed(format!("no stored result for {op}")))?;
        if stored.published_at.is_some() {
            return Ok(());
        }
        self.effects
            .publisher
            .publish_result(op, &stored.result, stored.completed_at)
            .await?;
        self.store
            .mark_published(&op.uid, self.clock.now())
            .map_err(store_failed)?;
        let kind = if stored.kind.is_empty() {
            "Unknown"
        } else {
            &stored.kind
        };
        crate::metrics::operation_finished(kind, stored.result.reason.as_str());
        Ok(())
    }
}
