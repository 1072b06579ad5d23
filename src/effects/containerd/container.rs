//! Containers: created from a pulled image's top snapshot with an OCI runtime spec built in
//! `spec.rs`, started, stopped and deleted. Only containers labelled [`MANAGED_LABEL`] are
//! ever touched.

use super::manifest::{Manifest, config_diff_ids, is_index, media_type_of};
use super::spec::{
    BindMount, DEFAULT_PATH, ImageForContainer, MANAGED_LABEL, MANAGED_VALUE, RUNC_RUNTIME,
    SPEC_TYPE_URL, runtime_spec,
};
use super::{GrpcContainerd, chain_ids, grpc_failed, is_agent_pulled, parse_json, verify};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::Sha256Hex;
use containerd_client::services::v1::container::Runtime as ContainerRuntime;
use containerd_client::services::v1::snapshots::{
    MountsRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::{
    Container, CreateContainerRequest, CreateTaskRequest, DeleteContainerRequest,
    DeleteTaskRequest, GetContainerRequest, GetRequest, Image, KillRequest, ListContainersRequest,
    ListImagesRequest, StartRequest, WaitRequest, containers_client::ContainersClient,
    tasks_client::TasksClient,
};
use containerd_client::tonic::{Code, transport::Channel};
use containerd_client::types::v1::Status as TaskStatus;
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

const SIGTERM: u32 = 15;
const SIGKILL: u32 = 9;

/// Where a task's stdout and stderr go (stdin is always empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskIo {
    /// `/dev/null`.
    Null,
    /// Appended to these host files (created if missing) by the shim.
    Files {
        stdout: std::path::PathBuf,
        stderr: std::path::PathBuf,
    },
}

/// How `stop_container` ended a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StopOutcome {
    /// As containerd reports it (128 + signal for a killed process).
    pub exit_status: u32,
    /// SIGTERM was not enough within the grace period: SIGKILL was sent.
    pub killed: bool,
}

/// A task's state as containerd reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskState {
    pub pid: u32,
    /// `CREATED`, `RUNNING`, `STOPPED`, `PAUSED`, `PAUSING` or `UNKNOWN`.
    pub status: String,
    pub exit_status: u32,
}

impl GrpcContainerd {
    fn containers(&self) -> ContainersClient<Channel> {
        ContainersClient::new(self.channel.clone())
    }

    fn tasks(&self) -> TasksClient<Channel> {
        TasksClient::new(self.channel.clone())
    }

    /// Creates container `id` from the pulled image `image_digest`: a new active snapshot
    /// (key `id`) on the image's top chainID, and a container record (runtime runc v2, an OCI
    /// spec built here) labelled [`MANAGED_LABEL`]. `privileged`: every capability, no
    /// seccomp, every device (host `/dev` nodes and an allow-all device cgroup), `/sys`
    /// writable, nothing masked. Otherwise: containerd's default capabilities, masked and
    /// read-only `/proc` paths, the default device set. No seccomp profile is applied in either
    /// case, and no resource limits are set. New pid, ipc, uts, mount and network namespaces.
    ///
    /// Idempotent: an existing managed container of that id is left as it is.
    pub async fn create_container(
        &self,
        id: &str,
        image_digest: &Sha256Hex,
        args: &[String],
        privileged: bool,
        mounts: &[BindMount],
    ) -> EffectResult {
        check_container_id(id)?;
        if args.is_empty() {
            return Err(EffectError::Failed(format!(
                "container {id}: no process arguments"
            )));
        }
        for m in mounts {
            if !m.source.is_absolute() || !m.destination.starts_with('/') {
                return Err(EffectError::Failed(format!(
                    "container {id}: mount paths must be absolute ({} -> {})",
                    m.source.display(),
                    m.destination
                )));
            }
        }
        if let Some(existing) = self.container_record(id).await? {
            if is_managed(&existing.labels) {
                return Ok(());
            }
            return Err(EffectError::Failed(format!(
                "container {id} exists and was not created by flexnode; refusing to touch it"
            )));
        }
        let image = self.image_for_container(image_digest).await?;
        let spec = runtime_spec(&self.namespace, id, args, privileged, mounts, &image)?;
        let lease = self.create_lease("container").await?;
        let result = self.create_under_lease(id, &image, spec, &lease).await;
        let released = self.delete_lease(&lease).await;
        result?;
        released
    }

