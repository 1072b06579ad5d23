//! The production [`Host`] for the host install: files and processes on the real filesystem,
//! every path under a root prefix ([`HostLayout`]; `/` in production, a temporary directory in
//! tests).
//!
//! Layout (decisions.md §2; the unit files in `units/host/` use these paths):
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
//! ```
//!
//! Links and files are replaced atomically: a temporary entry in the same directory, fsync,
//! rename, fsync of the directory. Nothing here follows a symlink it removes. Every method is
//! idempotent: called again after a crash it finishes what is missing.

use super::archive::{ArchiveFetcher, BINARY_NAME};
use super::atomic_file::{TempFile, parent_of, replace_symlink, sync_dir, write_file_atomic};
use super::{EffectError, EffectResult, Host};
use crate::machine::state::{AgentBuild, InstallMode, Side, Slot};
use crate::machine::validate::{Arch, ArchiveUrl, Sha256Hex};
use sha2::{Digest, Sha256};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// `PATH` of the candidate's `version` run (its only environment variable).
pub const CHECK_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// How long the candidate's `version` may run.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of the candidate's output is kept.
pub const CHECK_OUTPUT_MAX: u64 = 4096;
/// The variable of the container install's image selection files.
pub const AGENT_IMAGE_VAR: &str = "FLEXNODE_AGENT_IMAGE";
/// Target of `bin/flexnode`.
pub const BIN_LINK_TARGET: &str = "../current/flexnode";
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
/// Marker of a provisioned machine, written last (relative to the machine tree).
pub const MACHINE_MARKER: &str = "etc/flexnode-machine.json";

/// Where the agent's files live, under a root prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    root: PathBuf,
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

