//! containerd 1.6 + a plain-HTTP registry on 127.0.0.1 (`e2e/containerd/run`) as a contract
//! fixture. As in `tests/containerd_effects.rs`.

use super::containerd::ContainerdFixture;
use flexnode::effects::containerd::GrpcContainerd;
use flexnode::machine::validate::Sha256Hex;
use std::path::{Path, PathBuf};
use std::process::Command;

const NS: &str = "flexnode";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/containerd/run")
}

fn run(args: &[&str]) -> String {
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

/// containerd + registry of our own, stopped (and its dir removed) when dropped.
pub struct Tier {
    dir: PathBuf,
    socket: PathBuf,
    registry: String,
}

impl Tier {
    pub fn up(dir: PathBuf) -> Self {
        let out = run(&["up", &dir.display().to_string()]);
        let env = |key: &str| {
            out.lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("{key} missing from `up` output:\n{out}"))
                .to_string()
        };
        Self {
            socket: env("CONTAINERD_SOCKET").into(),
            registry: env("REGISTRY"),
            dir,
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

pub struct Registry {
    pub containerd: GrpcContainerd,
    pub tier: Tier,
}

impl Registry {
    pub async fn up(dir: PathBuf) -> Self {
        let tier = Tier::up(dir);
        let snapshotter =
            std::env::var("FLEXNODE_CONTAINERD_SNAPSHOTTER").unwrap_or_else(|_| "overlayfs".into());
        let containerd = GrpcContainerd::connect(&tier.socket, NS)
            .await
            .expect("connect to containerd")
            .with_snapshotter(&snapshotter);
        Self { containerd, tier }
    }
}

impl ContainerdFixture for Registry {
    type C = GrpcContainerd;

    fn containerd(&self) -> &GrpcContainerd {
        &self.containerd
    }

    /// Builds and pushes a two-layer 1 MB image.
    async fn image(&self, name: &str) -> Sha256Hex {
        let dir = self.tier.dir.display().to_string();
        let tag = format!("e2e/{name}:v1");
        let out = tokio::task::spawn_blocking(move || run(&["image", &dir, &tag, "1"]))
            .await
            .expect("image task");
        Sha256Hex::parse(out.trim()).unwrap_or_else(|| panic!("no digest from `image`: {out}"))
    }

    fn reference(&self, repository: &str, digest: &Sha256Hex) -> String {
        format!("{}/{repository}@{}", self.tier.registry, digest.oci())
    }
}
