//! The owner task: the only code that feeds the state machine in the daemon.

use super::DaemonConfig;
use super::clock::SteadyClock;
use super::fault::Health;
use super::status_socket::{self, Live};
use super::watch::{self, OperationWatch, WatchCounters};
use super::{DELETION_TAINT, Msg, address, metrics_server, notify};
use crate::api::{Machine, MachineOperation};
use crate::effects::kube::KubePublisher;
use crate::effects::{Containerd, Host, Systemd};
use crate::exec::{Clock, ExecError, Fed, Progress, Runner, SystemClock};
use crate::lifecycle::agent::AgentBuild;
use crate::lifecycle::input::{GoalObservation, MachineObservation, NodeObservation};
use crate::lifecycle::{Input, NodeState, Refusal};
use crate::status_report::GoalSummary;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

mod claims;

/// The tick of a daemon with nothing waiting on time (each tick costs store reads): it
/// still feeds the watchdog (`WatchdogSec=300s`) and retries what failed quietly.
const IDLE_TICK: Duration = Duration::from_secs(60);

/// The daemon's executor: this host's effects and the API server as publisher
/// (`cli/wiring.rs` assembles it).
pub type KubeRunner<S, C, H> = Runner<S, C, H, KubePublisher, SteadyClock>;

struct Owner<S, C, H> {
    runner: KubeRunner<S, C, H>,
    node_name: String,
    ops: BTreeMap<String, MachineOperation>,
    /// `None` until the first list completed.
    node: Option<Option<Box<Node>>>,
    machine: Option<Option<Box<Machine>>>,
    /// Operations already told (by an Event) that they wait for the node.
    told_waiting: std::collections::HashSet<String>,
    /// Operation watches interrupted since their last list was handled.
    stale: std::collections::HashSet<&'static str>,
    /// The goal observation last logged (logged again only when it changes).
    last_observed: Option<GoalObservation>,
    /// When a failed repave may be tried again.
    repave_pause: super::repave_pause::RepavePause,
    /// A bad environment the daemon waits out; no new work starts meanwhile.
    health: Health,
    /// The watches' account of themselves: claims wait while one is interrupted.
    counters: Arc<WatchCounters>,
    /// A read that a decision waits for failed (said once, until a read succeeds).
    unconfirmed: bool,
    /// What systemd's STATUS says now, which `flexnode status` also hears
    /// (`status_socket.rs`).
    live: Arc<Live>,
    /// The watches' messages, once they run; and those that came while a step's effects ran,
    /// handled next, in order (`feed`).
    inbox: Option<mpsc::Receiver<Msg>>,
    deferred: std::collections::VecDeque<Msg>,
    /// The Machine's downloads last said to be ignored (`note_downloads`); `None`: not yet.
    downloads_noted: Option<Vec<&'static str>>,
}

/// Messages kept while a step runs; beyond it they wait in the channel.
const DEFERRED_MAX: usize = 1024;