/// The real host: see the module documentation.
#[derive(Clone, Debug)]
pub struct FsHost {
    layout: HostLayout,
    executable: PathBuf,
    check_timeout: Duration,
    fetcher: ArchiveFetcher,
    arch: Arch,
    os_release: Option<PathBuf>,
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
        }
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

    fn ensure_agent_dirs(&self, slot: Option<Slot>) -> EffectResult {
        let l = &self.layout;
        create_parents(&l.agent_dir())?;
        ensure_real_dir(&l.agent_dir(), 0o755)?;
        ensure_real_dir(&l.lib_dir(), 0o755)?;
        ensure_real_dir(&l.bin_dir(), 0o755)?;
        sweep_temps(&l.agent_dir())?;
        sweep_temps(&l.bin_dir())?;
        if let Some(slot) = slot {
            ensure_real_dir(&l.slot_dir(slot), 0o755)?;
            sweep_temps(&l.slot_dir(slot))?;
        }
        Ok(())
    }

    fn slot_link(&self, link: &Path) -> EffectResult<Option<Slot>> {
        read_slot_link(&self.layout, link)
    }

    fn install_slot(&self, slot: Slot) -> EffectResult {
        self.ensure_agent_dirs(Some(slot))?;
        copy_binary(&self.executable, &self.layout.slot_dir(slot))?;
        replace_symlink(&self.layout.current_link(), &slot_link_target(slot))?;
        replace_symlink(&self.layout.bin_link(), BIN_LINK_TARGET)
    }

    /// Before a slot is overwritten: never the selected one, and `last-good` must not keep
    /// pointing at bytes that are about to change (it falls back to the selected build).
    fn prepare_stage(&self, slot: Slot) -> EffectResult {
        let current = self.slot_link(&self.layout.current_link())?;
        if current == Some(slot) {
            return Err(EffectError::Failed(format!(
                "refusing to stage into slot {}: it holds the selected agent",
                slot.name()
            )));
        }
        if self.slot_link(&self.layout.last_good_link())? == Some(slot) {
            match current {
                Some(c) => replace_symlink(&self.layout.last_good_link(), &slot_link_target(c))?,
                None => remove_no_follow(&self.layout.last_good_link())?,
            }
        }
        self.ensure_agent_dirs(Some(slot))
    }

    fn discard_slot(&self, slot: Slot) -> EffectResult {
        let l = &self.layout;
        if self.slot_link(&l.current_link())? == Some(slot)
            || self.slot_link(&l.last_good_link())? == Some(slot)
        {
            return Ok(());
        }
        remove_tree(&l.slot_dir(slot))?;
        sync_existing_dir(&l.lib_dir())
    }

    fn select_slot(&self, to: Slot, last_good: Slot) -> EffectResult {
        let l = &self.layout;
        let binary = l.slot_binary(to);
        match std::fs::symlink_metadata(&binary) {
            Ok(m) if m.is_file() => {}
            Ok(_) | Err(_) => {
                return Err(EffectError::Failed(format!(
                    "slot {} is not installed ({} is missing)",
                    to.name(),
                    binary.display()
                )));
            }
        }
        self.ensure_agent_dirs(None)?;
        replace_symlink(&l.last_good_link(), &slot_link_target(last_good))?;
        replace_symlink(&l.current_link(), &slot_link_target(to))?;
        replace_symlink(&l.bin_link(), BIN_LINK_TARGET)
    }

    fn write_image_selection(&self, path: &Path, digest: &Sha256Hex) -> EffectResult {
        let dir = self.layout.runtime_dir();
        create_parents(&dir)?;
        ensure_real_dir(&dir, 0o755)?;
        let contents = format!("{AGENT_IMAGE_VAR}={}\n", digest.oci());
        write_file_atomic(path, contents.as_bytes(), 0o644)
    }

    fn read_image_selection(&self, path: &Path) -> EffectResult<Option<AgentBuild>> {
        let Some(text) = read_small(path, 4096, false)? else {
            return Ok(None);
        };
        text.lines()
            .filter_map(|line| line.trim().strip_prefix(AGENT_IMAGE_VAR)?.strip_prefix('='))
            .find_map(|v| Sha256Hex::parse(v.trim_matches('"')))
            .map(|digest| Some(AgentBuild::Image { digest }))
            .ok_or_else(|| {
                EffectError::Failed(format!(
                    "{} does not hold {AGENT_IMAGE_VAR}=sha256:<hex>",
                    path.display()
                ))
            })
    }

    fn os_release_source(&self) -> EffectResult<PathBuf> {
        if let Some(p) = &self.os_release {
            return Ok(p.clone());
        }
        let candidates = [
            self.layout.root.join("usr/lib/os-release"),
            self.layout.root.join("etc/os-release"),
        ];
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

    fn read_marker(&self, side: Side) -> EffectResult<Option<String>> {
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
        let version = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("kubernetesVersion")?.as_str().map(str::to_string));
        if version.is_none() {
            // Only our own atomic writes make this file: a bad one is re-provisioned.
            tracing::warn!(path = %marker.display(), "machine marker unreadable; ignoring it");
        }
        Ok(version)
    }

    fn provision(&self, side: Side, kubernetes_version: &str) -> EffectResult {
        let l = &self.layout;
        let machines = l.machines_dir();
        create_parents(&machines)?;
        if std::fs::symlink_metadata(&machines).is_err() {
            std::fs::create_dir(&machines).map_err(|e| io_failed("create", &machines, &e))?;
        }
        sweep_trash(&machines, side)?;
        let root = l.machine_dir(side);
        // A different version being provisioned: the old marker goes first.
        if self
            .read_marker(side)?
            .is_some_and(|v| v != kubernetes_version)
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

    fn remove_machine_tree(&self, side: Side) -> EffectResult {
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

    fn wipe(&self) -> EffectResult {
        let dir = self.layout.runtime_dir();
        remove_tree(&dir)?;
        if let Some(parent) = dir.parent() {
            sync_existing_dir(parent)?;
        }
        Ok(())
    }
}

fn io_failed(what: &str, path: &Path, e: &std::io::Error) -> EffectError {
    EffectError::Failed(format!("{what} {}: {e}", path.display()))
}

fn mode_mismatch(mode: InstallMode, build: &AgentBuild) -> EffectError {
    EffectError::Failed(format!("the {} install cannot use {build}", mode.as_str()))
}

/// Creates the missing parents of `path` (with the default mode).
fn create_parents(path: &Path) -> EffectResult {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => {
            std::fs::create_dir_all(parent).map_err(|e| io_failed("create", parent, &e))
        }
        _ => Ok(()),
    }
}

