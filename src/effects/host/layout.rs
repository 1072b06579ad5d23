//! Where the host install keeps everything, under a root prefix (`/` in production).

use super::root::resolve_in_root;
use crate::effects::archive::BINARY_NAME;
use crate::effects::fs::io_failed;
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::{AgentBuild, Sha256Hex, Slot};
use crate::lifecycle::state::Side;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The variable of the container install's image selection files, and of the agent's
/// container environment: the image it runs.
pub const AGENT_IMAGE_VAR: &str = "FLEXNODE_AGENT_IMAGE";
/// The local name containerd knows every agent image by (`NAME@sha256:…`, whatever registry
/// it came from), which the container units run. `.invalid` never resolves: nothing is ever
/// pulled by this name.
pub const AGENT_IMAGE_NAME: &str = "flexnode.invalid/agent";
/// The runtime directory's mode (`/etc/flexnode`: the credential and the other secrets the
/// configuration names), as Ignition creates it on the container install.
pub const RUNTIME_DIR_MODE: u32 = 0o700;
/// The machines' directory's mode (`/var/lib/machines`, as systemd creates it): the trees hold
/// set-id programs, which no other user may reach.
pub const MACHINES_DIR_MODE: u32 = 0o700;
/// Marker of a provisioned machine, written last (relative to the machine tree).
pub const MACHINE_MARKER: &str = "etc/flexnode-machine.json";
/// Target of `bin/flexnode`.
pub const BIN_LINK_TARGET: &str = "../current/flexnode";
/// Where the agent's files live, under a root prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    pub(super) root: PathBuf,
    agent: PathBuf,
    runtime: PathBuf,
    machines: PathBuf,
    nspawn: PathBuf,
    fstab: PathBuf,
    modules_load: PathBuf,
}

