//! Where the host install keeps everything, under a root prefix (`/` in production).

use super::machines::MACHINE_MARKER;
use crate::effects::archive::BINARY_NAME;
use crate::effects::fs::io_failed;
use crate::effects::{EffectError, EffectResult};
use crate::machine::agent::{AgentBuild, Slot};
use crate::machine::state::Side;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// The variable of the container install's image selection files.
pub const AGENT_IMAGE_VAR: &str = "FLEXNODE_AGENT_IMAGE";
/// Target of `bin/flexnode`.
pub const BIN_LINK_TARGET: &str = "../current/flexnode";
/// Where the agent's files live, under a root prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    pub(super) root: PathBuf,
}

impl HostLayout {
    /// All paths under `root` (`/` in production).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/opt/flexnode`
    pub fn agent_dir(&self) -> PathBuf {
        self.root.join("opt/flexnode")
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
        self.root.join("etc/flexnode")
    }

    pub fn agent_image_env(&self) -> PathBuf {
        self.runtime_dir().join("agent-image.env")
    }

    pub fn agent_image_last_good_env(&self) -> PathBuf {
        self.runtime_dir().join("agent-image.last-good.env")
    }

    pub fn machines_dir(&self) -> PathBuf {
        self.root.join("var/lib/machines")
    }

    pub fn machine_dir(&self, side: Side) -> PathBuf {
        self.machines_dir().join(side.name())
    }

    pub fn machine_marker(&self, side: Side) -> PathBuf {
        self.machine_dir(side).join(MACHINE_MARKER)
    }

    pub fn nspawn_dir(&self) -> PathBuf {
        self.root.join("etc/systemd/nspawn")
    }

    pub fn nspawn_file(&self, side: Side) -> PathBuf {
        self.nspawn_dir().join(format!("{}.nspawn", side.name()))
    }
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
