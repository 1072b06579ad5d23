//! Status publication to the API server: every write through [`write_status`] (one field
//! manager, read-modify-write with the resourceVersion as precondition, retried on conflict;
//! an operation's write starts from the copy this node last saw or wrote, when it has one),
//! an identity guard by UID on every operation write, `startedAt` never overwritten, a
//! terminal result's `completedAt` and condition from one instant, and an Event per operation
//! transition. The only effect that talks to the API server.

use crate::api::machine::{Machine, MachinePhase as ApiMachinePhase};
use crate::api::machine_operation::{MachineOperation, MachineOperationStatus, OperationPhase};
use crate::effects::{EffectError, EffectResult, Eviction, NodeSeen, Publisher};
use crate::lifecycle::Timestamp;
use crate::lifecycle::drain::PodFacts;
use crate::lifecycle::fault::{FAULT_CLEARED, Fault, FaultKind};
use crate::lifecycle::result::{MachinePhase, OpResult, ResultReason};
use crate::lifecycle::state::OpRef;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

mod drain;
mod requests;

pub use drain::CORDON_MARK;

pub const FIELD_MANAGER: &str = "flexnode";
const CONFLICT_RETRIES: usize = 5;
pub const MSG_GONE: &str = "MachineOperation was removed, replaced, or completed";

#[derive(Clone)]
pub struct KubePublisher {
    client: Client,
    node: String,
    recorder: Recorder,
    /// By UID, the newest copy of each operation this node runs: the claimed object, then
    /// each status it wrote. A write starts from it instead of reading the object (two
    /// requests fewer per operation, docs/benchmarks.md "Fleet"); the resourceVersion
    /// precondition still refuses a stale copy, which is then read afresh.
    known: Arc<Mutex<HashMap<String, MachineOperation>>>,
}

impl std::fmt::Debug for KubePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePublisher")
            .field("node", &self.node)
            .finish()
    }
}

pub fn time(t: Timestamp) -> Time {
    Time(jiff::Timestamp::from_millisecond(t.millis()).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// The Node's `Ready` condition and identity as its kubelet reported them.
pub fn node_seen(node: &Node) -> NodeSeen {
    let status = node.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let info = status.and_then(|s| s.node_info.as_ref());
    NodeSeen {
        ready: ready.map_or_else(|| "Unknown".to_string(), |c| c.status.clone()),
        reason: ready.and_then(|c| c.reason.clone()).unwrap_or_default(),
        message: ready.and_then(|c| c.message.clone()).unwrap_or_default(),
        heartbeat: ready
            .and_then(|c| c.last_heartbeat_time.as_ref())
            .map(|t| Timestamp::from_millis(t.0.as_millisecond())),
        boot_id: info.map(|i| i.boot_id.clone()).unwrap_or_default(),
        kubelet_version: info.map(|i| i.kubelet_version.clone()).unwrap_or_default(),
    }
}

fn now() -> Time {
    Time(jiff::Timestamp::now())
}

/// API errors become effect failures with the API's own text (never parameters: status
/// writes carry none).
fn api_error(e: kube::Error) -> EffectError {
    EffectError::Failed(format!("API server: {e}"))
}

/// A request that failed on its way, not by the API server's answer: a pooled connection the
/// server closed as the request went out, a reset, a refused connection. Not a timeout: a
/// server that hangs would hold each attempt for kube's read timeout (≈295 s), past the agent
/// unit's `WatchdogSec`. kube's client already resends 429, 503 and 504.
fn is_lost(e: &kube::Error) -> bool {
    let cause: &(dyn std::error::Error + 'static) = match e {
        kube::Error::HyperError(e) => e,
        kube::Error::Service(e) => e.as_ref(),
        _ => return false,
    };
    !std::iter::successors(Some(cause), |c| c.source()).any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut)
    })
}

/// Attempts of a request lost on its way: the first, then [`RESENDS`] more, 0.1 s apart
/// doubling (1.5 s in all, jittered), so an API server that is away fails a write about as
/// soon as before and the outbox or the next tick tries again.
pub const RESENDS: usize = 4;

