//! Narrow traits over what the agent does to the host and the API server. The executor is
//! generic over them: production code gets systemd (D-Bus), containerd (gRPC) and the
//! Kubernetes API; tests get the simulated host. Implementations are idempotent: the executor
//! may call a method again after a crash, and it must then only finish what is missing.

pub mod archive;
pub mod containerd;
pub(crate) mod fs;
pub mod host;
pub mod http;
pub mod kube;
pub mod systemd;

use crate::lifecycle::Timestamp;
use crate::lifecycle::agent::{AgentBuild, InstallMode};
use crate::lifecycle::agent::{ArchiveUrl, ImageRef, Sha256Hex, Slot};
use crate::lifecycle::drain::PodFacts;
use crate::lifecycle::result::{MachinePhase, OpResult};
use crate::lifecycle::state::{Goal, OpRef, Side};
use std::future::Future;
use std::path::{Path, PathBuf};

/// An effect that did not happen. Messages never contain secrets: implementations build them
/// from redacted values only.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EffectError {
    #[error("{0}")]
    Failed(String),
    /// The process died here (simulation only): nothing after this point ran or was recorded.
    #[error("simulated crash")]
    Crashed,
}

pub type EffectResult<T = ()> = Result<T, EffectError>;

pub const AGENT_UNIT: &str = "flexnode-agent.service";
pub const RECOVERY_UNIT: &str = "flexnode-agent-recovery.service";
pub const BOOTSTRAP_UNIT: &str = "flexnode-bootstrap.service";
pub const RESET_UNIT: &str = "flexnode-reset.service";

/// A unit name is a plain file name with a unit suffix: never a path. Checked by every
/// implementation before it touches a unit.
pub(crate) fn check_unit_name(name: &str) -> EffectResult {
    const SUFFIXES: &[&str] = &[
        ".service", ".socket", ".target", ".timer", ".path", ".mount", ".slice", ".scope", ".swap",
    ];
    let ok = !name.is_empty()
        && name.len() <= 255
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":-_.\\@".contains(&b))
        && SUFFIXES
            .iter()
            .any(|s| name.len() > s.len() && name.ends_with(s));
    if ok {
        Ok(())
    } else {
        Err(EffectError::Failed(format!("invalid unit name {name:?}")))
    }
}

/// `systemd-nspawn@<side>.service`, the unit that runs a kubelet machine.
pub fn machine_unit(side: Side) -> String {
    format!("systemd-nspawn@{}.service", side.name())
}

/// The machine unit's drop-in for a kubelet: `/proc/sys` writable (the kubelet and CNI set
/// sysctls) and the kernel log readable.
pub const MACHINE_DROP_IN: &str = "\
# Written by flexnode: what a kubelet in the machine needs.
[Service]
Environment=SYSTEMD_NSPAWN_API_VFS_WRITABLE=yes
DeviceAllow=/dev/kmsg rw
";

/// What systemd and machined say about an nspawn machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineStatus {
    pub running: bool,
    /// When the machine last started (wall clock).
    pub started_at: Option<Timestamp>,
}

/// What a side's tree was provisioned as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MachineTree {
    pub kubernetes_version: String,
    /// The node image it was unpacked from; `None`: the minimal tree, which runs no kubelet.
    pub image: Option<Sha256Hex>,
    /// The Machine generation its kubelet's files were written for (the Node's labels and
    /// taints); `None` in a minimal tree and in markers of older agents.
    pub generation: Option<i64>,
}