impl HostLayout {
    /// All paths under `root` (`/` in production), joined as they are.
    pub fn at(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            agent: root.join(AGENT_DIR),
            runtime: root.join(RUNTIME_DIR),
            machines: root.join(MACHINES_DIR),
            nspawn: root.join(NSPAWN_DIR),
            fstab: root.join(FSTAB),
            modules_load: root.join(MODULES_LOAD),
            root,
        }
    }

    /// The host's root bound at `root` (the container install's `/host`): each base
    /// directory resolved inside it (`resolve_in_root`), so no host symlink leads out.
    pub fn confined(root: impl Into<PathBuf>) -> EffectResult<Self> {
        let root = root.into();
        let resolve = |p: &str| {
            resolve_in_root(&root, Path::new(p))
                .map_err(|e| io_failed("resolve", &root.join(p), &e))
        };
        Ok(Self {
            agent: resolve(AGENT_DIR)?,
            runtime: resolve(RUNTIME_DIR)?,
            machines: resolve(MACHINES_DIR)?,
            nspawn: resolve(NSPAWN_DIR)?,
            fstab: resolve(FSTAB)?,
            modules_load: resolve(MODULES_LOAD)?,
            root,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/opt/flexnode`
    pub fn agent_dir(&self) -> PathBuf {
        self.agent.clone()
    }

    pub fn lib_dir(&self) -> PathBuf {
        self.agent_dir().join("lib")
    }

    pub fn slot_dir(&self, slot: Slot) -> PathBuf {
        self.lib_dir().join(format!("flexnode-{}", slot.name()))
    }

    pub fn slot_binary(&self, slot: Slot) -> PathBuf {
        self.slot_dir(slot).join(BINARY_NAME)
    }

    pub fn current_link(&self) -> PathBuf {
        self.agent_dir().join("current")
    }

    pub fn last_good_link(&self) -> PathBuf {
        self.agent_dir().join("last-good")
    }

    pub fn bin_dir(&self) -> PathBuf {
        self.agent_dir().join("bin")
    }

    pub fn bin_link(&self) -> PathBuf {
        self.bin_dir().join(BINARY_NAME)
    }

    /// `<root>/etc/flexnode`
    pub fn runtime_dir(&self) -> PathBuf {
        self.runtime.clone()
    }

    pub fn agent_image_env(&self) -> PathBuf {
        self.runtime_dir().join("agent-image.env")
    }

    pub fn agent_image_last_good_env(&self) -> PathBuf {
        self.runtime_dir().join("agent-image.last-good.env")
    }

    pub fn machines_dir(&self) -> PathBuf {
        self.machines.clone()
    }

    pub fn machine_dir(&self, side: Side) -> PathBuf {
        self.machines_dir().join(side.name())
    }

    pub fn machine_marker(&self, side: Side) -> PathBuf {
        self.machine_dir(side).join(MACHINE_MARKER)
    }

    /// `<root>/etc/fstab`
    pub fn fstab(&self) -> PathBuf {
        self.fstab.clone()
    }

    /// `<root>/etc/modules-load.d/flexnode.conf`: the machines' kernel modules at every boot.
    pub fn modules_load(&self) -> PathBuf {
        self.modules_load.clone()
    }

    pub fn nspawn_dir(&self) -> PathBuf {
        self.nspawn.clone()
    }

    pub fn nspawn_file(&self, side: Side) -> PathBuf {
        self.nspawn_dir().join(format!("{}.nspawn", side.name()))
    }
}

const AGENT_DIR: &str = "opt/flexnode";
const RUNTIME_DIR: &str = "etc/flexnode";
const MACHINES_DIR: &str = "var/lib/machines";
const NSPAWN_DIR: &str = "etc/systemd/nspawn";
const FSTAB: &str = "etc/fstab";
const MODULES_LOAD: &str = "etc/modules-load.d/flexnode.conf";

/// The local name of agent image `digest` (`AGENT_IMAGE_NAME@sha256:…`).
pub fn agent_image_ref(digest: &Sha256Hex) -> String {
    format!("{AGENT_IMAGE_NAME}@{}", digest.oci())
}

/// The digest a pinned reference (`…@sha256:<hex>`, or a bare `sha256:<hex>`) names.
pub fn image_ref_digest(reference: &str) -> Option<Sha256Hex> {
    Sha256Hex::parse(reference.rsplit_once('@').map_or(reference, |(_, d)| d))
}

/// Target of `current` / `last-good` for a slot (relative to the agent dir).
pub fn slot_link_target(slot: Slot) -> String {
    format!("lib/flexnode-{}", slot.name())
}

/// The slot a running executable lives in, if any. `exe` is canonicalized when it still
/// exists; the kernel's `… (deleted)` name of a replaced binary still names its slot.
pub fn running_build(layout: &HostLayout, exe: &Path) -> Option<AgentBuild> {
    let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    let parent = exe.parent()?;
    [Slot::Blue, Slot::Green].into_iter().find_map(|slot| {
        let dir = layout.slot_dir(slot);
        let dir = dir.canonicalize().unwrap_or(dir);
        (parent == dir).then_some(AgentBuild::Slot { slot })
    })
}

/// Which slot `link` points at: `None` when absent; an error when it is not a link to a slot.
pub(super) fn read_slot_link(layout: &HostLayout, link: &Path) -> EffectResult<Option<Slot>> {
    let target = match std::fs::read_link(link) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == ErrorKind::InvalidInput => {
            return Err(EffectError::Failed(format!(
                "{} is not a symlink",
                link.display()
            )));
        }
        Err(e) => return Err(io_failed("read link", link, &e)),
        Ok(t) => t,
    };
    [Slot::Blue, Slot::Green]
        .into_iter()
        .find(|s| target == Path::new(&slot_link_target(*s)) || target == layout.slot_dir(*s))
        .map(Some)
        .ok_or_else(|| {
            EffectError::Failed(format!(
                "{} does not point at an agent slot",
                link.display()
            ))
        })
}
