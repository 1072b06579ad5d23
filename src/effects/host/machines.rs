//! The nspawn machine trees: unpacked from a node image (cleared, then completed with the
//! kubelet's files and settings) or, with no node image configured, a minimal bootable root;
//! provisioned for a Kubernetes version (a marker, written last, records which and from what
//! image), moved aside in one step and then deleted.

use super::FsHost;
use super::kubelet::{KubeletInputs, KubeletSource, MachineFile, files_from};
use super::layout::MACHINES_DIR_MODE;
use super::root::resolve_in_root;
use crate::effects::fs::{
    TempFile, create_parents, ensure_real_dir, io_failed, read_small, remove_no_follow,
    remove_tree, replace_symlink, sweep_temps, sync_dir, sync_filesystem, write_file_atomic,
};
use crate::effects::{EffectError, EffectResult, MachineTree};
use crate::lifecycle::agent::Sha256Hex;
use crate::lifecycle::state::{Goal, Side};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// Settings of every nspawn machine: the host's `/usr` read-only, host networking, no user
/// namespace, so `systemd-nspawn@<side>.service` boots the host's systemd.
pub const NSPAWN_SETTINGS: &str = "\
[Exec]
PrivateUsers=no

[Files]
BindReadOnly=/usr

[Network]
VirtualEthernet=no
";
/// Settings of a machine unpacked from a node image, which runs a kubelet and its containerd
/// (docs/node.md): its own systemd, every capability, the host's network and kernel modules,
/// the kernel log for the kubelet's OOM watcher. CNI's state lasts one machine boot (a
/// tmpfs): its cached results name network namespaces that die with the machine, and a power
/// cut can leave one an empty file that fails every later teardown of the pod's old sandbox,
/// so the pod never comes back (seen in the host suite).
pub const NSPAWN_KUBELET_SETTINGS: &str = "\
[Exec]
Boot=yes
PrivateUsers=no
Capability=all
SystemCallFilter=@keyring bpf perf_event_open

[Files]
BindReadOnly=/lib/modules
Bind=/dev/kmsg
TemporaryFileSystem=/var/lib/cni

[Network]
VirtualEthernet=no
";
/// The kubelet's rotated client certificate and key (a link to the current dated file) and
/// the kubeconfig naming it, in a machine's tree (the kubelet's `--kubeconfig`).
const KUBELET_CLIENT_CERT: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";
const KUBELET_KUBECONFIG: &str = "var/lib/kubelet/kubeconfig";

impl FsHost {
    pub(super) fn os_release_source(&self) -> EffectResult<PathBuf> {
        if let Some(p) = &self.os_release {
            return Ok(p.clone());
        }
        let root = &self.layout.root;
        let candidates = ["usr/lib/os-release", "etc/os-release"]
            .map(|p| resolve_in_root(root, Path::new(p)).unwrap_or_else(|_| root.join(p)));
        candidates
            .iter()
            .find(|p| p.is_file())
            .cloned()
            .ok_or_else(|| {
                EffectError::Failed(format!(
                    "no os-release for the machine: neither {} nor {} exists",
                    candidates[0].display(),
                    candidates[1].display()
                ))
            })
    }

    pub(super) fn read_marker(&self, side: Side) -> EffectResult<Option<MachineTree>> {
        let dir = self.layout.machine_dir(side);
        match std::fs::symlink_metadata(&dir) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_failed("inspect", &dir, &e)),
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(EffectError::Failed(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
        }
        let marker = self.layout.machine_marker(side);
        if std::fs::symlink_metadata(dir.join("etc")).is_ok_and(|m| !m.is_dir()) {
            return Ok(None);
        }
        let Some(text) = read_small(&marker, 4096, false)? else {
            return Ok(None);
        };
        let value = serde_json::from_str::<serde_json::Value>(&text).ok();
        let field = |k: &str| {
            value
                .as_ref()
                .and_then(|v| v.get(k)?.as_str().map(str::to_string))
        };
        let image = field("image").map(|d| Sha256Hex::parse(&d));
        let generation = value.as_ref().and_then(|v| v.get("generation")?.as_i64());
        match (field("kubernetesVersion"), image) {
            (Some(kubernetes_version), None) => Ok(Some(MachineTree {
                kubernetes_version,
                image: None,
                generation: None,
            })),
            (Some(kubernetes_version), Some(Some(digest))) => Ok(Some(MachineTree {
                kubernetes_version,
                image: Some(digest),
                generation,
            })),
            // Only our own atomic writes make this file: a bad one is re-provisioned.
            _ => {
                tracing::warn!(path = %marker.display(), "machine marker unreadable; ignoring it");
                Ok(None)
            }
        }
    }

