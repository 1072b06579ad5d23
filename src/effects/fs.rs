//! Files on the host: replaced atomically (a temporary entry in the same directory, fsync,
//! rename, fsync of the directory: units, the agent's links and files, downloads), read with a
//! size cap, removed without following links.

use super::{EffectError, EffectResult};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
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

/// syncfs(2) of the filesystem holding `path`: after writing a whole tree, one flush instead
/// of an fsync per file. ext4 writes a new file's data back up to 30 s after its size, so a
/// power cut before that leaves empty files.
pub(crate) fn sync_filesystem(path: &Path) -> EffectResult {
    std::fs::File::open(path)
        .and_then(|f| rustix::fs::syncfs(&f).map_err(std::io::Error::from))
        .map_err(|e| EffectError::Failed(format!("syncfs {}: {e}", path.display())))
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

pub(crate) fn io_failed(what: &str, path: &Path, e: &std::io::Error) -> EffectError {
    EffectError::Failed(format!("{what} {}: {e}", path.display()))
}

/// Creates the missing parents of `path` (with the default mode).
pub(crate) fn create_parents(path: &Path) -> EffectResult {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => {
            std::fs::create_dir_all(parent).map_err(|e| io_failed("create", parent, &e))
        }
        _ => Ok(()),
    }
}

/// `path` is a directory (not a symlink to one) of this process's user with `mode`; created
/// if missing. One that another user owns is refused: they could replace what the agent puts
/// in it (a build root runs, a unit, a machine tree).
pub(crate) fn ensure_real_dir(path: &Path, mode: u32) -> EffectResult {
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
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me {
        return Err(EffectError::Failed(format!(
            "{} is owned by uid {}, not by uid {me} that runs flexnode: refusing to use it \
             (chown it to uid {me}, or remove it)",
            path.display(),
            meta.uid()
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
pub(crate) fn read_small(path: &Path, max: u64, follow: bool) -> EffectResult<Option<String>> {
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
pub(crate) fn remove_no_follow(path: &Path) -> EffectResult {
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
pub(crate) fn remove_tree(path: &Path) -> EffectResult {
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

pub(crate) fn sync_existing_dir(dir: &Path) -> EffectResult {
    if std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        sync_dir(dir)
    } else {
        Ok(())
    }
}

/// Removes temporary files (`.*.tmp`) a crash left in `dir`.
pub(crate) fn sweep_temps(dir: &Path) -> EffectResult {
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

pub(crate) fn ensure_mode(path: &Path, mode: u32) -> EffectResult {
    let meta = std::fs::symlink_metadata(path).map_err(|e| io_failed("inspect", path, &e))?;
    if meta.permissions().mode() & 0o7777 != mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| io_failed("chmod", path, &e))?;
    }
    Ok(())
}
