//! A whole simulated node: the real executor, core and store against the simulated host,
//! with the agent process lifecycle (restarts, crash loops, the recovery unit) modelled the
//! way systemd would drive it. Used by the simulation tests and the README's first command.

use super::host::SimHost;
use super::world::{PlannedCrash, World};
use crate::config::NodeImages;
use crate::effects::Effects;
use crate::exec::{Clock, ExecError, Fed, Runner};
use crate::lifecycle::agent::{AgentBuild, InstallMode, Slot};
use crate::lifecycle::agent::{Arch, Sha256Hex};
use crate::lifecycle::input::{Claim, ClaimKind, JoinRequest};
use crate::lifecycle::state::{Goal, OpRef};
use crate::lifecycle::{Input, NodeState, Timestamp};
use crate::store::Store;
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

pub use crate::lifecycle::input::RECOVERY_MESSAGE;

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
    #[error("the agent died and stays down")]
    Down,
    #[error("the saved node: {0}")]
    Saved(String),
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
    pub node_images: NodeImages,
    /// The last process died for good: nothing restarts it until someone starts one.
    stays_down: bool,
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
            node_images: NodeImages::default(),
            stays_down: false,
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
            self.host.new_process();
            watch_commits(&store, &self.host)?;
            let fx = Effects {
                systemd: self.host.clone(),
                containerd: self.host.clone(),
                host: self.host.clone(),
                publisher: self.host.clone(),
            };
            let mut runner = Runner::new(store, fx, self.clock.clone());
            runner.set_node_images(self.node_images.clone());
            self.runner = Some(runner);
        }
        self.runner.as_mut().ok_or(ExecError::Crashed)
    }

    /// The process ends (store closed, lock released).
    pub fn stop_process(&mut self) {
        self.runner = None;
    }

    /// The running process's store, to read without opening another connection.
    pub fn store(&self) -> Option<&Store> {
        self.runner.as_ref().map(|r| r.store())
    }

    /// Whether an agent daemon process runs (not a CLI process, not none).
    pub fn daemon_running(&self) -> bool {
        self.runner.as_ref().is_some_and(|r| r.is_daemon())
    }

    fn sync_clock(&self) {
        self.host.world().now = self.clock.peek();
    }

    /// Whether the process the last call ran in died. If it did, it is gone (its store
    /// closed without clean-up) and the node stays down for the crash's `down_secs`.
    fn died(&mut self) -> bool {
        let Some(crash) = self.host.take_death() else {
            return false;
        };
        self.killed(crash);
        true
    }

    /// The process died at `crash` (in this process, or a real one SIGKILLed there): it is
    /// gone, and the node stays down for the crash's `down_secs`.
    pub fn killed(&mut self, crash: PlannedCrash) {
        self.crashes += 1;
        self.runner = None;
        self.stays_down = crash.down_secs.is_none();
        self.clock.advance_secs(crash.down_secs.unwrap_or(0));
        self.sync_clock();
    }

    /// Feeds an input to the daemon; when the process dies mid-way, systemd restarts the
    /// agent and the new process resumes (the input itself was persisted before its effects
    /// ran).
    pub async fn feed(&mut self, input: Input) -> Result<Fed, SimError> {
        self.sync_clock();
        let fed = self.runner()?.feed(input).await;
        if self.died() {
            return self.after_death().await;
        }
        let fed = self.daemon_went_on(fed?);
        // The daemon restarted its own unit (`RestartAgent`): systemd replaces it.
        if self.daemon_running() && std::mem::take(&mut self.host.world().agent_restart_due) {
            return self.restart_daemon().await;
        }
        Ok(fed)
    }

    /// A dead agent process is restarted by systemd; with no agent left to restart (a reset
    /// was uninstalling), the operator's next `flexnode reset` or `join` finishes what was
    /// interrupted.
    pub async fn after_death(&mut self) -> Result<Fed, SimError> {
        self.host.agent_exited();
        if self.stays_down {
            return Err(SimError::Down);
        }
        if self.host.selected_build().is_some() {
            self.daemon_restarts += 1;
            self.boot().await
        } else {
            self.cli_resume().await
        }
    }

    /// A CLI process opens the store and finishes an interrupted step (run again by the
    /// operator if it dies too).
    pub async fn cli_resume(&mut self) -> Result<Fed, SimError> {
        for _ in 0..32 {
            self.stop_process();
            self.sync_clock();
            let runner = self.runner()?;
            runner.set_daemon(false);
            // A command publishes what the store keeps, as the daemon does at its start.
            let resumed = match runner.resume().await {
                Ok(()) => runner.flush_outbox().await.map(drop),
                Err(e) => Err(e),
            };
            if self.died() {
                if self.stays_down {
                    return Err(SimError::Down);
                }
                continue;
            }
            resumed?;
            let state = self.runner()?.state()?;
            self.stop_process();
            return Ok(Fed::Accepted(Box::new(state)));
        }
        Err(SimError::TooManyCrashes(self.crashes))
    }

    /// A reset ends the daemon process: its unit goes inactive (and, without its file, away).
    fn daemon_went_on(&mut self, fed: Fed) -> Fed {
        if matches!(&fed, Fed::Accepted(s) if matches!(**s, NodeState::Unjoined { .. })) {
            self.host.agent_exited();
            self.stop_process();
        }
        fed
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
            let started = self.runner()?.start(running).await;
            if !self.died() {
                let started = self.daemon_went_on(started?);
                // It restarted its own unit onto the selected build: systemd replaces it.
                if !std::mem::take(&mut self.host.world().agent_restart_due) {
                    return Ok(started);
                }
                self.stop_process();
                self.host.agent_exited();
                continue;
            }
            self.host.agent_exited();
            if self.stays_down {
                return Err(SimError::Down);
            }
            self.daemon_restarts += 1;
            if self.host.selected_build().is_none() {
                return self.cli_resume().await;
            }
        }
        Err(SimError::TooManyCrashes(self.crashes))
    }

    /// systemd restarts the agent unit (an operator's `systemctl restart`, or a new boot).
    pub async fn restart_daemon(&mut self) -> Result<Fed, SimError> {
        self.stop_process();
        self.host.agent_exited();
        self.boot().await
    }

    /// The recovery unit runs (the agent unit failed repeatedly).
    pub async fn recovery_unit(&mut self) -> Result<(), SimError> {
        self.stop_process();
        self.host.agent_exited();
        self.recover().await
    }

    /// The recovery unit: `recover-agent-upgrade` of the last-good build. It is not the agent
    /// daemon, so an interrupted restart of the agent is finished, not skipped. A recovery
    /// that dies is run again (systemd's `OnFailure=` again).
    async fn recover(&mut self) -> Result<(), SimError> {
        for _ in 0..32 {
            self.stop_process();
            self.sync_clock();
            let runner = self.runner()?;
            runner.set_daemon(false);
            let fed = runner
                .feed(Input::RecoveryRequested {
                    message: RECOVERY_MESSAGE.into(),
                })
                .await;
            if self.died() {
                if self.stays_down {
                    return Err(SimError::Down);
                }
                continue;
            }
            fed?;
            self.stop_process();
            let still_crashing = self.host.selected_build().is_none_or(|(_, b)| b.crashes);
            return if still_crashing {
                Err(SimError::CrashLoop)
            } else {
                Ok(())
            };
        }
        Err(SimError::TooManyCrashes(self.crashes))
    }

    /// `flexnode reset --yes`: the agent unit is stopped, then a CLI process resets the node,
    /// ticking until it is Unjoined (run again by the operator if it dies).
    pub async fn cli_reset(&mut self) -> Result<Fed, SimError> {
        self.stop_process();
        self.host.agent_exited();
        for _ in 0..32 {
            self.stop_process();
            self.sync_clock();
            let runner = self.runner()?;
            runner.set_daemon(false);
            let mut input = Input::ResetRequested;
            let mut left = 16;
            let fed = loop {
                let fed = runner.feed(input).await;
                let unjoined = matches!(runner.state(), Ok(NodeState::Unjoined { .. }));
                left -= 1;
                if fed.is_err() || unjoined || left == 0 {
                    // One more try at what the reset could not publish in its time.
                    break match fed {
                        Ok(fed) => runner.flush_outbox().await.map(|_| fed),
                        Err(e) => Err(e),
                    };
                }
                input = Input::Tick;
            };
            if self.died() {
                if self.stays_down {
                    return Err(SimError::Down);
                }
                continue;
            }
            let fed = fed?;
            self.stop_process();
            return Ok(fed);
        }
        Err(SimError::TooManyCrashes(self.crashes))
    }

    /// Fires pending restart timers: the old daemon is killed and the selected build starts.
    pub async fn settle(&mut self) -> Result<(), SimError> {
        loop {
            let timers = std::mem::take(&mut self.host.world().restart_timers);
            // A timer whose agent was uninstalled since restarts nothing.
            if timers.is_empty() || self.host.selected_build().is_none() {
                return Ok(());
            }
            self.clock.advance_secs(1);
            self.boot().await?;
        }
    }

    /// A copy of this node in `path` (its store) as it is now, down to the running
    /// process's memory (whether it is the daemon, whether it asked for its own restart),
    /// to run something on without touching this one.
    pub fn fork(&self, path: &Path) -> Result<SimNode, SimError> {
        copy_store(&self.path, path)?;
        let mut node = SimNode::with(path, self.host.world().clone(), self.clock.peek());
        node.crashes = self.crashes;
        node.daemon_restarts = self.daemon_restarts;
        node.node_images = self.node_images.clone();
        node.start_process(self.process())?;
        Ok(node)
    }

    /// The node on disk in `dir` (the store file in its `state` folder, `world.json`), for another OS process to
    /// carry on from ([`SimNode::restore`]).
    pub fn save(&self, dir: &Path) -> Result<(), SimError> {
        copy_store(&self.path, &dir.join("state/state.db"))?;
        let saved = Saved {
            world: self.host.world().clone(),
            clock: self.clock.peek(),
            process: self.process(),
        };
        save_json(&dir.join("world.json"), &saved)
    }

    /// The world and clock as they were when a process stopped at a planned crash, written
    /// over what [`SimNode::save`] wrote (the store is as that process left it).
    pub fn save_world(dir: &Path, world: &World, clock: Timestamp) -> Result<(), SimError> {
        let saved = Saved {
            world: world.clone(),
            clock,
            process: None,
        };
        save_json(&dir.join("world.json"), &saved)
    }

    /// The node saved in `dir`, configured with `node_images`, its process (if one ran)
    /// started again with its memory.
    pub fn restore(dir: &Path, node_images: NodeImages) -> Result<SimNode, SimError> {
        let text = std::fs::read_to_string(dir.join("world.json"))
            .map_err(|e| SimError::Saved(e.to_string()))?;
        let saved: Saved =
            serde_json::from_str(&text).map_err(|e| SimError::Saved(e.to_string()))?;
        let mut node = SimNode::with(&dir.join("state/state.db"), saved.world, saved.clock);
        node.node_images = node_images;
        node.start_process(saved.process)?;
        Ok(node)
    }

    fn with(path: &Path, world: World, now: Timestamp) -> SimNode {
        let clock = SimClock::starting_at(now);
        let tick = clock.clone();
        SimNode {
            host: SimHost::with_world(world, move || tick.peek()),
            clock,
            path: path.to_path_buf(),
            runner: None,
            crashes: 0,
            daemon_restarts: 0,
            node_images: NodeImages::default(),
            stays_down: false,
        }
    }

    /// The running process's memory: whether it is the daemon, and whether it asked for its
    /// own restart.
    fn process(&self) -> Option<(bool, bool)> {
        self.runner
            .as_ref()
            .map(|r| (r.is_daemon(), r.restart_requested()))
    }

    fn start_process(&mut self, process: Option<(bool, bool)>) -> Result<(), SimError> {
        if let Some((daemon, restart_requested)) = process {
            let runner = self.runner()?;
            runner.set_daemon(daemon);
            runner.set_restart_requested(restart_requested);
        }
        Ok(())
    }

    /// `flexnode join` (a command, not the daemon), run again if it dies (the bootstrap unit
    /// restarts on failure).
    pub async fn join(&mut self, mode: InstallMode, node: &str) -> Result<Fed, SimError> {
        let agent = match mode {
            InstallMode::Host => AgentBuild::Slot { slot: Slot::Blue },
            InstallMode::Container => AgentBuild::Image {
                digest: Sha256Hex::parse(INSTALLED_IMAGE).ok_or(SimError::NoAgent)?,
            },
        };
        let input = Input::Join(JoinRequest {
            node_name: node.into(),
            mode,
            arch: Arch::Amd64,
            goal: Goal::new(1, GOAL_VERSION),
            agent,
        });
        for _ in 0..32 {
            self.stop_process();
            self.sync_clock();
            let runner = self.runner()?;
            runner.set_daemon(false);
            let fed = runner.feed(input.clone()).await;
            if self.died() {
                if self.stays_down {
                    return Err(SimError::Down);
                }
                continue;
            }
            self.stop_process();
            return Ok(fed?);
        }
        Err(SimError::TooManyCrashes(self.crashes))
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

/// What [`SimNode::save`] writes beside the store.
#[derive(serde::Serialize, serde::Deserialize)]
struct Saved {
    world: World,
    clock: Timestamp,
    process: Option<(bool, bool)>,
}

/// A copy of the store at `from` in `to`, whose directory is made 0700 as the store wants.
/// The store is at rest (no process is inside a transaction), so its file and write-ahead
/// log copied as they are make the same database.
fn copy_store(from: &Path, to: &Path) -> Result<(), SimError> {
    let io = |path: &Path, source| {
        SimError::Exec(ExecError::Store(crate::store::StoreError::Io {
            path: path.to_path_buf(),
            source,
        }))
    };
    if let Some(dir) = to.parent() {
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(dir)
            .map_err(|e| io(dir, e))?;
    }
    // A node no process ran on has no store yet.
    if !from.exists() {
        return Ok(());
    }
    std::fs::copy(from, to).map_err(|e| io(from, e))?;
    let (wal_from, wal_to) = (with_suffix(from, "-wal"), with_suffix(to, "-wal"));
    if wal_from.exists() {
        std::fs::copy(&wal_from, &wal_to).map_err(|e| io(&wal_from, e))?;
    }
    Ok(())
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

fn save_json(path: &Path, saved: &Saved) -> Result<(), SimError> {
    let text = serde_json::to_string(saved).map_err(|e| SimError::Saved(e.to_string()))?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| SimError::Saved(e.to_string()))
}

/// Every commit of the process's store is an event of the simulated world, where a planned
/// crash can strike (`SimHost::commit`).
fn watch_commits(store: &Store, host: &SimHost) -> Result<(), ExecError> {
    let mut conn = store.conn();
    let h = host.clone();
    let hooks = conn
        .update_hook(Some(
            move |change: rusqlite::hooks::Action, _db: &str, table: &str, rowid: i64| {
                let change = match change {
                    rusqlite::hooks::Action::SQLITE_INSERT => "insert",
                    rusqlite::hooks::Action::SQLITE_UPDATE => "update",
                    rusqlite::hooks::Action::SQLITE_DELETE => "delete",
                    _ => "change",
                };
                h.row_changed(change, table, rowid);
            },
        ))
        .and_then(|()| {
            let h = host.clone();
            conn.commit_hook(Some(move || h.commit()))
        })
        .and_then(|()| {
            let h = host.clone();
            conn.rollback_hook(Some(move || h.rolled_back()))
        });
    hooks.map_err(|e| ExecError::Store(e.into()))
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