    async fn create_under_lease(
        &self,
        id: &str,
        image: &ImageForContainer,
        spec: Vec<u8>,
        lease: &str,
    ) -> EffectResult {
        let labels = HashMap::from([(MANAGED_LABEL.to_string(), MANAGED_VALUE.to_string())]);
        match self
            .snapshots()
            .prepare(self.req(
                PrepareSnapshotRequest {
                    snapshotter: self.snapshotter.clone(),
                    key: id.to_string(),
                    parent: image.top_chain_id.clone(),
                    labels: labels.clone(),
                },
                Some(lease),
            ))
            .await
        {
            Ok(_) => {}
            // Left by an earlier attempt that crashed before the record: reuse it.
            Err(s) if s.code() == Code::AlreadyExists => {}
            Err(s) => {
                return Err(grpc_failed(
                    &format!("container {id}: prepare snapshot"),
                    &s,
                ));
            }
        }
        let container = Container {
            id: id.to_string(),
            labels,
            image: image.name.clone(),
            runtime: Some(ContainerRuntime {
                name: RUNC_RUNTIME.to_string(),
                options: None,
            }),
            spec: Some(prost_types::Any {
                type_url: SPEC_TYPE_URL.to_string(),
                value: spec,
            }),
            snapshotter: self.snapshotter.clone(),
            snapshot_key: id.to_string(),
            ..Default::default()
        };
        match self
            .containers()
            .create(self.req(
                CreateContainerRequest {
                    container: Some(container),
                },
                Some(lease),
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::AlreadyExists => Ok(()),
            Err(s) => Err(grpc_failed(&format!("create container {id}"), &s)),
        }
    }

    /// Creates and starts the task of container `id` (its rootfs: the snapshot's mounts);
    /// returns the PID of its first process. A task already running: its PID.
    pub async fn start_container(&self, id: &str, io: &TaskIo) -> EffectResult<u32> {
        check_container_id(id)?;
        let record = self
            .container_record(id)
            .await?
            .ok_or_else(|| EffectError::Failed(format!("container {id} does not exist")))?;
        if let Some(task) = self.task_state(id).await? {
            match task.status.as_str() {
                "RUNNING" => return Ok(task.pid),
                "CREATED" => {}
                _ => {
                    // A task that ran and ended: clear it to start afresh.
                    self.delete_task(id).await?;
                }
            }
        }
        if self.task_state(id).await?.is_none() {
            let rootfs = self
                .snapshots()
                .mounts(self.req(
                    MountsRequest {
                        snapshotter: record.snapshotter.clone(),
                        key: record.snapshot_key.clone(),
                    },
                    None,
                ))
                .await
                .map_err(|s| grpc_failed(&format!("container {id}: snapshot mounts"), &s))?
                .into_inner()
                .mounts;
            let (stdout, stderr) = match io {
                TaskIo::Null => (String::new(), String::new()),
                TaskIo::Files { stdout, stderr } => (file_uri(stdout)?, file_uri(stderr)?),
            };
            self.tasks()
                .create(self.req(
                    CreateTaskRequest {
                        container_id: id.to_string(),
                        rootfs,
                        stdout,
                        stderr,
                        ..Default::default()
                    },
                    None,
                ))
                .await
                .map_err(|s| grpc_failed(&format!("create task {id}"), &s))?;
        }
        let started = self
            .tasks()
            .start(self.req(
                StartRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                },
                None,
            ))
            .await;
        match started {
            Ok(r) => Ok(r.into_inner().pid),
            Err(s) => {
                // Leave no half-made task behind.
                let _ = self.delete_task(id).await;
                Err(grpc_failed(&format!("start task {id}"), &s))
            }
        }
    }