    /// The side's tree made empty (a crash half-way through an unpack leaves no marker; a tree
    /// of another version has one): moved aside and deleted, then created again.
    pub(super) fn clear_tree(&self, side: Side) -> EffectResult<PathBuf> {
        self.remove_machine_tree(side)?;
        let l = &self.layout;
        let machines = l.machines_dir();
        create_parents(&machines)?;
        ensure_real_dir(&machines, MACHINES_DIR_MODE)?;
        let root = l.machine_dir(side);
        ensure_real_dir(&root, 0o755)?;
        Ok(root)
    }

    /// A tree unpacked from `image` for `goal`: the kubelet's files, its nspawn settings, the
    /// marker.
    pub(super) fn complete(&self, side: Side, goal: &Goal, image: &Sha256Hex) -> EffectResult {
        let inputs = self.kubelet.as_ref().ok_or_else(|| {
            EffectError::Failed("no kubelet settings: the configuration names no node image".into())
        })?;
        let l = &self.layout;
        let root = l.machine_dir(side);
        let mut files = files_from(inputs, &goal.node)?;
        files.extend(self.kubelet_identity(side.other())?);
        for f in files {
            // Resolved inside the tree: the image's own links never lead a write out of it.
            let path = resolve_in_root(&root, &f.path)
                .map_err(|e| io_failed("resolve", &root.join(&f.path), &e))?;
            create_parents(&path)?;
            write_file_atomic(&path, &f.contents, f.mode)?;
        }
        let nspawn = l.nspawn_dir();
        create_parents(&nspawn)?;
        ensure_real_dir(&nspawn, 0o755)?;
        write_file_atomic(
            &l.nspawn_file(side),
            NSPAWN_KUBELET_SETTINGS.as_bytes(),
            0o644,
        )?;
        // The tree on disk before the marker says it is whole.
        sync_filesystem(&root)?;
        let marker = serde_json::json!({
            "kubernetesVersion": goal.kubernetes_version,
            "image": image.oci(),
            "generation": goal.generation,
        });
        write_file_atomic(
            &l.machine_marker(side),
            format!("{marker}\n").as_bytes(),
            0o644,
        )
    }

    /// The kubelet's plugin in each whole machine tree made the running agent's build, and the
    /// files it reads the host's, where they differ (the daemon of an AgentUpgrade starting; a
    /// client secret replaced): the kubelet runs the agent's build with the node's secret.
    /// Returns how many files it replaced.
    pub fn refresh_kubelet_plugin(&self) -> EffectResult<usize> {
        let Some(KubeletInputs {
            credential: KubeletSource::Exec(plugin),
            ..
        }) = &self.kubelet
        else {
            return Ok(0);
        };
        let mut replaced = 0;
        for (from, to, mode) in plugin.files() {
            let contents = std::fs::read(&from).map_err(|e| io_failed("read", &from, &e))?;
            for side in [Side::Kube1, Side::Kube2] {
                if self.read_marker(side)?.is_none() {
                    continue;
                }
                let root = self.layout.machine_dir(side);
                let path = resolve_in_root(&root, &to)
                    .map_err(|e| io_failed("resolve", &root.join(&to), &e))?;
                if std::fs::read(&path).is_ok_and(|b| b == contents) {
                    continue;
                }
                create_parents(&path)?;
                write_file_atomic(&path, &contents, mode)?;
                replaced += 1;
            }
        }
        Ok(replaced)
    }