/// `request` sent again while it is lost on its way. Reads and status replaces are safe to
/// send twice: a replace that did land before its answer was lost meets its own
/// resourceVersion changed, a conflict, which [`write_status`] reads afresh.
async fn resend<T, Fut>(request: impl FnMut() -> Fut) -> Result<T, kube::Error>
where
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    use backon::{ExponentialBuilder, Retryable};
    let policy = ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(100))
        .with_max_times(RESENDS)
        .with_jitter();
    request
        .retry(policy)
        .when(is_lost)
        .notify(|e, after| tracing::warn!(error = %e, ?after, "API request lost on its way; sending it again"))
        .await
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// What a status write decided after reading the current object.
enum Write<T> {
    Put(T),
    /// Nothing to write (vanished, replaced or already terminal).
    Skip,
}

enum WriteError {
    Conflicts,
    Api(EffectError),
}

/// Every status write, of either resource: read the object (or start from `known`, a copy
/// of it), let `edit` decide, replace the status with that copy's `resourceVersion` as
/// precondition (the `flexnode` field manager); on a conflict, again from a read, at most
/// [`CONFLICT_RETRIES`] times. A missing object is nothing to write. Only a read decides to
/// skip: a copy that says skip is read afresh.
async fn write_status<K>(
    api: &Api<K>,
    name: &str,
    mut known: Option<K>,
    edit: impl Fn(K) -> Write<K>,
) -> Result<Option<K>, WriteError>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    for _ in 0..CONFLICT_RETRIES + usize::from(known.is_some()) {
        let (current, read) = match known.take() {
            Some(copy) => (copy, false),
            None => match resend(|| api.get_opt(name))
                .await
                .map_err(|e| WriteError::Api(api_error(e)))?
            {
                Some(current) => (current, true),
                None => return Ok(None),
            },
        };
        let next = match edit(current) {
            Write::Skip if read => return Ok(None),
            Write::Skip => continue,
            Write::Put(next) => next,
        };
        match resend(|| api.replace_status(name, &pp, &next)).await {
            Ok(written) => {
                crate::metrics::api_contact();
                return Ok(Some(written));
            }
            Err(e) if is_conflict(&e) => continue,
            Err(e) => return Err(WriteError::Api(api_error(e))),
        }
    }
    Err(WriteError::Conflicts)
}

impl KubePublisher {
    pub fn new(client: Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: "flexnode".into(),
            instance: Some(node.to_string()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            node: node.to_string(),
            known: Default::default(),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, MachineOperation>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The object of an operation this node is about to claim, as its watch delivered it.
    pub fn remember(&self, op: &MachineOperation) {
        if let Some(uid) = &op.metadata.uid {
            self.known().insert(uid.clone(), op.clone());
        }
    }

    /// The operation is gone, or no longer this node's to write.
    pub fn forget(&self, uid: &str) {
        self.known().remove(uid);
    }

    fn ops(&self) -> Api<MachineOperation> {
        Api::all(self.client.clone())
    }

    /// The operation's status through [`write_status`], only while the object is still the
    /// one claimed (same UID).
    async fn write_op(
        &self,
        op: &OpRef,
        edit: impl Fn(&MachineOperation) -> Write<MachineOperationStatus>,
    ) -> EffectResult<Option<MachineOperation>> {
        let known = self.known().get(&op.uid).cloned();
        let written = write_status(
            &self.ops(),
            &op.name,
            known,
            |mut current: MachineOperation| {
                if current.metadata.uid.as_deref() != Some(op.uid.as_str()) {
                    return Write::Skip;
                }
                match edit(&current) {
                    Write::Skip => Write::Skip,
                    Write::Put(status) => {
                        current.status = Some(status);
                        Write::Put(current)
                    }
                }
            },
        )
        .await;
        // What was written is the next write's start; after a terminal result there is none.
        match &written {
            Ok(Some(obj)) if !obj.is_terminal() => {
                self.known().insert(op.uid.clone(), obj.clone());
            }
            _ => self.forget(&op.uid),
        }
        written.map_err(|e| match e {
            WriteError::Conflicts => EffectError::Failed(format!(
                "status of {op} kept conflicting after {CONFLICT_RETRIES} attempts"
            )),
            WriteError::Api(e) => e,
        })
    }

    /// An operation the node cannot take yet: marked `Pending` (so `kubectl get` shows that
    /// the node has seen it) and said once, as an Event, so `kubectl describe` shows why it
    /// waits. Pending keeps it claimable; a failed write only loses the mark.
    pub async fn waiting(&self, obj: &MachineOperation, why: &str) {
        if let (Some(name), Some(uid)) = (obj.metadata.name.clone(), obj.metadata.uid.clone()) {
            let op = OpRef { name, uid };
            let marked = self
                .write_op(&op, |current| {
                    let mut s = current.status.clone().unwrap_or_default();
                    if s.phase.is_some() {
                        return Write::Skip;
                    }
                    s.phase = Some(OperationPhase::Pending);
                    s.message = Some(why.to_string());
                    Write::Put(s)
                })
                .await;
            if let Err(e) = marked {
                tracing::warn!(operation = %op, error = %e, "Pending not written");
            }
        }
        self.event(obj, EventType::Normal, "Waiting", why).await;
    }

    async fn event<K: Resource<DynamicType = ()>>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.to_string()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(error = %e, "event not recorded");
        }
    }
}