    /// The state of container `id`'s task, `None` when it has none.
    pub async fn task_state(&self, id: &str) -> EffectResult<Option<TaskState>> {
        match self
            .tasks()
            .get(self.req(
                GetRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                },
                None,
            ))
            .await
        {
            Ok(r) => Ok(r.into_inner().process.map(|p| TaskState {
                pid: p.pid,
                status: TaskStatus::try_from(p.status)
                    .unwrap_or(TaskStatus::Unknown)
                    .as_str_name()
                    .to_string(),
                exit_status: p.exit_status,
            })),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(grpc_failed(&format!("get task {id}"), &s)),
        }
    }

    /// Stops container `id`'s task: SIGTERM to its first process, up to `grace` for it to end,
    /// then SIGKILL to every process of the task; then the task is deleted. `None`: there was
    /// no task.
    pub async fn stop_container(
        &self,
        id: &str,
        grace: Duration,
    ) -> EffectResult<Option<StopOutcome>> {
        check_container_id(id)?;
        let Some(task) = self.task_state(id).await? else {
            return Ok(None);
        };
        let mut killed = false;
        let exit_status = if task.status == "STOPPED" {
            task.exit_status
        } else {
            let termed = if task.status == "RUNNING" || task.status == "PAUSED" {
                self.kill_task(id, SIGTERM, false).await?;
                tokio::time::timeout(grace, self.wait_task(id)).await.ok()
            } else {
                None
            };
            match termed {
                Some(status) => status?,
                None => {
                    killed = true;
                    self.kill_task(id, SIGKILL, true).await?;
                    tokio::time::timeout(Duration::from_secs(30), self.wait_task(id))
                        .await
                        .map_err(|_| {
                            EffectError::Failed(format!(
                                "container {id}: task still running 30 s after SIGKILL"
                            ))
                        })??
                }
            }
        };
        self.delete_task(id).await?;
        Ok(Some(StopOutcome {
            exit_status,
            killed,
        }))
    }

    async fn kill_task(&self, id: &str, signal: u32, all: bool) -> EffectResult {
        match self
            .tasks()
            .kill(self.req(
                KillRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                    signal,
                    all,
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(()),
            // Already gone (exited between the state read and the signal).
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed(&format!("signal {signal} to task {id}"), &s)),
        }
    }

    /// Waits until the task's first process has exited; its exit status.
    pub(super) async fn wait_task(&self, id: &str) -> EffectResult<u32> {
        self.tasks()
            .wait(self.req(
                WaitRequest {
                    container_id: id.to_string(),
                    exec_id: String::new(),
                },
                None,
            ))
            .await
            .map(|r| r.into_inner().exit_status)
            .map_err(|s| grpc_failed(&format!("wait for task {id}"), &s))
    }

    async fn delete_task(&self, id: &str) -> EffectResult {
        match self
            .tasks()
            .delete(self.req(
                DeleteTaskRequest {
                    container_id: id.to_string(),
                },
                None,
            ))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed(&format!("delete task {id}"), &s)),
        }
    }

    /// Deletes container `id` and its snapshot. Refused while it has a running task (stop it
    /// first) and for containers the agent did not create. Absent: nothing to do (a managed
    /// snapshot left under the key by a crash is still removed).
    pub async fn delete_container(&self, id: &str) -> EffectResult {
        check_container_id(id)?;
        let record = self.container_record(id).await?;
        let (snapshotter, key) = match &record {
            Some(c) => {
                if !is_managed(&c.labels) {
                    return Err(EffectError::Failed(format!(
                        "container {id} was not created by flexnode (no {MANAGED_LABEL} label); \
                         refusing to delete it"
                    )));
                }
                (c.snapshotter.clone(), c.snapshot_key.clone())
            }
            None => (self.snapshotter.clone(), id.to_string()),
        };
        if let Some(task) = self.task_state(id).await? {
            if task.status != "STOPPED" && task.status != "CREATED" {
                return Err(EffectError::Failed(format!(
                    "container {id}: its task is {}; stop it before deleting",
                    task.status
                )));
            }
            self.delete_task(id).await?;
        }
        if record.is_some() {
            match self
                .containers()
                .delete(self.req(DeleteContainerRequest { id: id.to_string() }, None))
                .await
            {
                Ok(_) => {}
                Err(s) if s.code() == Code::NotFound => {}
                Err(s) => return Err(grpc_failed(&format!("delete container {id}"), &s)),
            }
        }
        // The snapshot: only if it is ours (labelled), whether the record was there or not.
        let info = match self
            .snapshots()
            .stat(self.req(
                StatSnapshotRequest {
                    snapshotter: snapshotter.clone(),
                    key: key.clone(),
                },
                None,
            ))
            .await
        {
            Ok(r) => r.into_inner().info,
            Err(s) if s.code() == Code::NotFound => return Ok(()),
            Err(s) => return Err(grpc_failed(&format!("container {id}: stat snapshot"), &s)),
        };
        if !info.as_ref().is_some_and(|i| is_managed(&i.labels)) {
            if record.is_some() {
                tracing::warn!(container = id, snapshot = %key, "snapshot not labelled as flexnode's; left in place");
            }
            return Ok(());
        }
        match self
            .snapshots()
            .remove(self.req(RemoveSnapshotRequest { snapshotter, key }, None))
            .await
        {
            Ok(_) => Ok(()),
            Err(s) if s.code() == Code::NotFound => Ok(()),
            Err(s) => Err(grpc_failed(&format!("container {id}: remove snapshot"), &s)),
        }
    }

    /// Ids of the containers labelled [`MANAGED_LABEL`] in the namespace.
    pub async fn managed_containers(&self) -> EffectResult<Vec<String>> {
        let list = self
            .containers()
            .list(self.req(
                ListContainersRequest {
                    filters: vec![format!("labels.\"{MANAGED_LABEL}\"=={MANAGED_VALUE}")],
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed("list containers", &s))?
            .into_inner();
        let mut ids: Vec<String> = list
            .containers
            .into_iter()
            .filter(|c| is_managed(&c.labels))
            .map(|c| c.id)
            .collect();
        ids.sort();
        Ok(ids)
    }

    async fn container_record(&self, id: &str) -> EffectResult<Option<Container>> {
        match self
            .containers()
            .get(self.req(GetContainerRequest { id: id.to_string() }, None))
            .await
        {
            Ok(r) => Ok(r.into_inner().container),
            Err(s) if s.code() == Code::NotFound => Ok(None),
            Err(s) => Err(grpc_failed(&format!("get container {id}"), &s)),
        }
    }

    /// The platform manifest and config of pulled image `digest` (from its image record, an
    /// agent-pulled one preferred), read back from the content store and verified.
    pub(super) async fn pulled_manifest(&self, digest: &Sha256Hex) -> EffectResult<PulledManifest> {
        let want = digest.oci();
        let mut images: Vec<Image> = self
            .images()
            .list(self.req(
                ListImagesRequest {
                    filters: vec![format!("target.digest==\"{want}\"")],
                },
                None,
            ))
            .await
            .map_err(|s| grpc_failed("list images", &s))?
            .into_inner()
            .images
            .into_iter()
            .filter(|i| i.target.as_ref().map(|t| t.digest.as_str()) == Some(want.as_str()))
            .collect();
        images.sort_by_key(|i| !is_agent_pulled(i));
        let image = images.into_iter().next().ok_or_else(|| {
            EffectError::Failed(format!("image {want} is not pulled (no image record)"))
        })?;
        let target = image.target.clone().unwrap_or_default();
        let top = self.read_content(&want, target.size, None).await?;
        verify(
            &top,
            &want,
            Some(target.size),
            "manifest",
            "the content store",
        )?;
        let top_json = parse_json(&top, "manifest", &want)?;
        let manifest_bytes = if is_index(&media_type_of(&top_json, Some(&target.media_type))) {
            let (_, desc) = self.pick_platform(&top_json, &want)?;
            let bytes = self.read_content(&desc.digest, desc.size, None).await?;
            verify(
                &bytes,
                &desc.digest,
                Some(desc.size),
                "manifest",
                "the content store",
            )?;
            bytes
        } else {
            top
        };
        let manifest = Manifest::parse(&manifest_bytes, &want)?;
        let config = self
            .read_content(&manifest.config.digest, manifest.config.size, None)
            .await?;
        verify(
            &config,
            &manifest.config.digest,
            Some(manifest.config.size),
            "config",
            "the content store",
        )?;
        Ok(PulledManifest {
            name: image.name,
            manifest,
            config,
        })
    }

    /// The pulled image of `digest` (a record, agent-pulled preferred), resolved to its top
    /// chainID (which must be unpacked in this snapshotter) and its config's Env and WorkingDir.
    async fn image_for_container(&self, digest: &Sha256Hex) -> EffectResult<ImageForContainer> {
        let PulledManifest {
            name,
            manifest,
            config,
        } = self.pulled_manifest(digest).await?;
        let want = digest.oci();
        let diff_ids = config_diff_ids(&config, &manifest.config.digest)?;
        let top_chain_id = chain_ids(&diff_ids).pop().ok_or_else(|| {
            EffectError::Failed(format!("image {want}: the config lists no layers"))
        })?;
        if !self.snapshot_exists(&top_chain_id).await? {
            return Err(EffectError::Failed(format!(
                "image {want} is not unpacked in the {} snapshotter (no snapshot {top_chain_id})",
                self.snapshotter
            )));
        }
        let cfg = parse_json(&config, "config", &manifest.config.digest)?;
        let cfg = cfg.get("config");
        let mut env: Vec<String> = cfg
            .and_then(|c| c.get("Env"))
            .and_then(|e| e.as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        if !env.iter().any(|e| e.starts_with("PATH=")) {
            env.insert(0, DEFAULT_PATH.to_string());
        }
        let cwd = cfg
            .and_then(|c| c.get("WorkingDir"))
            .and_then(|w| w.as_str())
            .filter(|w| w.starts_with('/'))
            .unwrap_or("/")
            .to_string();
        Ok(ImageForContainer {
            name,
            top_chain_id,
            env,
            cwd,
        })
    }
}

/// A pulled image as the content store holds it: its record's name, platform manifest, config.
pub(super) struct PulledManifest {
    pub(super) name: String,
    pub(super) manifest: Manifest,
    pub(super) config: Vec<u8>,
}

fn is_managed(labels: &HashMap<String, String>) -> bool {
    labels.get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_VALUE)
}

/// Container ids as containerd accepts them (`[A-Za-z0-9][A-Za-z0-9_.-]*`, at most 76).
fn check_container_id(id: &str) -> EffectResult {
    let ok = !id.is_empty()
        && id.len() <= 76
        && id.as_bytes()[0].is_ascii_alphanumeric()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(EffectError::Failed(format!("invalid container id {id:?}")))
    }
}

/// `file://` URI of an absolute host path, for the shim's stdio.
fn file_uri(path: &Path) -> EffectResult<String> {
    let s = path
        .to_str()
        .filter(|s| s.starts_with('/'))
        .ok_or_else(|| {
            EffectError::Failed(format!(
                "task output {} must be an absolute UTF-8 path",
                path.display()
            ))
        })?;
    if s.bytes()
        .any(|b| b.is_ascii_control() || b == b'%' || b == b'?' || b == b'#')
    {
        return Err(EffectError::Failed(format!(
            "task output path {s:?} has characters a file:// URI cannot carry"
        )));
    }
    Ok(format!("file://{s}"))
}