    pub(super) fn provision(&self, side: Side, kubernetes_version: &str) -> EffectResult {
        let l = &self.layout;
        let machines = l.machines_dir();
        create_parents(&machines)?;
        ensure_real_dir(&machines, MACHINES_DIR_MODE)?;
        sweep_trash(&machines, side)?;
        let root = l.machine_dir(side);
        // A different version being provisioned: the old marker goes first.
        if self
            .read_marker(side)?
            .is_some_and(|t| t.kubernetes_version != kubernetes_version || t.image.is_some())
        {
            remove_no_follow(&l.machine_marker(side))?;
        }
        ensure_real_dir(&root, 0o755)?;
        for (name, mode) in [
            ("usr", 0o755),
            ("etc", 0o755),
            ("var", 0o755),
            ("tmp", 0o1777),
            ("proc", 0o555),
            ("sys", 0o555),
            ("dev", 0o755),
            ("run", 0o755),
            ("root", 0o700),
        ] {
            ensure_real_dir(&root.join(name), mode)?;
        }
        for (name, target) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            replace_symlink(&root.join(name), target)?;
        }
        let etc = root.join("etc");
        sweep_temps(&etc)?;
        let source = self.os_release_source()?;
        let os_release = read_small(&source, 64 << 10, true)?
            .ok_or_else(|| EffectError::Failed(format!("read {}: not found", source.display())))?;
        write_file_atomic(&etc.join("os-release"), os_release.as_bytes(), 0o644)?;
        let machine_id = etc.join("machine-id");
        if std::fs::symlink_metadata(&machine_id).is_err() {
            write_file_atomic(&machine_id, b"", 0o444)?;
        }
        let nspawn = l.nspawn_dir();
        create_parents(&nspawn)?;
        ensure_real_dir(&nspawn, 0o755)?;
        write_file_atomic(&l.nspawn_file(side), NSPAWN_SETTINGS.as_bytes(), 0o644)?;
        let marker = serde_json::json!({ "kubernetesVersion": kubernetes_version });
        write_file_atomic(
            &l.machine_marker(side),
            format!("{marker}\n").as_bytes(),
            0o644,
        )
    }

    /// The client certificate side `from`'s kubelet holds (and its kubeconfig naming it), as
    /// files for the other side: a repave's new kubelet starts as the same Node without the
    /// bootstrap token, which may have expired or been deleted since the join. Nothing when
    /// `from` has none (the first join; a kubelet that never got one).
    fn kubelet_identity(&self, from: Side) -> EffectResult<Vec<MachineFile>> {
        let tree = self.layout.machine_dir(from);
        if std::fs::symlink_metadata(&tree).is_err() {
            return Ok(Vec::new());
        }
        let mut files = Vec::new();
        for rel in [KUBELET_CLIENT_CERT, KUBELET_KUBECONFIG] {
            let path = resolve_in_root(&tree, Path::new(rel))
                .map_err(|e| io_failed("resolve", &tree.join(rel), &e))?;
            match read_small(&path, 1 << 20, true)? {
                Some(text) => files.push(MachineFile {
                    path: PathBuf::from(rel),
                    contents: text.into_bytes(),
                    mode: 0o600,
                }),
                None => return Ok(Vec::new()),
            }
        }
        tracing::info!(
            from = from.name(),
            "the kubelet's client certificate carried over"
        );
        Ok(files)
    }

    pub(super) fn remove_machine_tree(&self, side: Side) -> EffectResult {
        let l = &self.layout;
        remove_no_follow(&l.nspawn_file(side))?;
        let machines = l.machines_dir();
        let root = l.machine_dir(side);
        match std::fs::symlink_metadata(&root) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_failed("inspect", &root, &e)),
            Ok(m) if m.is_dir() => {
                // Out of the way in one step (the marker goes with it), then deleted.
                let trash = TempFile::name_in(&machines, &format!("{}.removing", side.name()))?;
                std::fs::rename(&root, trash.path())
                    .map_err(|e| io_failed("move away", &root, &e))?;
                sync_dir(&machines)?;
                remove_tree(trash.path())?;
                trash.keep();
            }
            Ok(_) => remove_no_follow(&root)?,
        }
        if std::fs::symlink_metadata(&machines).is_ok() {
            sweep_trash(&machines, side)?;
        }
        Ok(())
    }
}

