//! containerd (Debian's 1.6 or 2.x built from pinned modules) with a plain-HTTP registry on
//! 127.0.0.1 (`e2e/containerd/run`), for the containerd and contract tests.

use flexnode::effects::containerd::{GrpcContainerd, RegistryConfig};
use flexnode::effects::http::Trust;
use flexnode::lifecycle::agent::Sha256Hex;
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
    /// The private directory `dir` lives in.
    _parent: tempfile::TempDir,
    pub socket: PathBuf,
    pub registry: String,
    pub storage: PathBuf,
    /// The `ctr` matching the daemon.
    pub ctr: PathBuf,
    /// The daemon's own version, as `up` read it from the running daemon.
    pub version: String,
}

impl Tier {
    /// Fails the test when the tier is not installed (`tier::require`).
    pub fn up(flavor: Flavor) -> Self {
        super::tier::require(match flavor {
            Flavor::V1_6 => super::tier::Tier::Containerd,
            Flavor::V2 => super::tier::Tier::ContainerdV2,
        });
        // A fresh private directory (0700, unpredictable name); the script creates `t` in it
        // (the socket path must stay short).
        let parent = tempfile::Builder::new()
            .prefix("fx-ctr-")
            .tempdir()
            .expect("tier parent dir");
        let dir = parent.path().join("t");
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
        let version = env("CONTAINERD_VERSION");
        let want = match flavor {
            Flavor::V1_6 => "1.6.",
            Flavor::V2 => "2.",
        };
        assert!(
            version.trim_start_matches('v').starts_with(want),
            "the {flavor:?} tier runs containerd {version}"
        );
        Self {
            socket: env("CONTAINERD_SOCKET").into(),
            registry: env("REGISTRY"),
            storage: env("REGISTRY_STORAGE").into(),
            ctr: env("CTR").into(),
            version,
            dir,
            _parent: parent,
        }
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

    /// The agent's containerd client for this tier, reaching registries as `registry` says.
    pub async fn grpc(&self, registry: RegistryConfig) -> GrpcContainerd {
        GrpcContainerd::connect(&self.socket, NS)
            .await
            .expect("connect")
            .with_snapshotter(&snapshotter())
            .with_registry(registry)
    }

    /// The TLS registries over this tier's storage (`e2e/containerd/run secure`).
    pub fn secure(&self) -> Secure {
        let out = run(&["secure", &self.dir.display().to_string()]);
        let env = |key: &str| -> String {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} missing from `secure` output:\n{out}"))
                .to_string()
        };
        let password_file = PathBuf::from(env("REGISTRY_PASSWORD_FILE"));
        Secure {
            basic: env("BASIC_REGISTRY"),
            token: env("TOKEN_REGISTRY"),
            aux_log: env("AUX_LOG").into(),
            lab_ca: env("LAB_CA").into(),
            other_ca: env("OTHER_CA").into(),
            credentials: env("REGISTRY_CREDENTIALS").into(),
            wrong_credentials: env("WRONG_CREDENTIALS").into(),
            password: std::fs::read_to_string(&password_file)
                .expect("lab password")
                .trim()
                .to_string(),
        }
    }
}

/// The secure registries of a tier: `basic` (htpasswd, blobs redirected to registry-aux) and
/// `token` (the Bearer token flow), both with the lab CA's certificate.
pub struct Secure {
    pub basic: String,
    pub token: String,
    /// registry-aux's request log: `time method path status auth=yes|no`.
    pub aux_log: PathBuf,
    pub lab_ca: PathBuf,
    pub other_ca: PathBuf,
    pub credentials: PathBuf,
    pub wrong_credentials: PathBuf,
    pub password: String,
}

impl Secure {
    /// Trusting the lab CA, with the right credentials.
    pub fn registry_config(&self) -> RegistryConfig {
        RegistryConfig {
            trust: Trust {
                extra_ca_file: Some(self.lab_ca.clone()),
            },
            credentials: Some(self.credentials.clone()),
        }
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

/// Each test function `name(Flavor)` of a file as `v1_6::name` and `v2::name`, tests of the
/// containerd tier (attributes before a name go to both).
#[allow(unused_macros)]
macro_rules! both_versions {
    ($($(#[$attr:meta])* $name:ident),* $(,)?) => {
        mod v1_6 {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[::flexnode_test_tier::tier(containerd)]
                async fn $name() {
                    super::$name(super::Flavor::V1_6).await
                }
            )*
        }
        mod v2 {
            $(
                $(#[$attr])*
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                #[::flexnode_test_tier::tier(containerd)]
                async fn $name() {
                    super::$name(super::Flavor::V2).await
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_versions;