fn completed(
    status: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    at: Time,
) -> Condition {
    Condition {
        type_: "Completed".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: at,
    }
}

/// How a condition's `lastTransitionTime` moves when its status stays the same.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Since {
    /// Kept (the Kubernetes convention).
    Kept,
    /// Taken from the new condition: a terminal result's condition carries the instant of
    /// `completedAt`, also when it stays `False` (`InProgress` → `ExecutionFailed`).
    New,
}

fn set_condition(conditions: &mut Option<Vec<Condition>>, c: Condition, since: Since) {
    let list = conditions.get_or_insert_with(Vec::new);
    match list.iter_mut().find(|x| x.type_ == c.type_) {
        Some(existing) if existing.status == c.status && since == Since::Kept => {
            let since = existing.last_transition_time.clone();
            *existing = Condition {
                last_transition_time: since,
                ..c
            };
        }
        Some(existing) => *existing = c,
        None => list.push(c),
    }
}

impl Publisher for KubePublisher {
    async fn node_seen(&self) -> EffectResult<Option<NodeSeen>> {
        let api: Api<Node> = Api::all(self.client.clone());
        let node = resend(|| api.get_opt(&self.node))
            .await
            .map_err(api_error)?;
        Ok(node.map(|n| node_seen(&n)))
    }

    async fn report_progress(
        &self,
        op: &OpRef,
        message: &str,
        machine_generation: i64,
        started_at: Timestamp,
    ) -> EffectResult {
        let written = self
            .write_op(op, |current| {
                if current.is_terminal() {
                    return Write::Skip;
                }
                let mut s = current.status.clone().unwrap_or_default();
                s.phase = Some(OperationPhase::InProgress);
                s.message = Some(message.to_string());
                s.started_at = s.started_at.or_else(|| Some(time(started_at)));
                if machine_generation > 0 {
                    s.observed_machine_generation = Some(machine_generation);
                }
                set_condition(
                    &mut s.conditions,
                    completed(
                        "False",
                        "InProgress",
                        message,
                        current.metadata.generation,
                        now(),
                    ),
                    Since::Kept,
                );
                Write::Put(s)
            })
            .await?;
        match written {
            Some(obj) => {
                self.event(&obj, EventType::Normal, "InProgress", message)
                    .await;
                Ok(())
            }
            // Running an operation whose object is gone or finished elsewhere is wrong.
            None => Err(EffectError::Failed(MSG_GONE.into())),
        }
    }

