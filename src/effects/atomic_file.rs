//! Files and links replaced atomically: a temporary entry in the same directory, fsync,
//! rename, fsync of the directory. Used for units, the agent's links and files, downloads.

use super::{EffectError, EffectResult};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file removed when dropped unless it was kept.
#[derive(Debug)]
pub(crate) struct TempFile {
    path: PathBuf,
    keep: bool,
}

impl TempFile {
    /// A fresh, unused name in `dir` (the file is not created).
    pub(crate) fn name_in(dir: &Path, stem: &str) -> EffectResult<Self> {
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix)
            .map_err(|e| EffectError::Failed(format!("random temporary name: {e}")))?;
        Ok(Self {
            path: dir.join(format!(".{stem}.{}.tmp", hex::encode(suffix))),
            keep: false,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The file was renamed into place: nothing is left to remove.
    pub(crate) fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// fsync of a directory, after a rename in it.
pub(crate) fn sync_dir(dir: &Path) -> EffectResult {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| EffectError::Failed(format!("fsync {}: {e}", dir.display())))
}

fn io_failed(what: &str, path: &Path, e: &std::io::Error) -> EffectError {
    EffectError::Failed(format!("{what} {}: {e}", path.display()))
}

pub(crate) fn parent_of(path: &Path) -> EffectResult<&Path> {
    path.parent()
        .ok_or_else(|| EffectError::Failed(format!("{} has no parent", path.display())))
}

fn file_stem(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Points the symlink `link` at `target` atomically (a no-op when it already does). A file or
/// symlink in its place is replaced; a directory is refused.
pub(crate) fn replace_symlink(link: &Path, target: &str) -> EffectResult {
    if std::fs::read_link(link).is_ok_and(|t| t == Path::new(target)) {
        return Ok(());
    }
    let dir = parent_of(link)?;
    let temp = TempFile::name_in(dir, &file_stem(link))?;
    std::os::unix::fs::symlink(target, temp.path())
        .map_err(|e| io_failed("create link", temp.path(), &e))?;
    std::fs::rename(temp.path(), link).map_err(|e| io_failed("replace", link, &e))?;
    temp.keep();
    sync_dir(dir)
}

/// Writes `path` atomically with `mode`.
pub(crate) fn write_file_atomic(path: &Path, contents: &[u8], mode: u32) -> EffectResult {
    let dir = parent_of(path)?;
    let temp = TempFile::name_in(dir, &file_stem(path))?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(temp.path())
        .map_err(|e| io_failed("create", temp.path(), &e))?;
    f.write_all(contents)
        .map_err(|e| io_failed("write", temp.path(), &e))?;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
        .map_err(|e| io_failed("chmod", temp.path(), &e))?;
    f.sync_all()
        .map_err(|e| io_failed("fsync", temp.path(), &e))?;
    drop(f);
    std::fs::rename(temp.path(), path).map_err(|e| io_failed("replace", path, &e))?;
    temp.keep();
    sync_dir(dir)
}
