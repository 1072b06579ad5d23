//! The AgentUpgrade hand-off at native speed (docs/benchmarks.md, "Hand-off"), never a timed
//! assertion: the host install joined in a booted nspawn container on a real systemd
//! (tests/support/hostnode.rs) against a real kube-apiserver, then upgraded RUNS times in a
//! row (blue → green → blue …) from an archive of the same build on loopback HTTP. Each
//! upgrade's moments come from the container's journal; the medians go to `--out`.
//!
//! `cargo bench --bench handoff -- --bin PATH [--runs N] [--out FILE] [--unsandboxed]
//! [--extra-mounts N]`: PATH is the agent joined and archived (`bench/run` gives the release
//! build). The new daemon's start is mostly systemd building the agent unit's sandbox, whose
//! cost grows with the mounts the host has (docs/benchmarks.md): `--unsandboxed` lifts the
//! unit's mount sandbox by a drop-in, `--extra-mounts N` adds N tmpfs mounts to the container
//! first; the result records the container's mount count either way.

#[path = "../tests/support/mod.rs"]
mod support;
// Flags, medians and the cache directory (benches/common/).
mod common;

use common::{flag, median};
use serde_json::json;
use std::path::PathBuf;
use support::Lab;
use support::agent::{admin, apply_rbac};
use support::artifacts::{Served, pack};
use support::hostnode::{Handoff, HostNode};

fn main() {
    let bin = PathBuf::from(flag("--bin").expect("--bin PATH: the agent to join and upgrade"));
    let out = PathBuf::from(flag("--out").unwrap_or_else(|| "handoff.json".into()));
    let runs: usize = flag("--runs").map_or(7, |r| r.parse().expect("--runs N"));
    let extra_mounts: usize =
        flag("--extra-mounts").map_or(0, |n| n.parse().expect("--extra-mounts N"));
    let unsandboxed = std::env::args().any(|a| a == "--unsandboxed");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = runtime.block_on(admin(&lab));
    let served = tempfile::tempdir().expect("a directory to serve");
    let (archive, sha) = pack(served.path(), "agent", &bin);
    let archive_bytes = std::fs::metadata(served.path().join(&archive))
        .expect("archive")
        .len();
    let binary_bytes = std::fs::metadata(&bin).expect("the agent binary").len();
    let server = Served::dir(served.path());
    let node = HostNode::join(
        &lab,
        &format!("fxhb-{}", std::process::id()),
        "handoff-1",
        &bin,
    );
    let url = server.url(&archive);
    if unsandboxed {
        lift_sandbox(&node);
    }
    for i in 0..extra_mounts {
        let dir = format!("/run/bench-mount-{i}");
        for cmd in [
            &["mkdir", "-p", &dir][..],
            &["mount", "-t", "tmpfs", "none", &dir],
        ] {
            let out = node.container.exec(cmd);
            assert!(out.status.success(), "{cmd:?}: {out:?}");
        }
    }
    let mounts = node.container.exec(&["cat", "/proc/1/mountinfo"]);
    let mounts = String::from_utf8_lossy(&mounts.stdout).lines().count();

    let mut all: Vec<Handoff> = vec![];
    for i in 0..runs {
        let h = runtime.block_on(node.upgrade(&client, &format!("upgrade-{i}"), &url, &sha));
        assert_ne!(
            h.from_build, h.to_build,
            "upgrade-{i} did not switch: {h:?}"
        );
        let spans = h.spans();
        eprintln!(
            "handoff: upgrade-{i} {} -> {}: {}",
            h.from_build,
            h.to_build,
            spans
                .map(|(name, ms)| format!("{name} {ms:.1} ms"))
                .join(", ")
        );
        all.push(h);
    }
    let mut result = json!({
        "runs": runs,
        "binary_bytes": binary_bytes,
        "archive_bytes": archive_bytes,
        "mounts": mounts,
        "sandboxed": !unsandboxed,
    });
    for (i, (name, _)) in all[0].spans().iter().enumerate() {
        let v: Vec<f64> = all.iter().map(|h| h.spans()[i].1).collect();
        result[name] = json!({ "median_ms": median(v.clone()), "runs_ms": v });
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&result).expect("json") + "\n",
    )
    .expect("write the results");
    println!("handoff: results in {}", out.display());
}

/// The agent unit without its mount sandbox (a drop-in after the unit's own), the rest kept:
/// what systemd's namespace set-up costs the start.
fn lift_sandbox(node: &HostNode) {
    let dir = node.container.units.join("flexnode-agent.service.d");
    std::fs::create_dir_all(&dir).expect("the drop-in directory");
    std::fs::write(
        dir.join("zz-bench-unsandboxed.conf"),
        "[Service]\nProtectSystem=no\nReadWritePaths=\nPrivateTmp=no\nProtectHome=no\n\
         PrivateDevices=no\nPrivateMounts=no\nProtectKernelTunables=no\nProtectKernelLogs=no\n\
         ProtectControlGroups=no\nProtectClock=no\nProtectHostname=no\nProtectProc=default\n",
    )
    .expect("write the drop-in");
    let out = node.container.exec(&["systemctl", "daemon-reload"]);
    assert!(out.status.success(), "daemon-reload: {out:?}");
}