    async fn publish_result(
        &self,
        op: &OpRef,
        result: &OpResult,
        completed_at: Timestamp,
    ) -> EffectResult {
        let written = self
            .write_op(op, |current| {
                if current.is_terminal() {
                    return Write::Skip;
                }
                let mut s = current.status.clone().unwrap_or_default();
                let ok = result.reason == ResultReason::Succeeded;
                s.phase = Some(if ok {
                    OperationPhase::Complete
                } else {
                    OperationPhase::Failed
                });
                s.message = Some(result.message.clone());
                s.started_at = s.started_at.or_else(|| Some(time(result.started_at)));
                s.completed_at = Some(time(completed_at));
                if result.machine_generation > 0 {
                    s.observed_machine_generation = Some(result.machine_generation);
                }
                set_condition(
                    &mut s.conditions,
                    completed(
                        if ok { "True" } else { "False" },
                        result.reason.as_str(),
                        &result.message,
                        current.metadata.generation,
                        time(completed_at),
                    ),
                    Since::New,
                );
                Write::Put(s)
            })
            .await?;
        // A vanished, replaced or already finished object takes no result: that is done too
        // (the outbox stops trying; the result stays in the store and its journal).
        let Some(obj) = written else {
            tracing::info!(
                operation = %op,
                reason = result.reason.as_str(),
                "the operation is gone, replaced or already finished; its result stays in the store only"
            );
            return Ok(());
        };
        let type_ = match result.reason {
            ResultReason::Succeeded => EventType::Normal,
            ResultReason::InvalidParameters
            | ResultReason::ExecutionFailed
            | ResultReason::DaemonFailed => EventType::Warning,
        };
        self.event(&obj, type_, result.reason.as_str(), &result.message)
            .await;
        Ok(())
    }

    async fn report_machine(
        &self,
        phase: MachinePhase,
        message: &str,
        observed_generation: Option<i64>,
    ) -> EffectResult {
        let (status, reason) = node_updated(phase);
        self.write_machine(|m: &Machine| {
            Some(machine_status(
                m,
                phase,
                status,
                reason,
                message,
                observed_generation.or(m.metadata.generation),
            ))
        })
        .await
        .map(|_| ())
    }

    async fn cordon(&self, holder: &str) -> EffectResult<bool> {
        self.cordon_node(holder).await
    }

    async fn uncordon(&self, holder: &str) -> EffectResult<bool> {
        self.uncordon_node(holder).await
    }

    async fn pods_on_node(&self) -> EffectResult<Vec<PodFacts>> {
        self.list_pods().await
    }

    async fn evict(&self, pod: &PodFacts) -> EffectResult<Eviction> {
        self.evict_pod(pod).await
    }

    async fn budgets_recovering(&self, pods: &[PodFacts]) -> EffectResult<Vec<String>> {
        self.recovering_budgets(pods).await
    }
}

/// `NodeUpdated`'s status and reason for a Machine phase flexnode reports.
fn node_updated(phase: MachinePhase) -> (&'static str, &'static str) {
    match phase {
        MachinePhase::Ready => ("True", "Applied"),
        MachinePhase::Failed => ("False", "Failed"),
        MachinePhase::Joining | MachinePhase::Rebooting | MachinePhase::Provisioning => {
            ("False", "Progressing")
        }
    }
}

/// The Machine's status with `phase` and the `NodeUpdated` condition.
fn machine_status(
    m: &Machine,
    phase: MachinePhase,
    status: &str,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
) -> Machine {
    let mut m = m.clone();
    let mut s = m.status.clone().unwrap_or_default();
    s.phase = Some(match phase {
        MachinePhase::Joining => ApiMachinePhase::Joining,
        MachinePhase::Ready => ApiMachinePhase::Ready,
        MachinePhase::Rebooting => ApiMachinePhase::Rebooting,
        MachinePhase::Provisioning => ApiMachinePhase::Provisioning,
        MachinePhase::Failed => ApiMachinePhase::Failed,
    });
    set_condition(
        &mut s.conditions,
        Condition {
            type_: "NodeUpdated".into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation,
            last_transition_time: now(),
        },
        Since::Kept,
    );
    m.status = Some(s);
    m
}

fn node_updated_condition(m: &Machine) -> Option<&Condition> {
    m.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "NodeUpdated")
}

/// A bad environment on the Machine and how it ends (src/lifecycle/fault.rs,
/// src/reconcile/fault.rs):
/// the only writes of the Machine outside the core's `ReportMachine`.
impl KubePublisher {
    /// Every Machine status write: `edit` gives the next object, or `None` for nothing to
    /// write. The Machine written, or `None` when there is none or nothing was written.
    async fn write_machine(
        &self,
        edit: impl Fn(&Machine) -> Option<Machine>,
    ) -> EffectResult<Option<Machine>> {
        let api: Api<Machine> = Api::all(self.client.clone());
        let written = write_status(&api, &self.node, None, |m: Machine| match edit(&m) {
            Some(next) => Write::Put(next),
            None => Write::Skip,
        })
        .await;
        match written {
            Ok(m) => Ok(m),
            Err(WriteError::Conflicts) => Err(EffectError::Failed(format!(
                "Machine status kept conflicting after {CONFLICT_RETRIES} attempts"
            ))),
            Err(WriteError::Api(e)) => Err(e),
        }
    }

