//! What the checks share: the marker planted as a URL's secret and where it counts as one,
//! what a check concluded, and snapshots of directory trees.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The secret the seeds plant in URLs (userinfo, query, fragment); the fuzzer moves it around
/// and the checks look for it in everything shown.
pub const MARKER: &str = "S3CR3T";

/// What the agent's code made of an input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Rejected,
}

impl<T, E> From<&Result<T, E>> for Outcome {
    fn from(r: &Result<T, E>) -> Self {
        if r.is_ok() {
            Self::Accepted
        } else {
            Self::Rejected
        }
    }
}

/// `data` as text: the targets that take strings read invalid UTF-8 as replacement characters.
pub fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// Whether [`MARKER`] is in a secret part of `raw` and nowhere else. The parts are read as a
/// WHATWG URL parser (the `url` crate, which validation and downloads use) reads them:
/// userinfo, query and fragment are secret; scheme, host, port and path are not. Text that is
/// no URL: what follows its first `?` or `#` is secret.
pub fn secret_in(raw: &str) -> bool {
    match url::Url::parse(raw) {
        Ok(u) => {
            let secret = format!(
                "{} {} {} {}",
                u.username(),
                u.password().unwrap_or_default(),
                u.query().unwrap_or_default(),
                u.fragment().unwrap_or_default()
            );
            let public = format!(
                "{} {} {} {}",
                u.scheme(),
                u.host_str().unwrap_or_default(),
                u.port().map(|p| p.to_string()).unwrap_or_default(),
                u.path()
            );
            secret.contains(MARKER) && !public.contains(MARKER)
        }
        Err(_) => {
            let cut = raw.find(['?', '#']).unwrap_or(raw.len());
            raw[cut..].contains(MARKER) && !raw[..cut].contains(MARKER)
        }
    }
}

/// Panics when `shown` holds the marker although `raw` holds it only as a secret.
pub fn assert_hidden(raw: &str, shown: &str, what: &str) {
    if secret_in(raw) {
        assert!(
            !shown.contains(MARKER),
            "{what} shows the secret of {raw:?}: {shown:?}"
        );
    }
}

/// A message for a person: one line, at most `max` bytes (a registry or an archive must not
/// be able to write pages into an operation's status or a log line).
pub fn assert_short_line(message: &str, max: usize, what: &str) {
    assert!(
        !message.contains(['\n', '\r']),
        "{what}: a message spans lines: {message:?}"
    );
    assert!(
        message.len() <= max,
        "{what}: a message of {} bytes (at most {max}): {:?}…",
        message.len(),
        message.chars().take(200).collect::<String>()
    );
}

/// One entry of a tree: kind, mode, owner, size and, for files, contents; for links, target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub len: u64,
    pub data: Vec<u8>,
}

/// Everything under `root` (not following symlinks), by path relative to it.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(children) = std::fs::read_dir(&dir) else {
            continue;
        };
        for child in children.flatten() {
            let path = child.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ft = meta.file_type();
            let (kind, data) = if ft.is_symlink() {
                let target = std::fs::read_link(&path).unwrap_or_default();
                ("link", target.into_os_string().into_encoded_bytes())
            } else if ft.is_dir() {
                todo.push(path.clone());
                ("dir", Vec::new())
            } else if ft.is_file() {
                ("file", std::fs::read(&path).unwrap_or_default())
            } else {
                ("other", Vec::new())
            };
            let rel = path.strip_prefix(root).unwrap_or(&path).to_path_buf();
            out.insert(
                rel,
                Entry {
                    kind,
                    mode: meta.mode(),
                    uid: meta.uid(),
                    len: meta.len(),
                    data,
                },
            );
        }
    }
    out
}

/// `dir` made empty (created if missing).
pub fn fresh_dir(dir: &Path) {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("clear {}: {e}", dir.display()),
    }
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
}

/// A sha256 as hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
