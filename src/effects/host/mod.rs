//! The production [`Host`] for the host install: files and processes on the real filesystem,
//! every path under a root prefix ([`HostLayout`]; `/` in production, a temporary directory in
//! tests).
//!
//! Layout (the unit files in `units/host/` use these paths; docs/design.md, "The host install"):
//!
//! ```text
//! <root>/opt/flexnode/lib/flexnode-{blue,green}/flexnode   slots (dirs and binaries 0755)
//! <root>/opt/flexnode/current   -> lib/flexnode-<slot>     the selected build
//! <root>/opt/flexnode/last-good -> lib/flexnode-<slot>     the fallback (recovery unit)
//! <root>/opt/flexnode/bin/flexnode -> ../current/flexnode
//! <root>/etc/flexnode/                                      runtime files (config, credentials)
//! <root>/etc/flexnode/agent-image.env                       container install: image selection
//! <root>/var/lib/machines/<kube1|kube2>/                    nspawn machine trees
//! <root>/etc/systemd/nspawn/<side>.nspawn                   their nspawn settings
//! <root>/etc/modules-load.d/flexnode.conf                   the machines' kernel modules
//! ```
//!
//! Links and files are replaced atomically: a temporary entry in the same directory, fsync,
//! rename, fsync of the directory. Nothing here follows a symlink it removes. Every method is
//! idempotent: called again after a crash it finishes what is missing.

mod candidate;
mod exec;
pub mod kernel;
pub mod kubelet;
pub mod kubelet_plugin;
mod layout;
mod machines;
mod root;
pub mod sandbox_archive;
mod slots;
mod swap;

pub use candidate::{CHECK_OUTPUT_MAX, CHECK_PATH, DEFAULT_CHECK_TIMEOUT};
pub use exec::{HOST_EXEC_TIMEOUT, run_in_root};
pub use kernel::KERNEL_MODULES;
pub use kubelet::{
    KUBELET_ENV, KubeletCredential, KubeletInputs, KubeletSettings, KubeletSettingsError,
    KubeletSource, MachineFile, RegistryAccess, machine_files,
};
pub use kubelet_plugin::{KubeletPlugin, kubelet_plugin};
pub use layout::{
    AGENT_IMAGE_NAME, AGENT_IMAGE_VAR, BIN_LINK_TARGET, HostLayout, MACHINES_DIR_MODE,
    RUNTIME_DIR_MODE, agent_image_ref, image_ref_digest, running_build, slot_link_target,
};
pub use machines::{NSPAWN_KUBELET_SETTINGS, NSPAWN_SETTINGS};
pub use root::resolve_in_root;

use super::archive::ArchiveFetcher;
use super::fs::{io_failed, remove_no_follow, remove_tree, sync_existing_dir};
use super::{EffectError, EffectResult, Host, MachineTree};
use crate::lifecycle::agent::{AgentBuild, Arch, ArchiveUrl, InstallMode, Sha256Hex, Slot};
use crate::lifecycle::state::{Goal, Side};
use candidate::run_version;
use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::Duration;

/// The real host: see the module documentation.
#[derive(Clone, Debug)]
pub struct FsHost {
    layout: HostLayout,
    executable: PathBuf,
    check_timeout: Duration,
    fetcher: ArchiveFetcher,
    arch: Arch,
    os_release: Option<PathBuf>,
    /// What machines unpacked from a node image are given; `None` without node images.
    kubelet: Option<KubeletInputs>,
}

impl FsHost {
    /// The links and selection files a reset removes.
    fn agent_link_paths(&self) -> [PathBuf; 5] {
        let l = &self.layout;
        [
            l.current_link(),
            l.last_good_link(),
            l.bin_link(),
            l.agent_image_env(),
            l.agent_image_last_good_env(),
        ]
    }

    /// The host install on `layout`, copying the running executable (`/proc/self/exe`), for
    /// this build's architecture.
    pub fn new(layout: HostLayout) -> Self {
        Self {
            layout,
            executable: PathBuf::from("/proc/self/exe"),
            check_timeout: DEFAULT_CHECK_TIMEOUT,
            fetcher: ArchiveFetcher::new(),
            arch: Arch::from_rust(std::env::consts::ARCH),
            os_release: None,
            kubelet: None,
        }
    }

    /// Where the kubelet's settings for machines from a node image come from.
    pub fn with_kubelet(mut self, inputs: KubeletInputs) -> Self {
        self.kubelet = Some(inputs);
        self
    }

    /// The executable `install_agent` copies into a slot.
    pub fn with_executable(mut self, path: impl Into<PathBuf>) -> Self {
        self.executable = path.into();
        self
    }

    /// How long the candidate's `version` may run.
    pub fn with_check_timeout(mut self, timeout: Duration) -> Self {
        self.check_timeout = timeout;
        self
    }

