//! The blue/green slots, the `current`/`last-good`/`bin/flexnode` links and the container
//! install's image selection: installing, staging, selecting and discarding builds.

use super::FsHost;
use super::layout::{
    AGENT_IMAGE_NAME, AGENT_IMAGE_VAR, BIN_LINK_TARGET, RUNTIME_DIR_MODE, agent_image_ref,
    image_ref_digest, read_slot_link, slot_link_target,
};
use crate::effects::archive::BINARY_NAME;
use crate::effects::fs::{
    TempFile, create_parents, ensure_mode, ensure_real_dir, io_failed, read_small,
    remove_no_follow, remove_tree, replace_symlink, sweep_temps, sync_dir, sync_existing_dir,
    write_file_atomic,
};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::{AgentBuild, Sha256Hex, Slot};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

impl FsHost {
    pub(super) fn ensure_agent_dirs(&self, slot: Option<Slot>) -> EffectResult {
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

    pub(super) fn slot_link(&self, link: &Path) -> EffectResult<Option<Slot>> {
        read_slot_link(&self.layout, link)
    }

    pub(super) fn install_slot(&self, slot: Slot) -> EffectResult {
        self.ensure_agent_dirs(Some(slot))?;
        copy_binary(&self.executable, &self.layout.slot_dir(slot))?;
        replace_symlink(&self.layout.current_link(), &slot_link_target(slot))?;
        replace_symlink(&self.layout.bin_link(), BIN_LINK_TARGET)
    }

    /// Before a slot is overwritten: never the selected one, and `last-good` must not keep
    /// pointing at bytes that are about to change (it falls back to the selected build).
    pub(super) fn prepare_stage(&self, slot: Slot) -> EffectResult {
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

    pub(super) fn discard_slot(&self, slot: Slot) -> EffectResult {
        let l = &self.layout;
        if self.slot_link(&l.current_link())? == Some(slot)
            || self.slot_link(&l.last_good_link())? == Some(slot)
        {
            return Ok(());
        }
        remove_tree(&l.slot_dir(slot))?;
        sync_existing_dir(&l.lib_dir())
    }

    pub(super) fn select_slot(&self, to: Slot, last_good: Slot) -> EffectResult {
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

    pub(super) fn write_image_selection(&self, path: &Path, digest: &Sha256Hex) -> EffectResult {
        let dir = self.layout.runtime_dir();
        create_parents(&dir)?;
        ensure_real_dir(&dir, RUNTIME_DIR_MODE)?;
        let contents = format!("{AGENT_IMAGE_VAR}={}\n", agent_image_ref(digest));
        write_file_atomic(path, contents.as_bytes(), 0o644)
    }

    pub(super) fn read_image_selection(&self, path: &Path) -> EffectResult<Option<AgentBuild>> {
        let Some(text) = read_small(path, 4096, false)? else {
            return Ok(None);
        };
        text.lines()
            .filter_map(|line| line.trim().strip_prefix(AGENT_IMAGE_VAR)?.strip_prefix('='))
            .find_map(|v| image_ref_digest(v.trim_matches('"')))
            .map(|digest| Some(AgentBuild::Image { digest }))
            .ok_or_else(|| {
                EffectError::Failed(format!(
                    "{} does not hold {AGENT_IMAGE_VAR}={AGENT_IMAGE_NAME}@sha256:<hex>",
                    path.display()
                ))
            })
    }
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
