//! A whole simulated node: the real executor, core and store against the simulated host,
//! with the agent process lifecycle (restarts, crash loops, the recovery unit) modelled the
//! way systemd would drive it. Used by the simulation tests and the README's first command.

use super::host::SimHost;
use crate::config::NodeImage;
use crate::effects::Effects;
use crate::exec::{Clock, ExecError, Fed, Runner};
use crate::machine::agent::{AgentBuild, InstallMode, Slot};
use crate::machine::agent::{Arch, Sha256Hex};
use crate::machine::input::{Claim, ClaimKind, JoinRequest};
use crate::machine::state::{Goal, OpRef};
use crate::machine::{Input, NodeState, Timestamp};
use crate::store::Store;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// A clock the simulation moves by hand; every reading advances it by one second so journal
/// entries keep their order.
#[derive(Clone, Debug)]
pub struct SimClock(Arc<AtomicI64>);

impl SimClock {
    pub fn starting_at(t: Timestamp) -> Self {
        Self(Arc::new(AtomicI64::new(t.millis())))
    }

    pub fn advance_secs(&self, secs: i64) {
        self.0.fetch_add(secs * 1000, Ordering::SeqCst);
    }

    /// The time without advancing it (what the simulated host sees).
    pub fn peek(&self) -> Timestamp {
        Timestamp::from_millis(self.0.load(Ordering::SeqCst))
    }
}

impl Clock for SimClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.0.fetch_add(1000, Ordering::SeqCst))
    }
}

pub type SimRunner = Runner<SimHost, SimHost, SimHost, SimHost, SimClock>;

pub use crate::machine::input::RECOVERY_MESSAGE;

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("the agent crash-loops and no upgrade is pending: the recovery unit does nothing")]
    CrashLoop,
    #[error("no agent build is selected to run")]
    NoAgent,
    #[error("gave up after {0} simulated crashes")]
    TooManyCrashes(u32),
}

/// The Kubernetes version a simulated join's goal names.
pub const GOAL_VERSION: &str = "v1.34.2";

#[derive(Debug)]
pub struct SimNode {
    pub host: SimHost,
    pub clock: SimClock,
    pub path: PathBuf,
    runner: Option<SimRunner>,
    /// Simulated process deaths so far.
    pub crashes: u32,
    /// Of those, deaths of the agent daemon after which systemd started the agent again: each
    /// is a restart of the agent, which an interrupted restart effect may count as done.
    pub daemon_restarts: u32,
    /// The configuration's node images, given to every process's executor.
    pub node_images: BTreeMap<String, NodeImage>,
}

impl SimNode {
    pub fn new(path: &Path, start: Timestamp) -> Self {
        let clock = SimClock::starting_at(start);
        let mut host = SimHost::new();
        let tick = clock.clone();
        host.set_time_source(move || tick.peek());
        Self {
            host,
            clock,
            path: path.to_path_buf(),
            runner: None,
            crashes: 0,
            daemon_restarts: 0,
            node_images: BTreeMap::new(),
        }
    }

