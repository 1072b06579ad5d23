//! The real daemons a test needs, and the one way to skip them. A test of a tier starts with
//! [`require`]: when the tier is missing, the test fails, naming what is missing and how to
//! install it (the tier's own `check`). A tier is skipped only with its variable set to
//! exactly `1`: `build.rs` then compiles the tier's tests (marked `#[tier(name)]`,
//! tests/tier-macro) as ignored, with the reason
//! `SKIPPED <tier>: <VARIABLE>=1`, so libtest lists each one and counts them. `.ci/run`
//! refuses to start while any skip variable is set.

use std::path::Path;
use std::process::Command;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// etcd + kube-apiserver (+ controller-manager) from `e2e/controlplane/run`.
    ControlPlane,
    /// systemd as PID 1 of a booted nspawn container (`e2e/nspawn/run`).
    Nspawn,
    /// containerd 1.6 (Debian) with a local registry (`e2e/containerd/run`).
    Containerd,
    /// The same with containerd 2.x built from pinned modules.
    ContainerdV2,
    /// A Debian guest under QEMU/TCG, restored from the saved booted VM (`e2e/qemu/run`).
    Qemu,
    /// The host-install suite: a QEMU guest joined to a control plane (`e2e/run host`).
    HostSuite,
    /// The container-install suite: a QEMU guest provisioned by Ignition, joined from a
    /// container (`e2e/container/run suite`).
    ContainerSuite,
    /// The native multi-node suite: three booted nspawn nodes joined to a control plane
    /// (`e2e/native/lab suite`).
    NativeSuite,
}

impl Tier {
    pub fn variable(self) -> &'static str {
        match self {
            Self::ControlPlane => "FLEXNODE_SKIP_CONTROLPLANE",
            Self::Nspawn => "FLEXNODE_SKIP_NSPAWN",
            Self::Containerd | Self::ContainerdV2 => "FLEXNODE_SKIP_CONTAINERD",
            Self::Qemu => "FLEXNODE_SKIP_QEMU",
            Self::HostSuite => "FLEXNODE_SKIP_HOST_SUITE",
            Self::ContainerSuite => "FLEXNODE_SKIP_CONTAINER_SUITE",
            Self::NativeSuite => "FLEXNODE_SKIP_NATIVE_SUITE",
        }
    }

    /// The scripts whose `check` says whether the tier is ready.
    fn checks(self) -> &'static [&'static [&'static str]] {
        match self {
            Self::ControlPlane => &[&["e2e/controlplane/run", "check"]],
            Self::Nspawn => &[&["e2e/nspawn/run", "check"]],
            Self::Containerd => &[&["e2e/containerd/run", "check"]],
            Self::ContainerdV2 => &[&["e2e/containerd/run", "check", "--v2"]],
            Self::Qemu => &[&["e2e/qemu/run", "check"]],
            Self::HostSuite | Self::ContainerSuite => &[
                &["e2e/controlplane/run", "check"],
                &["e2e/qemu/run", "check"],
            ],
            Self::NativeSuite => &[
                &["e2e/controlplane/run", "check"],
                &["e2e/native/run", "check"],
            ],
        }
    }
}

/// Fails the test unless `tier` is ready. A skip variable with any value but `1` fails too:
/// `1` would have compiled the test as ignored.
pub fn require(tier: Tier) {
    let var = tier.variable();
    match std::env::var_os(var) {
        None => {}
        Some(v) if v == "1" => panic!(
            "{var}=1, but this test binary was built without it: run it through `cargo test`, \
             which compiles the tier's tests as skipped"
        ),
        Some(v) => panic!(
            "{var}={v:?}: a tier is skipped only with {var}=1; unset it to run the {tier:?} tier"
        ),
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    for check in tier.checks() {
        let out = Command::new(repo.join(check[0]))
            .args(&check[1..])
            .output()
            .unwrap_or_else(|e| panic!("run {}: {e}", check.join(" ")));
        if !out.status.success() {
            panic!(
                "{}{}(or skip this tier with {var}=1)",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