    /// Downloader limits and timeouts.
    pub fn with_fetcher(mut self, fetcher: ArchiveFetcher) -> Self {
        self.fetcher = fetcher;
        self
    }

    /// The architecture whose archive member is installed.
    pub fn with_arch(mut self, arch: Arch) -> Self {
        self.arch = arch;
        self
    }

    /// The `os-release` copied into machines (default: `<root>/usr/lib/os-release`, else
    /// `<root>/etc/os-release`).
    pub fn with_os_release(mut self, path: impl Into<PathBuf>) -> Self {
        self.os_release = Some(path.into());
        self
    }

    pub fn layout(&self) -> &HostLayout {
        &self.layout
    }

    /// The slot this process runs from (`/proc/self/exe`), if any.
    pub fn running_build(&self) -> Option<AgentBuild> {
        let exe = std::fs::read_link("/proc/self/exe")
            .or_else(|_| std::env::current_exe())
            .ok()?;
        running_build(&self.layout, &exe)
    }

    /// Runs `f` on the blocking pool with a copy of this host.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&FsHost) -> EffectResult<T> + Send + 'static,
    ) -> EffectResult<T> {
        let host = self.clone();
        tokio::task::spawn_blocking(move || f(&host))
            .await
            .map_err(|e| EffectError::Failed(format!("host task failed: {e}")))?
    }

    fn wipe(&self) -> EffectResult {
        remove_no_follow(&self.layout.modules_load())?;
        let dir = self.layout.runtime_dir();
        remove_tree(&dir)?;
        if let Some(parent) = dir.parent() {
            sync_existing_dir(parent)?;
        }
        Ok(())
    }
}

fn mode_mismatch(mode: InstallMode, build: &AgentBuild) -> EffectError {
    EffectError::Failed(format!("the {} install cannot use {build}", mode.as_str()))
}

impl Host for FsHost {
    async fn install_agent(&self, mode: InstallMode, build: &AgentBuild) -> EffectResult {
        match (mode, build) {
            (InstallMode::Host, AgentBuild::Slot { slot }) => {
                let slot = *slot;
                self.blocking(move |h| h.install_slot(slot)).await
            }
            (InstallMode::Container, AgentBuild::Image { digest }) => {
                let digest = digest.clone();
                self.blocking(move |h| {
                    let path = h.layout.agent_image_env();
                    if h.read_image_selection(&path).ok().flatten()
                        == Some(AgentBuild::Image {
                            digest: digest.clone(),
                        })
                    {
                        return Ok(());
                    }
                    h.write_image_selection(&path, &digest)
                })
                .await
            }
            _ => Err(mode_mismatch(mode, build)),
        }
    }

    async fn stage_archive(
        &self,
        url: &ArchiveUrl,
        sha256: &Sha256Hex,
        build: &AgentBuild,
    ) -> EffectResult {
        let AgentBuild::Slot { slot } = build else {
            return Err(EffectError::Failed(
                "an archive installs into a slot".into(),
            ));
        };
        let slot = *slot;
        self.blocking(move |h| h.prepare_stage(slot)).await?;
        self.fetcher
            .install(url, sha256, self.arch, &self.layout.slot_dir(slot))
            .await
    }