    /// The fault on the node's Machine: phase `Failed`, `NodeUpdated` False with the fault's
    /// reason and message (what is wrong; what to do), and a Warning Event with the same
    /// reason. A Machine that already says exactly this is left alone (no second Event).
    /// Returns whether it was written.
    pub async fn report_fault(&self, fault: &Fault) -> EffectResult<bool> {
        let reason = fault.kind.reason();
        let message = format!("{}; {}", fault.message(), fault.remedy());
        let written = self
            .write_machine(|m: &Machine| {
                let shown = node_updated_condition(m);
                if shown.is_some_and(|c| c.reason == reason && c.message == message) {
                    return None;
                }
                // The applied generation is not known here; the one last reported stays.
                let generation = shown.and_then(|c| c.observed_generation);
                Some(machine_status(
                    m,
                    MachinePhase::Failed,
                    "False",
                    reason,
                    &message,
                    generation,
                ))
            })
            .await?;
        if let Some(m) = &written {
            self.event(m, EventType::Warning, reason, &message).await;
        }
        Ok(written.is_some())
    }

    /// The fault is over: a Machine that shows one (any reason of src/lifecycle/fault.rs) gets `phase`
    /// back as the core reports it, and a Normal Event `FaultCleared`. Returns whether it
    /// showed one.
    pub async fn clear_fault(
        &self,
        phase: MachinePhase,
        message: &str,
        observed_generation: Option<i64>,
    ) -> EffectResult<bool> {
        let (status, reason) = node_updated(phase);
        let written = self
            .write_machine(|m: &Machine| {
                let shown = node_updated_condition(m)?;
                FaultKind::parse(&shown.reason)?;
                let generation = observed_generation.or(shown.observed_generation);
                Some(machine_status(
                    m, phase, status, reason, message, generation,
                ))
            })
            .await?;
        if let Some(m) = &written {
            self.event(m, EventType::Normal, FAULT_CLEARED, message)
                .await;
        }
        Ok(written.is_some())
    }
}

/// The Machine's condition that says its `spec.agent.downloads` are not what this node runs.
pub const DOWNLOADS_IGNORED: &str = "DownloadsIgnored";

impl KubePublisher {
    /// The Machine names downloads (`named`, none: the condition goes): the condition
    /// [`DOWNLOADS_IGNORED`] True, reason `NodeImage`, naming them. Returns whether it wrote.
    pub async fn note_downloads(&self, named: &[&str]) -> EffectResult<bool> {
        let message = format!(
            "this node takes kubernetes, containerd, runc, CNI and crictl from its node image \
             (the nodeImage and nodeImages of its configuration); spec.agent.downloads ({}) \
             is ignored",
            named.join(", ")
        );
        let written = self
            .write_machine(|m: &Machine| {
                let conditions = m.status.as_ref().and_then(|s| s.conditions.as_ref());
                let shown =
                    conditions.and_then(|c| c.iter().find(|c| c.type_ == DOWNLOADS_IGNORED));
                let mut next = m.clone();
                let status = next.status.get_or_insert_with(Default::default);
                match (named.is_empty(), shown) {
                    (true, None) => return None,
                    (false, Some(c)) if c.message == message => return None,
                    (true, Some(_)) => {
                        if let Some(list) = status.conditions.as_mut() {
                            list.retain(|c| c.type_ != DOWNLOADS_IGNORED);
                        }
                    }
                    (false, _) => set_condition(
                        &mut status.conditions,
                        Condition {
                            type_: DOWNLOADS_IGNORED.into(),
                            status: "True".into(),
                            reason: "NodeImage".into(),
                            message: message.clone(),
                            observed_generation: m.metadata.generation,
                            last_transition_time: now(),
                        },
                        Since::Kept,
                    ),
                }
                Some(next)
            })
            .await?;
        Ok(written.is_some())
    }
}