    /// The current agent process, opening the store as a new process would. A process of the
    /// same test binary that another test forks may briefly hold a copy of the lock the
    /// previous runner dropped (until it execs), so a locked store is retried for a while.
    pub fn runner(&mut self) -> Result<&mut SimRunner, ExecError> {
        if self.runner.is_none() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            let store = loop {
                match Store::open(&self.path) {
                    Err(crate::store::StoreError::Locked(_))
                        if std::time::Instant::now() < deadline =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    other => break other?,
                }
            };
            let fx = Effects {
                systemd: self.host.clone(),
                containerd: self.host.clone(),
                host: self.host.clone(),
                publisher: self.host.clone(),
            };
            let mut runner = Runner::new(store, fx, self.clock.clone());
            runner.node_images = self.node_images.clone();
            self.runner = Some(runner);
        }
        self.runner.as_mut().ok_or(ExecError::Crashed)
    }

    /// The process ends (store closed, lock released).
    pub fn stop_process(&mut self) {
        self.runner = None;
    }

    fn sync_clock(&self) {
        self.host.world().now = self.clock.peek();
    }

    /// Feeds an input; when the process dies mid-way, systemd restarts the agent and the new
    /// process resumes (the input itself was persisted before its effects ran).
    pub async fn feed(&mut self, input: Input) -> Result<Fed, SimError> {
        self.sync_clock();
        match self.runner()?.feed(input).await {
            Ok(fed) => Ok(self.daemon_went_on(fed)),
            Err(ExecError::Crashed) => {
                self.died();
                // The agent's process is gone: its unit is not active until systemd starts it.
                self.host.agent_exited();
                if self.host.selected_build().is_some() {
                    self.daemon_restarts += 1;
                    self.boot().await
                } else {
                    // No agent left to restart (a reset was uninstalling): the operator's next
                    // `flexnode reset` or `join` finishes what was interrupted.
                    self.cli_resume().await
                }
            }
            Err(e) => Err(e.into()),
        }
    }

    /// A CLI process opens the store and finishes an interrupted step.
    pub async fn cli_resume(&mut self) -> Result<Fed, SimError> {
        self.stop_process();
        let runner = self.runner()?;
        runner.daemon = false;
        runner.resume().await?;
        let state = runner.state()?;
        self.stop_process();
        Ok(Fed::Accepted(Box::new(state)))
    }

    /// A reset ends the daemon process: its unit goes inactive (and, without its file, away).
    fn daemon_went_on(&mut self, fed: Fed) -> Fed {
        if matches!(&fed, Fed::Accepted(s) if matches!(**s, NodeState::Unjoined { .. })) {
            self.host.agent_exited();
            self.stop_process();
        }
        fed
    }

    fn died(&mut self) {
        self.crashes += 1;
        self.runner = None;
    }

    /// systemd starts the agent unit: the selected build runs. A crashing build fails until
    /// the start limit trips and the recovery unit runs the last-good build's
    /// `recover-agent-upgrade`, which restores it and restarts the agent.
    pub async fn boot(&mut self) -> Result<Fed, SimError> {
        for _ in 0..32 {
            self.sync_clock();
            let (running, build) = self.host.selected_build().ok_or(SimError::NoAgent)?;
            self.stop_process();
            if build.crashes {
                self.recover().await?;
                continue;
            }
            self.host.agent_started();
            match self.runner()?.start(running).await {
                Ok(fed) => return Ok(self.daemon_went_on(fed)),
                Err(ExecError::Crashed) => {
                    self.died();
                    self.daemon_restarts += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(SimError::TooManyCrashes(self.crashes))
    }

    /// The recovery unit: `recover-agent-upgrade` of the last-good build. It is not the agent
    /// daemon, so an interrupted restart of the agent is finished, not skipped.
    async fn recover(&mut self) -> Result<(), SimError> {
        loop {
            self.stop_process();
            let runner = self.runner()?;
            runner.daemon = false;
            let fed = runner
                .feed(Input::RecoveryRequested {
                    message: RECOVERY_MESSAGE.into(),
                })
                .await;
            match fed {
                Ok(Fed::Accepted(_) | Fed::Refused(_)) => {
                    self.stop_process();
                    let still_crashing = self.host.selected_build().is_none_or(|(_, b)| b.crashes);
                    return if still_crashing {
                        Err(SimError::CrashLoop)
                    } else {
                        Ok(())
                    };
                }
                Err(ExecError::Crashed) => self.died(),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Fires pending restart timers: the old daemon is killed and the selected build starts.
    pub async fn settle(&mut self) -> Result<(), SimError> {
        loop {
            let timers = std::mem::take(&mut self.host.world().restart_timers);
            if timers.is_empty() {
                return Ok(());
            }
            self.clock.advance_secs(1);
            self.boot().await?;
        }
    }

    pub async fn join(&mut self, mode: InstallMode, node: &str) -> Result<Fed, SimError> {
        let agent = match mode {
            InstallMode::Host => AgentBuild::Slot { slot: Slot::Blue },
            InstallMode::Container => AgentBuild::Image {
                digest: Sha256Hex::parse(INSTALLED_IMAGE).ok_or(SimError::NoAgent)?,
            },
        };
        let fed = self
            .feed(Input::Join(JoinRequest {
                node_name: node.into(),
                mode,
                arch: Arch::Amd64,
                goal: Goal {
                    generation: 1,
                    kubernetes_version: GOAL_VERSION.into(),
                },
                agent,
            }))
            .await?;
        self.stop_process();
        Ok(fed)
    }

    pub async fn claim(&mut self, uid: &str, kind: ClaimKind) -> Result<Fed, SimError> {
        self.feed(Input::OperationClaimed(Claim {
            op: OpRef {
                name: format!("op-{uid}"),
                uid: uid.into(),
            },
            kind,
            machine_generation: 1,
        }))
        .await
    }
}

/// The digest of the image a simulated container install starts from.
pub const INSTALLED_IMAGE: &str =
    "1111111111111111111111111111111111111111111111111111111111111111";

pub fn upgrade(url: &str, sha256: &str) -> ClaimKind {
    ClaimKind::AgentUpgrade {
        parameters: [
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), sha256.to_string()),
        ]
        .into_iter()
        .collect(),
    }
}