/// Runs the daemon with `runner` until `shutdown` completes (or the task is dropped).
pub async fn run<S, C, H>(
    config: DaemonConfig,
    client: Client,
    runner: KubeRunner<S, C, H>,
    running: AgentBuild,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ExecError>
where
    S: Systemd,
    C: Containerd,
    H: Host,
{
    let live = Arc::new(Live::default());
    let _served = serve(&config, runner.store_path(), &live).await;
    let mut owner = Owner::new(&config, runner, live);
    tokio::pin!(shutdown);
    if !owner.start(running, config.tick, shutdown.as_mut()).await? {
        return Ok(());
    }
    owner.started().await?;
    let (rx, _watching) = start_watches(&config, &client);
    owner.inbox = Some(rx);
    owner.reconcile(config.tick, shutdown).await?;
    owner.stop();
    Ok(())
}

/// The metrics and the status socket, served from the start so that a daemon waiting out a
/// bad environment can be watched too; they end when the returned guard is dropped.
async fn serve(config: &DaemonConfig, store: &std::path::Path, live: &Arc<Live>) -> AbortOnDrop {
    let socket = config
        .live_status
        .then(|| {
            let path = status_socket::socket_path(store);
            status_socket::start(&path, live.clone(), config.counters.clone())
        })
        .flatten();
    AbortOnDrop(
        [metrics_server::start(config.metrics).await, socket]
            .into_iter()
            .flatten()
            .collect(),
    )
}

/// The node's watches (its operations, its Node, its Machine), each a task sending to the
/// owner's inbox; they end when the returned guard is dropped.
fn start_watches(config: &DaemonConfig, client: &Client) -> (mpsc::Receiver<Msg>, AbortOnDrop) {
    let (tx, rx) = mpsc::channel(256);
    let name = config.node_name.as_str();
    let counters = &config.counters;
    let operations: &[(&'static str, String)] = match config.operations {
        OperationWatch::Selected => &[
            ("own", format!("spec.machineRef={name}")),
            ("selector", "spec.machineRef=".to_owned()),
        ],
        OperationWatch::All => &[("all", String::new())],
    };
    let mut tasks: Vec<_> = operations
        .iter()
        .map(|(watch, fields)| {
            let api = Api::all(client.clone());
            watch::operations(api, name, watch, fields, tx.clone(), counters.clone())
        })
        .collect();
    tasks.push(watch::single(
        Api::<Node>::all(client.clone()),
        name,
        "node",
        tx.clone(),
        |n| Msg::Node(n.map(Box::new)),
        counters.clone(),
    ));
    tasks.push(watch::single(
        Api::<Machine>::all(client.clone()),
        name,
        "machine",
        tx,
        |m| Msg::Machine(m.map(Box::new)),
        counters.clone(),
    ));
    counters
        .watches
        .store(tasks.len() as u64, Ordering::Relaxed);
    // Counters shared with an earlier run of the daemon (tests restart it in one process):
    // its watches are gone, and so is whatever they left interrupted.
    counters.away.store(0, Ordering::Relaxed);
    (
        rx,
        AbortOnDrop(tasks.iter().map(|t| t.abort_handle()).collect()),
    )
}

struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

impl<S: Systemd, C: Containerd, H: Host> Owner<S, C, H> {
    fn new(config: &DaemonConfig, mut runner: KubeRunner<S, C, H>, live: Arc<Live>) -> Self {
        // A step of long effects (a repave: unpack, start, the wait for the kubelet) keeps
        // the watchdog fed, and during start-up the start timeout extended, while it makes
        // progress; a wedged loop still gets the agent restarted (notify.rs).
        runner.set_on_progress(Progress(Box::new(notify::progress)));
        Self {
            live,
            runner,
            node_name: config.node_name.clone(),
            ops: BTreeMap::new(),
            node: None,
            machine: None,
            told_waiting: Default::default(),
            stale: Default::default(),
            last_observed: None,
            repave_pause: super::repave_pause::RepavePause::new(config.repave_retry),
            health: Health::new(config.etc.clone()),
            counters: config.counters.clone(),
            unconfirmed: false,
            inbox: None,
            deferred: Default::default(),
            downloads_noted: None,
        }
    }

    /// systemd (Type=notify) counts the agent started from here; the watchdog is fed by the
    /// owner loop itself, so a wedged loop gets the agent restarted. A fault an earlier
    /// process left on the Machine is cleared.
    async fn started(&mut self) -> Result<(), ExecError> {
        notify::ready();
        let state = self.runner.state()?;
        self.say(&state);
        self.health
            .clear_shown(&state, self.runner.publisher())
            .await;
        Ok(())
    }

    /// The main loop: a message kept from a step, a message from the watches, or a tick, one
    /// at a time, until `shutdown`, the watches' end or a reset.
    async fn reconcile(
        &mut self,
        tick: Duration,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(), ExecError> {
        let mut next_tick = Instant::now() + tick;
        loop {
            let (ticked, done) = if let Some(msg) = self.deferred.pop_front() {
                (false, self.handle(msg).await)
            } else {
                let Some(inbox) = self.inbox.as_mut() else {
                    return Ok(());
                };
                tokio::select! {
                () = &mut shutdown => return Ok(()),
                msg = inbox.recv() => match msg {
                    Some(msg) => (false, self.handle(msg).await),
                    None => return Ok(()),
                },
                () = tokio::time::sleep_until(next_tick) => {
                    let done = self.tick().await;
                    notify::notify(&[sd_notify::NotifyState::Watchdog]);
                    (true, done)
                }
                }
            };
            // A store that cannot be written ends no daemon: the step it refused did not
            // run, and the next tick tries again once the store takes writes
            // (src/reconcile/fault.rs).
            if let Err(e) = done.and_then(|()| self.runner.state().map(|_| ())) {
                self.wait_out(e).await?;
                next_tick = Instant::now() + tick;
                continue;
            }
            let state = self.runner.state()?;
            self.say(&state);
            self.keep_clock(&state);
            // After a reset the agent's units are gone; so is the daemon.
            if matches!(state, NodeState::Unjoined { .. }) {
                tracing::info!("the node was reset; the daemon stops");
                return Ok(());
            }
            // A message can only bring the next tick closer (new work), never push it away.
            let due = Instant::now() + self.tick_in(&state, tick)?;
            next_tick = if ticked { due } else { next_tick.min(due) };
        }
    }

    /// systemd hears the daemon stop; the store's WAL is folded in (a full disk can refuse
    /// it: the WAL keeps every committed step meanwhile).
    fn stop(&self) {
        notify::notify(&[sd_notify::NotifyState::Stopping]);
        if let Err(e) = self.runner.checkpoint() {
            tracing::warn!(error = %e, "the store's WAL was not checkpointed");
        }
    }

    /// Nothing waits on time: the clock takes the wall clock as it is; while something
    /// does, a jump of the wall clock is told and deadlines keep to the monotonic clock
    /// (src/reconcile/clock.rs).
    fn keep_clock(&mut self, state: &NodeState) {
        if state.deadline().is_none() {
            self.runner.clock().follow_wall();
        } else if let Some(drift_ms) = self.runner.clock().jumped() {
            tracing::warn!(
                drift_ms,
                deadline = %state.deadline().map(|d| d.rfc3339()).unwrap_or_default(),
                "the wall clock moved against the monotonic clock; deadlines keep to the \
                 monotonic clock until the node is at rest"
            );
        }
    }

    /// Finishes what a crash interrupted, publishes what waits, judges a pending hand-off:
    /// before any new work is claimed. A store that cannot be written is waited for (then
    /// systemd is told the agent runs, so it is neither killed for a slow start nor
    /// restarted). `false`: `shutdown` came first.
    async fn start(
        &mut self,
        running: AgentBuild,
        tick: Duration,
        mut shutdown: Pin<&mut impl Future<Output = ()>>,
    ) -> Result<bool, ExecError> {
        while let Err(e) = self.runner.start(running.clone()).await {
            self.wait_out(e).await?;
            notify::ready();
            loop {
                tokio::select! {
                    () = &mut shutdown => return Ok(false),
                    () = tokio::time::sleep(tick) => notify::notify(&[sd_notify::NotifyState::Watchdog]),
                }
                if self.check_health().await {
                    break;
                }
            }
        }
        Ok(true)
    }

    /// `e` is a fault the daemon waits out, held from now on (src/reconcile/fault.rs), or
    /// it ends the daemon.
    pub(super) async fn wait_out(&mut self, e: ExecError) -> Result<(), ExecError> {
        let Some(fault) = e
            .fault(self.runner.store_path())
            .filter(|f| !f.kind.needs_operator())
        else {
            return Err(e);
        };
        self.health.enter(fault, self.runner.publisher()).await;
        Ok(())
    }

    /// Whether new work may start (src/reconcile/fault.rs).
    async fn check_health(&mut self) -> bool {
        let Ok(state) = self.runner.state() else {
            return false;
        };
        let runner = &self.runner;
        self.health
            .check(
                runner.store_path(),
                || runner.store_writable(),
                &state,
                runner.publisher(),
            )
            .await
    }

    /// systemd's STATUS: the state, or the fault waited out.
    fn say(&mut self, state: &NodeState) {
        let text = match self.health.fault() {
            Some(f) => format!("{f}; {}", f.remedy()),
            None => state.to_string(),
        };
        if self.live.set_status(&text) {
            notify::status_text(&text);
        }
    }

    async fn handle(&mut self, msg: Msg) -> Result<(), ExecError> {
        match msg {
            // Another node's operation (`OperationWatch::All` delivers them) is not kept.
            Msg::Operation(op) if address::elsewhere(&op, &self.node_name) => Ok(()),
            Msg::Operation(op) => {
                if let Some(uid) = op.metadata.uid.clone() {
                    self.ops.insert(uid, *op);
                }
                self.claim_waiting().await
            }
            Msg::OperationGone(uid) => {
                self.runner.publisher().forget(&uid);
                self.ops.remove(&uid);
                self.told_waiting.remove(&uid);
                Ok(())
            }
            Msg::OperationsStale { watch } => {
                self.stale.insert(watch);
                Ok(())
            }
            Msg::OperationsListed { watch } => {
                self.stale.remove(watch);
                self.claim_waiting().await?;
                self.log_listed(watch);
                Ok(())
            }
            Msg::Node(node) => {
                if let Some(n) = &node {
                    self.runner
                        .remember_node(&crate::effects::kube::node_seen(n));
                }
                self.node = Some(node);
                self.observe_goal().await?;
                self.claim_waiting().await
            }
            Msg::Machine(machine) => {
                self.machine = Some(machine);
                self.note_downloads().await;
                self.observe_goal().await?;
                self.claim_waiting().await
            }
        }
    }

    /// This node takes its components from node images, never from `spec.agent.downloads`:
    /// a Machine that names some is told so (a condition), each time the list changes.
    async fn note_downloads(&mut self) {
        let Some(Some(m)) = &self.machine else {
            return;
        };
        let named = m
            .spec
            .agent
            .as_ref()
            .and_then(|a| a.downloads.as_ref())
            .map(|d| d.named())
            .unwrap_or_default();
        if self.downloads_noted.as_ref() == Some(&named) {
            return;
        }
        match self.runner.publisher().note_downloads(&named).await {
            Ok(_) => self.downloads_noted = Some(named),
            Err(e) => {
                tracing::warn!(error = %e, "the Machine does not say its downloads are ignored")
            }
        }
    }

    /// The Machine asks for a generation the node has not applied.
    fn goal_changed(&self, state: &NodeState) -> bool {
        let applied = state.node().map(|n| n.applied.generation);
        matches!(&self.machine, Some(Some(m))
            if m.metadata.generation.is_some_and(|g| Some(g) != applied))
    }

    /// How soon the next tick is due: after `tick` while anything waits on time (a state's
    /// deadline, the outbox, a claim, a goal not applied yet); otherwise at the next TTL
    /// expiry, at most [`IDLE_TICK`] away. Watch events still wake the daemon at once.
    fn tick_in(&self, state: &NodeState, tick: Duration) -> Result<Duration, ExecError> {
        let labels = self.labels();
        let claim_waits = self
            .waiting(labels.as_ref())
            .any(|op| address::claim(op, 0).is_some());
        if state.deadline().is_some()
            || self.health.fault().is_some()
            || self.goal_changed(state)
            || claim_waits
            || self.runner.has_unpublished()?
        {
            return Ok(tick);
        }
        let idle = tick.max(IDLE_TICK);
        let now = SystemClock.now().millis();
        Ok(self
            .ops
            .values()
            .filter(|op| address::addressed(op, &self.node_name, labels.as_ref()))
            .filter_map(ttl_expiry)
            .min()
            .map_or(idle, |at| {
                Duration::from_millis(u64::try_from(at - now).unwrap_or(0)).clamp(tick, idle)
            }))
    }

    async fn tick(&mut self) -> Result<(), ExecError> {
        if self.health.fault().is_some() {
            self.check_health().await;
        }
        self.feed(Input::Tick).await?;
        self.runner.flush_outbox().await?;
        self.expire_finished().await;
        self.observe_goal().await?;
        self.claim_waiting().await
    }

    /// A crash (simulation only) ends the daemon like a killed process.
    ///
    /// A step's effects can take minutes (a download, a machine's start). Meanwhile the
    /// watches' messages are kept for after the step, and an operation of this node that
    /// arrives is marked `Pending` at once, told once why it waits: `kubectl get` shows that
    /// the node has seen it, and the claim after the step finds it told.
    async fn feed(&mut self, input: Input) -> Result<Fed, ExecError> {
        if self.runner.restart_requested() && input != Input::Tick {
            // The old daemon takes no new work while its successor is on the way; it still
            // watches the hand-off's deadline.
            return Ok(Fed::Refused(Refusal::Busy {
                phase: "HandingOff",
                op: None,
            }));
        }
        let busy_with = match &input {
            Input::OperationClaimed(claim) => Some(claim.op.clone()),
            _ => self.runner.state()?.operation().map(|(op, _)| op.clone()),
        };
        let labels = self.labels();
        let publisher = self.runner.publisher().clone();
        let Some(inbox) = self.inbox.as_mut() else {
            return self.runner.feed(input).await;
        };
        let step = self.runner.feed(input);
        tokio::pin!(step);
        loop {
            tokio::select! {
                fed = &mut step => return fed,
                Some(msg) = inbox.recv(), if self.deferred.len() < DEFERRED_MAX => {
                    if let Msg::Operation(op) = &msg
                        && address::is_claimable(op)
                        && address::addressed(op, &self.node_name, labels.as_ref())
                        && address::claim(op, 0).is_some()
                        && busy_with.as_ref().is_none_or(|b| op.metadata.uid.as_ref() != Some(&b.uid))
                        && let Some(uid) = op.metadata.uid.clone()
                        && self.told_waiting.insert(uid)
                    {
                        let why = match &busy_with {
                            Some(b) => format!("waiting: busy: operation {b} runs"),
                            None => "waiting: busy: a step runs".to_string(),
                        };
                        publisher.waiting(op, &why).await;
                    }
                    self.deferred.push_back(msg);
                }
            }
        }
    }

    fn labels(&self) -> Option<BTreeMap<String, String>> {
        match (&self.node, &self.machine) {
            (Some(Some(node)), _) => Some(node.metadata.labels.clone().unwrap_or_default()),
            (_, Some(Some(machine))) => Some(machine.metadata.labels.clone().unwrap_or_default()),
            _ => None,
        }
    }

    fn machine_generation(&self) -> i64 {
        match &self.machine {
            Some(Some(m)) => m.metadata.generation.unwrap_or(0),
            _ => 0,
        }
    }

    async fn observe_goal(&mut self) -> Result<(), ExecError> {
        // A repave or a reset starts from here: not in a bad environment.
        if !self.check_health().await {
            return Ok(());
        }
        // The two decisions that change the node on their own act on two objects the
        // watches report each on its own, so both are read again before either counts:
        // - a repave (the goal changed, the Node absent): a step that started a machine (a
        //   repave, its rollback) had its kubelet register the Node while the Node's watch
        //   event still waited in the queue; after the API server lost its data (etcd wiped
        //   or restored) the Node's re-list can arrive while the Machine's watch still holds
        //   a goal that no longer exists;
        // - the deletion signal (the Node tainted, the Machine gone), on a node at rest: the
        //   Machine's re-list can pair with the tainted Node the Node's watch still holds.
        // Only then: a node without a kubelet has no Node for good, and every tick would ask.
        let state = self.runner.state()?;
        self.live.set_waiting_goal(match &self.machine {
            Some(Some(m)) if self.goal_changed(&state) => {
                Some(GoalSummary::of(&address::goal(m, "")))
            }
            _ => None,
        });
        let repave = self.goal_changed(&state) && matches!(self.node, Some(None));
        if repave
            && let Some(Some(m)) = &self.machine
            && self.repave_pause.waits(
                m.metadata.generation.unwrap_or(0),
                std::time::Instant::now(),
            )
        {
            return Ok(());
        }
        let signal = matches!(state, NodeState::Ready { .. })
            && matches!(
                (&self.node, &self.machine),
                (Some(Some(n)), Some(None)) if has_deletion_taint(n)
            );
        if (repave || signal) && !self.read_goal().await {
            return Ok(());
        }
        let (Some(node), Some(machine)) = (&self.node, &self.machine) else {
            return Ok(());
        };
        let node = match node {
            None => NodeObservation::Absent,
            Some(n) => NodeObservation::Present {
                deletion_taint: has_deletion_taint(n),
            },
        };
        let machine = match machine {
            None => MachineObservation::Missing,
            Some(m) => MachineObservation::Present(address::goal(m, "")),
        };
        let observed = GoalObservation { node, machine };
        let fed = self.feed(Input::GoalObserved(observed.clone())).await?;
        self.repave_pause
            .observed(&state, &observed, &fed, &self.node_name);
        if self.last_observed.as_ref() != Some(&observed) {
            tracing::info!(
                node = %self.node_name,
                observed = %Input::GoalObserved(observed.clone()),
                outcome = %match &fed {
                    Fed::Accepted(state) => state.to_string(),
                    Fed::Refused(r) => format!("refused: {r}"),
                },
                "goal observed"
            );
            self.last_observed = Some(observed);
        }
        Ok(())
    }

    /// The Node and the Machine read again; what the reads find replaces what the watches
    /// said. False (and logged) when a read failed: the decision waits for the next tick.
    async fn read_goal(&mut self) -> bool {
        match self.runner.publisher().read_node_and_machine().await {
            Ok((node, machine)) => {
                self.node = Some(node.map(Box::new));
                self.machine = Some(machine.map(Box::new));
                self.unconfirmed = false;
                true
            }
            Err(e) if !self.unconfirmed => {
                self.unconfirmed = true;
                tracing::warn!(node = %self.node_name, error = %e, "the Node and the Machine not confirmed by a read; waiting");
                false
            }
            Err(e) => {
                tracing::debug!(node = %self.node_name, error = %e, "the Node and the Machine still not confirmed");
                false
            }
        }
    }

    /// Deletes finished operations whose `ttlSecondsAfterFinished` has passed.
    async fn expire_finished(&mut self) {
        let now = SystemClock.now();
        let labels = self.labels();
        let expired: Vec<(String, String)> = self
            .ops
            .values()
            .filter(|op| address::addressed(op, &self.node_name, labels.as_ref()))
            .filter(|op| ttl_expiry(op).is_some_and(|at| now.millis() >= at))
            .filter_map(|op| Some((op.metadata.name.clone()?, op.metadata.uid.clone()?)))
            .collect();
        for (name, uid) in expired {
            match self.runner.publisher().delete_finished(&name, &uid).await {
                Ok(deleted) => {
                    if deleted {
                        tracing::info!(operation = %name, "deleted after ttlSecondsAfterFinished");
                    }
                    self.ops.remove(&uid);
                }
                Err(e) => tracing::warn!(operation = %name, error = %e, "TTL deletion failed"),
            }
        }
    }
}

/// When a finished operation's `ttlSecondsAfterFinished` runs out (ms since the epoch).
fn ttl_expiry(op: &MachineOperation) -> Option<i64> {
    if !op.is_terminal() {
        return None;
    }
    let ttl = i64::from(op.spec.ttl_seconds_after_finished?);
    let done = op
        .status
        .as_ref()?
        .completed_at
        .as_ref()?
        .0
        .as_millisecond();
    Some(done + ttl * 1000)
}

fn has_deletion_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| {
            taints.iter().any(|t| {
                t.key == DELETION_TAINT
                    && t.effect == "NoSchedule"
                    && t.value
                        .as_deref()
                        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
            })
        })
}
