//! containerd (Debian's 1.6 or 2.x built from pinned modules) with a plain-HTTP registry on
//! 127.0.0.1 (`e2e/containerd/run`), for the containerd and contract tests.

use flexnode::machine::validate::Sha256Hex;
use std::path::{Path, PathBuf};
use std::process::Command;

pub const NS: &str = "flexnode";

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/containerd/run")
}

pub fn snapshotter() -> String {
    std::env::var("FLEXNODE_CONTAINERD_SNAPSHOTTER").unwrap_or_else(|_| "overlayfs".into())
}

/// Which containerd a tier runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// Debian 12's containerd 1.6.
    V1_6,
    /// containerd 2.x built from `e2e/containerd/v2/go.mod`.
    V2,
}

/// containerd + registry of our own, stopped (and its dir removed) when dropped.
pub struct Tier {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub registry: String,
    pub storage: PathBuf,
    /// The `ctr` matching the daemon.
    pub ctr: PathBuf,
}

impl Tier {
    pub fn up_unless_skipped(flavor: Flavor) -> Option<Self> {
        if std::env::var_os("FLEXNODE_SKIP_CONTAINERD").is_some() {
            eprintln!("skipped: FLEXNODE_SKIP_CONTAINERD is set");
            return None;
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = PathBuf::from(format!("/tmp/fx-ctr-{}-{n}", std::process::id()));
        let dir_arg = dir.display().to_string();
        let mut args = vec!["up", &dir_arg];
        if flavor == Flavor::V2 {
            args.push("--v2");
        }
        let out = run(&args);
        let env = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} missing from `up` output:\n{out}"))
                .to_string()
        };
        Some(Self {
            socket: env("CONTAINERD_SOCKET").into(),
            registry: env("REGISTRY"),
            storage: env("REGISTRY_STORAGE").into(),
            ctr: env("CTR").into(),
            dir,
        })
    }

    /// Builds and pushes an image; returns its digest (an index digest with `index`).
    pub fn image(&self, name_tag: &str, size_mb: u32, index: bool) -> Sha256Hex {
        let dir = self.dir.display().to_string();
        let mb = size_mb.to_string();
        let mut args = vec!["image", &dir, name_tag, &mb];
        if index {
            args.push("--index");
        }
        let out = run(&args);
        Sha256Hex::parse(out.trim()).unwrap_or_else(|| panic!("no digest from `image`: {out}"))
    }

    /// Builds and pushes the runnable busybox image; returns its manifest digest.
    pub fn busybox_image(&self, name_tag: &str) -> Sha256Hex {
        let out = run(&["busybox-image", &self.dir.display().to_string(), name_tag]);
        Sha256Hex::parse(out.trim())
            .unwrap_or_else(|| panic!("no digest from busybox-image: {out}"))
    }

    pub fn reference(&self, repo: &str, digest: &Sha256Hex) -> String {
        format!("{}/{repo}@{}", self.registry, digest.oci())
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        let out = Command::new(script())
            .args(["down", &self.dir.display().to_string()])
            .output();
        if let Ok(out) = out
            && !out.status.success()
        {
            eprintln!("down failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}

pub fn run(args: &[&str]) -> String {
    let out = Command::new(script())
        .args(args)
        .output()
        .expect("run e2e/containerd/run");
    assert!(
        out.status.success(),
        "e2e/containerd/run {args:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
