//! The kernel modules the node's machines need from the host: `overlay` (containerd's
//! snapshots) and `br_netfilter` (pod traffic through iptables). A machine cannot be relied on
//! to load them, so the host's `modprobe` does (run in the host's root: `exec.rs`), and
//! `modules-load.d` loads them at every boot before any machine starts. A module already
//! there (loaded, or built into the kernel) is probed by what it provides and not loaded again.

use super::FsHost;
use super::exec::{HOST_EXEC_TIMEOUT, run_in_root};
use super::root::resolve_in_root;
use crate::effects::fs::{create_parents, read_small, write_file_atomic};
use crate::effects::{EffectError, EffectResult};
use std::path::Path;

/// Each module, and how the running kernel shows that it is there.
pub const KERNEL_MODULES: [(&str, Probe); 2] = [
    ("overlay", Probe::Filesystem("overlay")),
    ("br_netfilter", Probe::Path("/proc/sys/net/bridge")),
];

/// What shows a module is in the kernel (these are the kernel's, whatever the root).
#[derive(Clone, Copy, Debug)]
pub enum Probe {
    /// A filesystem type listed in `/proc/filesystems`.
    Filesystem(&'static str),
    /// A path the module creates.
    Path(&'static str),
}

impl Probe {
    pub fn present(self) -> EffectResult<bool> {
        match self {
            Self::Filesystem(name) => {
                let text = read_small(Path::new("/proc/filesystems"), 1 << 16, true)?;
                Ok(text
                    .is_some_and(|t| t.lines().any(|l| l.split_whitespace().last() == Some(name))))
            }
            Self::Path(path) => Ok(Path::new(path).exists()),
        }
    }
}

/// What `modules-load.d` gets.
fn modules_load_text() -> String {
    let mut text = String::from("# flexnode: the node's machines need these modules.\n");
    for (name, _) in KERNEL_MODULES {
        text.push_str(name);
        text.push('\n');
    }
    text
}

/// Where a host keeps `modprobe` (merged `/usr` or not).
const MODPROBE: [&str; 2] = ["/usr/sbin/modprobe", "/sbin/modprobe"];

impl FsHost {
    /// Persists the list for later boots, then loads what is missing now.
    pub(super) async fn ensure_kernel_modules(&self) -> EffectResult {
        let missing = self
            .blocking(|h| {
                let path = h.layout.modules_load();
                let text = modules_load_text();
                if read_small(&path, 1 << 16, false)?.as_deref() != Some(text.as_str()) {
                    create_parents(&path)?;
                    write_file_atomic(&path, text.as_bytes(), 0o644)?;
                }
                let mut missing = Vec::new();
                for (name, probe) in KERNEL_MODULES {
                    if !probe.present()? {
                        missing.push(name);
                    }
                }
                Ok(missing)
            })
            .await?;
        if missing.is_empty() {
            return Ok(());
        }
        let root = self.layout.root().to_path_buf();
        let modprobe = MODPROBE
            .iter()
            .find(|p| resolve_in_root(&root, Path::new(p)).is_ok_and(|r| r.is_file()))
            .ok_or_else(|| {
                EffectError::Failed(format!(
                    "kernel modules {missing:?} are missing and the host has no modprobe \
                     ({} or {})",
                    MODPROBE[0], MODPROBE[1]
                ))
            })?;
        let mut args = vec!["-a"];
        args.extend(&missing);
        run_in_root(&self.executable, &root, modprobe, &args, HOST_EXEC_TIMEOUT).await?;
        tracing::info!(modules = ?missing, "kernel modules loaded by the host's modprobe");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modules_load_lists_every_module() {
        let text = modules_load_text();
        let listed: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(listed, ["overlay", "br_netfilter"]);
    }
}