/// `path` is a directory (not a symlink to one) with `mode`; created if missing.
fn ensure_real_dir(path: &Path, mode: u32) -> EffectResult {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => {
            match std::fs::create_dir(path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_failed("create", path, &e)),
            }
            std::fs::symlink_metadata(path).map_err(|e| io_failed("inspect", path, &e))?
        }
        Err(e) => return Err(io_failed("inspect", path, &e)),
        Ok(m) => m,
    };
    if !meta.is_dir() {
        return Err(EffectError::Failed(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_failed("chmod", path, &e))?;
    }
    Ok(())
}

/// A small text file, `None` when absent. With `follow == false` a symlink at `path` is
/// refused instead of read through.
fn read_small(path: &Path, max: u64, follow: bool) -> EffectResult<Option<String>> {
    if !follow {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_failed("inspect", path, &e)),
            Ok(m) if m.is_file() => {}
            Ok(_) => {
                return Err(EffectError::Failed(format!(
                    "{} is not a regular file",
                    path.display()
                )));
            }
        }
    }
    let f = match std::fs::File::open(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_failed("read", path, &e)),
        Ok(f) => f,
    };
    let mut text = String::new();
    f.take(max)
        .read_to_string(&mut text)
        .map_err(|e| io_failed("read", path, &e))?;
    Ok(Some(text))
}

/// Removes a file or symlink (never what it points to); absent is fine; a directory is refused.
fn remove_no_follow(path: &Path) -> EffectResult {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_failed("inspect", path, &e)),
        Ok(m) if m.is_dir() => Err(EffectError::Failed(format!(
            "{} is a directory; not removing it",
            path.display()
        ))),
        Ok(_) => {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_failed("remove", path, &e)),
            }
            sync_existing_dir(parent_of(path)?)
        }
    }
}

/// Removes a tree without following symlinks out of it; absent is fine.
fn remove_tree(path: &Path) -> EffectResult {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_failed("inspect", path, &e)),
        // `remove_dir_all` does not follow symlinks (it unlinks them).
        Ok(m) if m.is_dir() => match std::fs::remove_dir_all(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_failed("remove", path, &e)),
        },
        Ok(_) => remove_no_follow(path),
    }
}

fn sync_existing_dir(dir: &Path) -> EffectResult {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        sync_dir(dir)
    } else {
        Ok(())
    }
}

/// Removes temporary files (`.*.tmp`) a crash left in `dir`.
fn sweep_temps(dir: &Path) -> EffectResult {
    let entries = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_failed("list", dir, &e)),
        Ok(entries) => entries,
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_failed("list", dir, &e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') && name.ends_with(".tmp") {
            remove_no_follow(&entry.path())?;
        }
    }
    Ok(())
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