    async fn check_candidate(&self, slot: Slot) -> EffectResult<String> {
        let build = &AgentBuild::Slot { slot };
        let binary = self.layout.slot_binary(slot);
        match std::fs::symlink_metadata(&binary) {
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(EffectError::Failed(format!(
                    "candidate {build}: {} is not a regular file",
                    binary.display()
                )));
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(EffectError::Failed(format!(
                    "candidate {build} is not installed"
                )));
            }
            Err(e) => return Err(io_failed("inspect", &binary, &e)),
        }
        run_version(build, &binary, self.check_timeout).await
    }

    async fn discard_candidate(&self, build: &AgentBuild) -> EffectResult {
        match build {
            AgentBuild::Slot { slot } => {
                let slot = *slot;
                self.blocking(move |h| h.discard_slot(slot)).await
            }
            // Images are containerd's (the executor removes the agent's own).
            AgentBuild::Image { .. } => Ok(()),
        }
    }

    async fn selected_agent(&self, mode: InstallMode) -> EffectResult<Option<AgentBuild>> {
        self.blocking(move |h| match mode {
            InstallMode::Host => Ok(h
                .slot_link(&h.layout.current_link())?
                .map(|slot| AgentBuild::Slot { slot })),
            InstallMode::Container => h.read_image_selection(&h.layout.agent_image_env()),
        })
        .await
    }

    async fn select_agent(
        &self,
        mode: InstallMode,
        to: &AgentBuild,
        last_good: &AgentBuild,
    ) -> EffectResult {
        match (mode, to, last_good) {
            (
                InstallMode::Host,
                AgentBuild::Slot { slot: to },
                AgentBuild::Slot { slot: last_good },
            ) => {
                let (to, last_good) = (*to, *last_good);
                self.blocking(move |h| h.select_slot(to, last_good)).await
            }
            (
                InstallMode::Container,
                AgentBuild::Image { digest: to },
                AgentBuild::Image { digest: last_good },
            ) => {
                let (to, last_good) = (to.clone(), last_good.clone());
                self.blocking(move |h| {
                    h.write_image_selection(&h.layout.agent_image_last_good_env(), &last_good)?;
                    h.write_image_selection(&h.layout.agent_image_env(), &to)
                })
                .await
            }
            (_, to, _) => Err(mode_mismatch(mode, to)),
        }
    }

    async fn remove_agent_links(&self) -> EffectResult {
        self.blocking(|h| {
            for path in h.agent_link_paths() {
                remove_no_follow(&path)?;
            }
            Ok(())
        })
        .await
    }

    async fn agent_links_present(&self) -> EffectResult<bool> {
        self.blocking(|h| {
            for path in h.agent_link_paths() {
                match std::fs::symlink_metadata(&path) {
                    Ok(_) => return Ok(true),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(io_failed("inspect", &path, &e)),
                }
            }
            Ok(false)
        })
        .await
    }

    async fn machine_rootfs(&self, side: Side) -> EffectResult<Option<MachineTree>> {
        self.blocking(move |h| h.read_marker(side)).await
    }

    async fn machine_tree_exists(&self, side: Side) -> EffectResult<bool> {
        self.blocking(move |h| {
            let dir = h.layout.machine_dir(side);
            match std::fs::symlink_metadata(&dir) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io_failed("inspect", &dir, &e)),
            }
        })
        .await
    }

    async fn clear_machine_tree(&self, side: Side) -> EffectResult<PathBuf> {
        self.blocking(move |h| h.clear_tree(side)).await
    }

    async fn complete_machine(&self, side: Side, goal: &Goal, image: &Sha256Hex) -> EffectResult {
        let (goal, image) = (goal.clone(), image.clone());
        self.blocking(move |h| h.complete(side, &goal, &image))
            .await
    }

    async fn provision_machine(&self, side: Side, kubernetes_version: &str) -> EffectResult {
        let version = kubernetes_version.to_string();
        self.blocking(move |h| h.provision(side, &version)).await
    }

    async fn remove_machine(&self, side: Side) -> EffectResult {
        self.blocking(move |h| h.remove_machine_tree(side)).await
    }

    async fn runtime_present(&self) -> EffectResult<bool> {
        self.blocking(|h| {
            for path in [h.layout.runtime_dir(), h.layout.modules_load()] {
                match std::fs::symlink_metadata(&path) {
                    Ok(_) => return Ok(true),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(io_failed("inspect", &path, &e)),
                }
            }
            Ok(false)
        })
        .await
    }

    async fn comment_out_swap(&self) -> EffectResult {
        self.blocking(|h| h.comment_out_fstab_swap()).await
    }

    async fn load_kernel_modules(&self) -> EffectResult {
        self.ensure_kernel_modules().await
    }

    async fn wipe_runtime(&self) -> EffectResult {
        self.blocking(|h| h.wipe()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::agent::Slot;
    use std::path::Path;

    #[test]
    fn layout_paths() {
        let l = HostLayout::at("/");
        assert_eq!(
            l.slot_binary(Slot::Blue),
            Path::new("/opt/flexnode/lib/flexnode-blue/flexnode")
        );
        assert_eq!(l.current_link(), Path::new("/opt/flexnode/current"));
        assert_eq!(l.last_good_link(), Path::new("/opt/flexnode/last-good"));
        assert_eq!(l.bin_link(), Path::new("/opt/flexnode/bin/flexnode"));
        assert_eq!(l.runtime_dir(), Path::new("/etc/flexnode"));
        assert_eq!(
            l.agent_image_env(),
            Path::new("/etc/flexnode/agent-image.env")
        );
        assert_eq!(
            l.machine_marker(Side::Kube2),
            Path::new("/var/lib/machines/kube2/etc/flexnode-machine.json")
        );
        assert_eq!(
            l.nspawn_file(Side::Kube1),
            Path::new("/etc/systemd/nspawn/kube1.nspawn")
        );
        assert_eq!(slot_link_target(Slot::Green), "lib/flexnode-green");
    }

    #[test]
    fn running_build_names_the_slot() {
        let l = HostLayout::at("/nonexistent-root");
        assert_eq!(
            running_build(
                &l,
                Path::new("/nonexistent-root/opt/flexnode/lib/flexnode-green/flexnode (deleted)")
            ),
            Some(AgentBuild::Slot { slot: Slot::Green })
        );
        assert_eq!(running_build(&l, Path::new("/usr/bin/flexnode")), None);
    }
}
