//! Target `layer`: an image layer (tar or tar+gzip, a registry's bytes) applied onto a
//! machine's tree on tmpfs (`src/effects/containerd/rootfs.rs:apply_layer`, the real unpack,
//! whiteouts included). Nothing outside the tree changes and the tree itself stays; the bytes
//! stay within the cap; a whiteout removes the entry it names (not what a symlink there points
//! to) and nothing it does not name; a refusal is one short line.
//!
//! Input: one flags byte (bit 0: gzip), then the layer. The tree it lands on holds
//! `etc/hostname`, `usr/bin/sh`, `usr/lib/libx.so`, `var/`, `lib -> usr/lib`, `abs -> /usr`;
//! beside it, `outside/secret` must stay as it is.

use crate::common::{Outcome, assert_short_line, fresh_dir, sha256_hex, snapshot};
use flexnode::effects::containerd::{Compression, apply_layer};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

const CAP: u64 = 1 << 20;
const MAX_MESSAGE: usize = 600;
/// The tree's files and directories before the layer (the links are checked on their own).
const BASE: &[&str] = &[
    "etc",
    "etc/hostname",
    "usr",
    "usr/bin",
    "usr/bin/sh",
    "usr/lib",
    "usr/lib/libx.so",
    "var",
];

pub fn check(data: &[u8], scratch: &Path) -> Outcome {
    let Some((&flags, layer)) = data.split_first() else {
        return Outcome::Rejected;
    };
    let base = scratch.join("layer");
    fresh_dir(&base);
    let root = base.join("root");
    let outside = base.join("outside");
    build_tree(&root, &outside);
    let before = snapshot(&outside);

    let (compression, plain) = if flags & 1 == 1 {
        let mut plain = Vec::new();
        let ok = flate2::read::GzDecoder::new(layer)
            .take(CAP + 1)
            .read_to_end(&mut plain)
            .is_ok();
        (Compression::Gzip, ok.then_some(plain))
    } else {
        (Compression::None, Some(layer.to_vec()))
    };
    let diff_id = match &plain {
        Some(p) => format!("sha256:{}", sha256_hex(p)),
        None => "sha256:unreadable".to_string(),
    };
    let result = apply_layer(layer, compression, &root, "sha256:layer", &diff_id, CAP);

    assert_eq!(
        snapshot(&outside),
        before,
        "the layer changed something outside the tree"
    );
    let siblings: Vec<_> = std::fs::read_dir(&base)
        .expect("list")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        siblings.len(),
        2,
        "the layer wrote beside the tree: {siblings:?}"
    );
    let meta = std::fs::symlink_metadata(&root).expect("the layer removed the tree itself");
    assert!(meta.is_dir(), "the tree is no longer a directory");
    match &result {
        Ok(n) => {
            let plain = plain.expect("an accepted layer decompresses");
            assert_eq!(*n, plain.len() as u64, "the bytes counted");
            assert!(*n <= CAP);
            check_whiteouts(&root, &plain);
        }
        Err(e) => assert_short_line(&e.to_string(), MAX_MESSAGE, "apply_layer"),
    }
    Outcome::from(&result)
}

fn build_tree(root: &Path, outside: &Path) {
    for dir in ["etc", "usr/bin", "usr/lib", "var"] {
        std::fs::create_dir_all(root.join(dir)).expect("create");
    }
    for file in ["etc/hostname", "usr/bin/sh", "usr/lib/libx.so"] {
        std::fs::write(root.join(file), file).expect("write");
    }
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).expect("link");
    std::os::unix::fs::symlink("/usr", root.join("abs")).expect("link");
    std::fs::create_dir_all(outside).expect("create");
    std::fs::write(outside.join("secret"), b"not the tree's").expect("write");
    std::fs::set_permissions(
        outside.join("secret"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod");
}

/// What the layer's entries reach, with the tree's own links resolved in their parents: the
/// base paths no entry reaches are all still there, and each whiteout's target is gone.
/// Layers that make links themselves are left to the other checks.
fn check_whiteouts(root: &Path, plain: &[u8]) {
    let mut reached: Vec<PathBuf> = Vec::new();
    let mut opaque: Vec<PathBuf> = Vec::new();
    let mut removed: Vec<PathBuf> = Vec::new();
    let mut archive = tar::Archive::new(plain);
    let Ok(entries) = archive.entries() else {
        return;
    };
    for entry in entries {
        let Ok(entry) = entry else { return };
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            return;
        }
        let Ok(path) = entry.path() else { return };
        let Some(parts) = normal(&path) else { return };
        let Some((name, parent)) = parts.split_last() else {
            continue;
        };
        let parent = resolve(parent);
        if name == ".wh..wh..opq" {
            opaque.push(parent);
        } else if let Some(hidden) = name.strip_prefix(".wh.") {
            let target = parent.join(hidden);
            reached.push(target.clone());
            removed.push(target);
        } else {
            reached.push(parent.join(name));
            // The entry's own path, unresolved, may replace a link of the tree.
            reached.push(parts.iter().collect());
        }
    }
    for p in BASE
        .iter()
        .map(PathBuf::from)
        .chain([PathBuf::from("lib"), PathBuf::from("abs")])
    {
        let touched = reached
            .iter()
            .any(|r| p.starts_with(r) || r.starts_with(&p))
            || opaque.iter().any(|d| p.starts_with(d));
        if !touched {
            assert!(
                std::fs::symlink_metadata(root.join(&p)).is_ok(),
                "{} is gone, though no entry names it",
                p.display()
            );
        }
    }
    for r in &removed {
        let recreated = reached.iter().filter(|x| *x == r).count() > 1;
        if !recreated {
            assert!(
                std::fs::symlink_metadata(root.join(r)).is_err(),
                "the whiteout of {} left it",
                r.display()
            );
        }
    }
}

/// The path's normal components; `None` if it climbs.
fn normal(path: &Path) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p.to_str()?.to_string()),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return None,
        }
    }
    Some(out)
}

/// A parent directory with the tree's links followed: `lib` is `usr/lib`, `abs` is `usr`.
fn resolve(parent: &[String]) -> PathBuf {
    let mut out = PathBuf::new();
    for (i, part) in parent.iter().enumerate() {
        match (i, part.as_str()) {
            (0, "lib") => out.push("usr/lib"),
            (0, "abs") => out.push("usr"),
            _ => out.push(part),
        }
    }
    out
}
