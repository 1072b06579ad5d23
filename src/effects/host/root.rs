//! Host paths as the container install's agent sees them: the host's root is bound at
//! `/host`, and a host path is resolved inside it, with a symlink's absolute target and `..`
//! never leaving it (a host link `/etc/systemd -> /usr/etc/systemd` means the host's `/usr`,
//! not the container's). std resolves against the process's own root only, and
//! `openat2(RESOLVE_IN_ROOT)` would need a descriptor per call: the layout only needs its few
//! base directories, resolved once when the agent starts.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};

/// Links followed before giving up, as the kernel's `MAXSYMLINKS`.
const MAX_LINKS: usize = 40;

/// `path` (taken relative to `root` even when absolute) with every symlink in it followed
/// inside `root`. Past a component that does not exist, the rest is taken lexically.
pub fn resolve_in_root(root: &Path, path: &Path) -> std::io::Result<PathBuf> {
    let mut resolved: Vec<OsString> = Vec::new();
    let mut rest: VecDeque<OsString> = normal_parts(path).collect();
    let mut links = 0;
    let mut missing = false;
    while let Some(part) = rest.pop_front() {
        if part == ".." {
            resolved.pop();
            continue;
        }
        if missing {
            resolved.push(part);
            continue;
        }
        let candidate = joined(root, &resolved).join(&part);
        match std::fs::symlink_metadata(&candidate) {
            Ok(m) if m.file_type().is_symlink() => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(std::io::Error::new(
                        ErrorKind::InvalidInput,
                        format!("too many symlinks under {}", candidate.display()),
                    ));
                }
                let target = std::fs::read_link(&candidate)?;
                if target.is_absolute() {
                    resolved.clear();
                }
                for (i, p) in normal_parts(&target).enumerate() {
                    rest.insert(i, p);
                }
            }
            Ok(_) => resolved.push(part),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                missing = true;
                resolved.push(part);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(joined(root, &resolved))
}

/// The components that name something (`..` kept, `/` and `.` dropped).
fn normal_parts(path: &Path) -> impl Iterator<Item = OsString> + '_ {
    path.components().filter_map(|c| match c {
        Component::Normal(p) => Some(p.to_os_string()),
        Component::ParentDir => Some(OsString::from("..")),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

fn joined(root: &Path, parts: &[OsString]) -> PathBuf {
    parts.iter().fold(root.to_path_buf(), |p, c| p.join(c))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_and_dotdot_stay_inside_the_root() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("host");
        std::fs::create_dir_all(root.join("usr/etc/systemd/system")).expect("mkdir");
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        // Absolute and relative links, a `..` climbing past the root, a loop.
        symlink("/usr/etc/systemd", root.join("etc/systemd")).expect("link");
        symlink("../../../../../../etc", root.join("usr/up")).expect("link");
        symlink("loop", root.join("loop")).expect("link");
        let r = |p: &str| resolve_in_root(&root, Path::new(p)).expect(p);

        assert_eq!(
            r("/etc/systemd/system"),
            root.join("usr/etc/systemd/system")
        );
        assert_eq!(r("/usr/up/systemd"), root.join("usr/etc/systemd"));
        assert_eq!(r("/../../etc"), root.join("etc"));
        assert_eq!(r("/var/lib/machines"), root.join("var/lib/machines"));
        assert_eq!(
            r("/etc/systemd/nspawn/../nspawn/x"),
            root.join("usr/etc/systemd/nspawn/x"),
            "past a missing component, `..` is lexical"
        );
        let err = resolve_in_root(&root, Path::new("/loop/x")).expect_err("a loop");
        assert!(err.to_string().contains("too many symlinks"), "{err}");
    }
}