/// Removes machine trees a crash left half-removed (`.<side>.removing.*.tmp`).
fn sweep_trash(machines: &Path, side: Side) -> EffectResult {
    let prefix = format!(".{}.removing.", side.name());
    let entries = match std::fs::read_dir(machines) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_failed("list", machines, &e)),
        Ok(entries) => entries,
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_failed("list", machines, &e))?;
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            remove_tree(&entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::kubelet::{KubeletInputs, KubeletSource};
    use super::super::kubelet_plugin::{PLUGIN_BINARY, kubelet_plugin};
    use super::*;
    use crate::effects::host::HostLayout;
    use std::os::unix::fs::PermissionsExt;

    /// A host whose kubelet runs the agent's plugin, its agent binary and client secret in
    /// `dir`, with kube1 whole.
    fn exec_host(dir: &Path) -> FsHost {
        std::fs::write(dir.join("agent"), b"build 1").expect("agent");
        std::fs::write(dir.join("secret"), b"s3cret-1").expect("secret");
        let args: Vec<String> = [
            "--token-url",
            "https://idp.example/token",
            "--client-id",
            "a",
        ]
        .iter()
        .map(|a| a.to_string())
        .chain([
            "--client-secret-file".to_string(),
            dir.join("secret").display().to_string(),
        ])
        .collect();
        let plugin = kubelet_plugin(&args, &dir.join("agent")).expect("plugin");
        let host = FsHost::new(HostLayout::at(dir.join("root"))).with_kubelet(KubeletInputs {
            node_name: "edge-07".into(),
            server: "https://10.0.2.100:6443".into(),
            ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec(),
            credential: KubeletSource::Exec(plugin),
            trusted_ca_file: None,
            registry_credentials_file: None,
            sandbox_image: crate::config::DEFAULT_SANDBOX_IMAGE.into(),
            sandbox_image_archive: None,
            pod_cidr: "10.88.0.0/16".into(),
            tuning: Default::default(),
        });
        host.clear_tree(Side::Kube1).expect("tree");
        let digest = Sha256Hex::parse(&"ab".repeat(32)).expect("digest");
        host.complete(Side::Kube1, &Goal::new(1, "v1.34.12"), &digest)
            .expect("complete");
        host
    }

    #[test]
    fn a_daemon_start_gives_the_kubelet_the_agents_build_and_the_nodes_secret() {
        let dir = tempfile::tempdir().expect("tmp");
        let host = exec_host(dir.path());
        let tree = dir.path().join("root/var/lib/machines/kube1");
        let binary = tree.join(PLUGIN_BINARY);
        let secret = tree.join("etc/kubernetes/exec/client-secret-file/secret");
        assert_eq!(std::fs::read(&binary).expect("binary"), b"build 1");
        assert_eq!(std::fs::read(&secret).expect("secret"), b"s3cret-1");
        assert_eq!(host.refresh_kubelet_plugin(), Ok(0), "nothing differs");
        // An upgrade's build starts; the secret was replaced.
        std::fs::write(dir.path().join("agent"), b"build 2").expect("agent");
        std::fs::write(dir.path().join("secret"), b"s3cret-2").expect("secret");
        assert_eq!(host.refresh_kubelet_plugin(), Ok(2));
        assert_eq!(std::fs::read(&binary).expect("binary"), b"build 2");
        assert_eq!(std::fs::read(&secret).expect("secret"), b"s3cret-2");
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!((mode(&binary), mode(&secret)), (0o755, 0o600));
    }
}