/// Which slot `link` points at: `None` when absent; an error when it is not a link to a slot.
fn read_slot_link(layout: &HostLayout, link: &Path) -> EffectResult<Option<Slot>> {
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

fn sha256_file(path: &Path) -> EffectResult<[u8; 32]> {
    let mut f = std::fs::File::open(path).map_err(|e| io_failed("open", path, &e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = f.read(&mut buf).map_err(|e| io_failed("read", path, &e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(&hasher.finalize());
    Ok(out)
}

/// Copies `source` to `<dir>/flexnode` (0755) atomically, unless it already holds the same
/// bytes. Returns whether it copied.
fn copy_binary(source: &Path, dir: &Path) -> EffectResult<bool> {
    let target = dir.join(BINARY_NAME);
    let wanted = sha256_file(source)?;
    if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_file())
        && sha256_file(&target)? == wanted
    {
        ensure_mode(&target, 0o755)?;
        return Ok(false);
    }
    let temp = TempFile::name_in(dir, BINARY_NAME)?;
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(temp.path())
        .map_err(|e| io_failed("create", temp.path(), &e))?;
    let mut input = std::fs::File::open(source).map_err(|e| io_failed("open", source, &e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = input
            .read(&mut buf)
            .map_err(|e| io_failed("read", source, &e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| io_failed("write", temp.path(), &e))?;
    }
    if hasher.finalize().as_slice() != wanted.as_slice() {
        return Err(EffectError::Failed(format!(
            "{} changed while it was copied",
            source.display()
        )));
    }
    out.set_permissions(std::fs::Permissions::from_mode(0o755))
        .map_err(|e| io_failed("chmod", temp.path(), &e))?;
    out.sync_all()
        .map_err(|e| io_failed("fsync", temp.path(), &e))?;
    drop(out);
    std::fs::rename(temp.path(), &target).map_err(|e| io_failed("replace", &target, &e))?;
    temp.keep();
    sync_dir(dir)?;
    Ok(true)
}

fn ensure_mode(path: &Path, mode: u32) -> EffectResult {
    let meta = std::fs::symlink_metadata(path).map_err(|e| io_failed("inspect", path, &e))?;
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_failed("chmod", path, &e))?;
    }
    Ok(())
}

/// Runs `<binary> version` without a shell, with only `PATH` set, stdin from /dev/null, at most
/// [`CHECK_OUTPUT_MAX`] bytes of stdout kept, killed after `timeout`.
async fn run_version(build: &AgentBuild, binary: &Path, timeout: Duration) -> EffectResult<String> {
    use tokio::io::AsyncReadExt;
    let mut attempts = 0;
    let mut child = loop {
        let spawned = tokio::process::Command::new(binary)
            .arg("version")
            .env_clear()
            .env("PATH", CHECK_PATH)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        match spawned {
            Ok(child) => break child,
            // A just-written file may still be open for writing in a forked child elsewhere.
            Err(e) if e.kind() == ErrorKind::ExecutableFileBusy && attempts < 5 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(EffectError::Failed(format!(
                    "candidate {build}: cannot run {}: {e}",
                    binary.display()
                )));
            }
        }
    };
    let stdout = child.stdout.take();
    let run = async {
        let mut buf = Vec::new();
        if let Some(mut out) = stdout {
            // Only the first bytes are kept; the rest is drained so the candidate's exit
            // status is its own (not a SIGPIPE), and the timeout bounds the whole run.
            let mut chunk = [0u8; 4096];
            loop {
                let n = out.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                let room = (CHECK_OUTPUT_MAX as usize).saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, buf))
    };
    let (status, output) = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            let _ = child.kill().await;
            return Err(EffectError::Failed(format!(
                "candidate {build}: `version` failed: {e}"
            )));
        }
        Err(_) => {
            let _ = child.kill().await;
            return Err(EffectError::Failed(format!(
                "candidate {build}: `version` did not finish within {} s",
                timeout.as_secs_f64()
            )));
        }
    };
    if !status.success() {
        return Err(EffectError::Failed(format!(
            "candidate {build}: `version` failed ({status})"
        )));
    }
    let text = String::from_utf8_lossy(&output);
    if !text.starts_with("flexnode ") {
        return Err(EffectError::Failed(format!(
            "candidate {build}: `version` did not print \"flexnode <version>\""
        )));
    }
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
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

    async fn check_candidate(&self, build: &AgentBuild) -> EffectResult<String> {
        let AgentBuild::Slot { slot } = build else {
            return Err(mode_mismatch(InstallMode::Host, build));
        };
        let binary = self.layout.slot_binary(*slot);
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

    async fn machine_rootfs(&self, side: Side) -> EffectResult<Option<String>> {
        self.blocking(move |h| h.read_marker(side)).await
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
            let dir = h.layout.runtime_dir();
            match std::fs::symlink_metadata(&dir) {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
                Err(e) => Err(io_failed("inspect", &dir, &e)),
            }
        })
        .await
    }

    async fn wipe_runtime(&self) -> EffectResult {
        self.blocking(|h| h.wipe()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