/// The `Node` object's readiness, as its kubelet last reported it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSeen {
    /// The `Ready` condition's status: `True`, `False` or `Unknown` (absent: `Unknown`).
    pub ready: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When the kubelet last reported the condition (`lastHeartbeatTime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kubelet_version: String,
}

impl NodeSeen {
    /// Ready, as reported by a kubelet at or after `since` (a stale `True` from before a
    /// machine restart does not count).
    pub fn ready_since(&self, since: Timestamp) -> bool {
        // Heartbeats have second precision.
        let since = Timestamp::from_millis(since.millis().div_euclid(1000) * 1000);
        self.ready == "True" && self.heartbeat.is_some_and(|h| h >= since)
    }
}

/// systemd over D-Bus (manager, login1, machine1).
pub trait Systemd: Send + Sync {
    /// Writes a unit file atomically unless it already holds `contents`; whether it changed.
    fn write_unit(
        &self,
        name: &str,
        contents: &str,
    ) -> impl Future<Output = EffectResult<bool>> + Send;
    /// Writes flexnode's drop-in for `unit` (`<unit>.d/flexnode.conf`) unless it already holds
    /// `contents`; whether it changed (a daemon-reload is then due).
    fn write_drop_in(
        &self,
        unit: &str,
        contents: &str,
    ) -> impl Future<Output = EffectResult<bool>> + Send;
    /// Removes flexnode's drop-in for `unit`; absent is fine. Whether one was there.
    fn remove_drop_in(&self, unit: &str) -> impl Future<Output = EffectResult<bool>> + Send;
    /// Removes a unit file; absent is fine.
    fn remove_unit(&self, name: &str) -> impl Future<Output = EffectResult> + Send;
    /// Whether the unit file `name` is installed (written, not removed since).
    fn unit_file_present(&self, name: &str) -> impl Future<Output = EffectResult<bool>> + Send;
    /// Whether `unit` is enabled (its install symlinks exist); an unknown unit is not.
    fn is_enabled(&self, unit: &str) -> impl Future<Output = EffectResult<bool>> + Send;
    fn daemon_reload(&self) -> impl Future<Output = EffectResult> + Send;
    /// Whether systemd runs `unit` from an older text of its file than the one on disk
    /// (`NeedDaemonReload`); a unit it has not loaded does not.
    fn needs_reload(&self, unit: &str) -> impl Future<Output = EffectResult<bool>> + Send;
    fn enable(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    /// Masks `unit` (a link to /dev/null in the unit directory): it never starts again, at a
    /// boot neither. Takes effect at the next daemon-reload.
    fn mask(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    /// The swap units systemd has loaded (from fstab, generators or unit files).
    fn swap_units(&self) -> impl Future<Output = EffectResult<Vec<String>>> + Send;
    fn disable(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    /// Starts a unit and waits for its job to finish.
    fn start(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    fn stop(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    fn restart(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    /// Queues a start of `unit` and returns without waiting for its job: the unit may wait
    /// for something the caller holds (the agent waits for the store this process has open).
    fn start_no_wait(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    /// Queues a restart of `unit` without waiting (see `start_no_wait`).
    fn restart_no_wait(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    fn reset_failed(&self, unit: &str) -> impl Future<Output = EffectResult> + Send;
    /// A transient timer that restarts `unit` after `delay_ms`.
    fn schedule_restart(
        &self,
        unit: &str,
        delay_ms: u64,
    ) -> impl Future<Output = EffectResult> + Send;
    fn machine_status(
        &self,
        side: Side,
    ) -> impl Future<Output = EffectResult<MachineStatus>> + Send;
    /// When the unit last became active, or `None` while it is not active.
    fn active_since(
        &self,
        unit: &str,
    ) -> impl Future<Output = EffectResult<Option<Timestamp>>> + Send;
    /// When the unit's current run began (it left inactive), while it is starting or active;
    /// `None` otherwise. A `Type=notify` unit asking about itself before it is ready is
    /// starting: its own run is already seen here, not yet by `active_since`.
    fn started_since(
        &self,
        unit: &str,
    ) -> impl Future<Output = EffectResult<Option<Timestamp>>> + Send;
}

/// containerd over gRPC.
pub trait Containerd: Send + Sync {
    /// Pulls `reference` (pinned by digest), verifying every blob, under a lease.
    fn pull(
        &self,
        reference: &str,
        digest: &Sha256Hex,
    ) -> impl Future<Output = EffectResult> + Send;
    fn image_present(&self, digest: &Sha256Hex) -> impl Future<Output = EffectResult<bool>> + Send;
    /// The candidate's self-check: the pulled image's `flexnode version` in a short-lived
    /// container, within a time limit; what it printed.
    fn check_image(&self, digest: &Sha256Hex) -> impl Future<Output = EffectResult<String>> + Send;
    /// Gives agent image `digest` (already in containerd, however it came) its local name,
    /// which the container units run (`effects::host::AGENT_IMAGE_NAME`); the name is removed
    /// with the image only if the agent pulled it.
    fn name_agent_image(&self, digest: &Sha256Hex) -> impl Future<Output = EffectResult> + Send;
    /// The digest the tag of `image` names: a node image pattern resolved, once, before the
    /// pull by that digest; in `archive` if that exists (an offline node's image archive, an
    /// OCI layout or a tar of one), else at the registry now.
    fn resolve_tag(
        &self,
        image: &ImageRef,
        archive: Option<&Path>,
    ) -> impl Future<Output = EffectResult<Sha256Hex>> + Send;
    /// [`Self::pull`] into the content store only, without snapshots: a node image, which is
    /// only ever unpacked into a machine's tree. Blobs come from `archive` when it exists and
    /// holds them, from the registry otherwise.
    fn pull_content(
        &self,
        reference: &str,
        digest: &Sha256Hex,
        archive: Option<&Path>,
    ) -> impl Future<Output = EffectResult> + Send;
    /// Unpacks pulled image `digest` into `dir`, a machine's tree (`clear_machine_tree`).
    fn unpack_image_into(
        &self,
        digest: &Sha256Hex,
        dir: &Path,
    ) -> impl Future<Output = EffectResult> + Send;
    /// Removes an image the agent pulled; others are never touched.
    fn remove_agent_image(&self, digest: &Sha256Hex) -> impl Future<Output = EffectResult> + Send;
}

/// Files and processes on the host: the agent install, nspawn rootfs, runtime files.
pub trait Host: Send + Sync {
    /// Places the running build as the first agent.
    fn install_agent(
        &self,
        mode: InstallMode,
        build: &AgentBuild,
    ) -> impl Future<Output = EffectResult> + Send;
    /// Downloads an archive with size caps while hashing, checks the digest, installs the
    /// single member into `build`'s slot.
    fn stage_archive(
        &self,
        url: &ArchiveUrl,
        sha256: &Sha256Hex,
        build: &AgentBuild,
    ) -> impl Future<Output = EffectResult> + Send;
    /// Runs the `version` of the build staged in `slot`; returns what it printed (an image
    /// candidate is checked by `Containerd::check_image`).
    fn check_candidate(&self, slot: Slot) -> impl Future<Output = EffectResult<String>> + Send;
    fn discard_candidate(&self, build: &AgentBuild) -> impl Future<Output = EffectResult> + Send;
    /// The build selected to run (host: `current` link; container: image selection).
    fn selected_agent(
        &self,
        mode: InstallMode,
    ) -> impl Future<Output = EffectResult<Option<AgentBuild>>> + Send;
    /// Atomically selects `to`, keeping `last_good` as the fallback.
    fn select_agent(
        &self,
        mode: InstallMode,
        to: &AgentBuild,
        last_good: &AgentBuild,
    ) -> impl Future<Output = EffectResult> + Send;
    /// Removes the agent's links (the installed builds stay for a re-join).
    fn remove_agent_links(&self) -> impl Future<Output = EffectResult> + Send;
    /// Whether any of the agent's links or selection files is still there.
    fn agent_links_present(&self) -> impl Future<Output = EffectResult<bool>> + Send;
    /// What a side's tree was provisioned as, if it was (its marker, written last).
    fn machine_rootfs(
        &self,
        side: Side,
    ) -> impl Future<Output = EffectResult<Option<MachineTree>>> + Send;
    /// Whether anything is at the side's tree, provisioned or not (an unpack cut short).
    fn machine_tree_exists(&self, side: Side) -> impl Future<Output = EffectResult<bool>> + Send;
    /// A minimal tree without a kubelet (the host's `/usr` bound in): no node image named.
    fn provision_machine(
        &self,
        side: Side,
        kubernetes_version: &str,
    ) -> impl Future<Output = EffectResult> + Send;
    /// An empty tree for `side`, for a node image to be unpacked into: whatever was there
    /// (half unpacked, another version) goes first. Its path as this process reaches it.
    fn clear_machine_tree(&self, side: Side) -> impl Future<Output = EffectResult<PathBuf>> + Send;
    /// Finishes a tree unpacked from node image `image` for `goal`: the kubelet's and
    /// containerd's files (the Node's labels and taints among them), the machine's nspawn
    /// settings, then the marker.
    fn complete_machine(
        &self,
        side: Side,
        goal: &Goal,
        image: &Sha256Hex,
    ) -> impl Future<Output = EffectResult> + Send;
    fn remove_machine(&self, side: Side) -> impl Future<Output = EffectResult> + Send;
    fn runtime_present(&self) -> impl Future<Output = EffectResult<bool>> + Send;
    /// Comments out the swap lines of the host's `/etc/fstab` (none, or no fstab: nothing).
    fn comment_out_swap(&self) -> impl Future<Output = EffectResult> + Send;
    /// Loads the kernel modules the machines need (by the host's `modprobe`, in the host's
    /// root), and lists them for every boot.
    fn load_kernel_modules(&self) -> impl Future<Output = EffectResult> + Send;
    /// Removes the node's runtime files (config, credentials, image selection, module list).
    fn wipe_runtime(&self) -> impl Future<Output = EffectResult> + Send;
}

/// What became of an eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted: the pod is being deleted.
    Evicted,
    /// No such pod any more.
    Gone,
    /// Refused to keep a PodDisruptionBudget: the budgets (`namespace/name`) that select the
    /// pod and allow no disruption now.
    Blocked { budgets: Vec<String> },
}

/// The API server: MachineOperation and Machine status, and this node's `Node` and pods.
pub trait Publisher: Send + Sync {
    /// The node's `Node` as the API server has it now; `None` when there is none.
    fn node_seen(&self) -> impl Future<Output = EffectResult<Option<NodeSeen>>> + Send;
    /// `started_at` becomes `startedAt` unless one is there; `machine_generation` (0 = no
    /// Machine) the `observedMachineGeneration`.
    fn report_progress(
        &self,
        op: &OpRef,
        message: &str,
        machine_generation: i64,
        started_at: Timestamp,
    ) -> impl Future<Output = EffectResult> + Send;
    fn publish_result(
        &self,
        op: &OpRef,
        result: &OpResult,
        completed_at: Timestamp,
    ) -> impl Future<Output = EffectResult> + Send;
    fn report_machine(
        &self,
        phase: MachinePhase,
        message: &str,
        observed_generation: Option<i64>,
    ) -> impl Future<Output = EffectResult> + Send;
    /// Cordons the Node with `holder`'s mark (`flexnode.io/cordoned-by`; checked and written as
    /// one, by resourceVersion), taking over a cordon an earlier drain marked; whether the
    /// Node carries `holder`'s mark now: not without a Node, nor when someone else cordoned it
    /// (no mark), whose cordon stays theirs.
    fn cordon(&self, holder: &str) -> impl Future<Output = EffectResult<bool>> + Send;
    /// Lifts the cordon if the Node carries the agent's mark (and removes the mark); whether
    /// it did. A cordon without the mark stays.
    fn uncordon(&self, holder: &str) -> impl Future<Output = EffectResult<bool>> + Send;
    /// The pods bound to this node.
    fn pods_on_node(&self) -> impl Future<Output = EffectResult<Vec<PodFacts>>> + Send;
    /// Asks the Eviction API to evict `pod`.
    fn evict(&self, pod: &PodFacts) -> impl Future<Output = EffectResult<Eviction>> + Send;
    /// The budgets selecting any of `pods` that do not count all their pods healthy yet
    /// (`namespace/name (H of E healthy)`): the evicted replicas not yet Ready elsewhere.
    fn budgets_recovering(
        &self,
        pods: &[PodFacts],
    ) -> impl Future<Output = EffectResult<Vec<String>>> + Send;
}

/// Everything the executor drives, by type (no dynamic dispatch).
#[derive(Debug)]
pub struct Effects<S, C, H, P> {
    pub systemd: S,
    pub containerd: C,
    pub host: H,
    pub publisher: P,
}
