//! The AgentUpgrade hand-off at native speed (docs/benchmarks.md, "Hand-off"), never a timed
//! assertion: the host install joined in a booted nspawn container on a real systemd
//! (tests/support/hostnode.rs) against a real kube-apiserver, then upgraded RUNS times in a
//! row (blue → green → blue …) from an archive of the same build on loopback HTTP. Each
//! upgrade's moments come from the container's journal; the medians go to `--out`.
//!
//! `cargo bench --bench handoff -- --bin PATH [--runs N] [--out FILE]`: PATH is the agent
//! joined and archived (`bench/run` gives the release build).

#[path = "../tests/support/mod.rs"]
mod support;

use serde_json::json;
use std::path::PathBuf;
use support::Lab;
use support::agent::{admin, apply_rbac};
use support::artifacts::{Served, write_archive};
use support::bench::{flag, median};
use support::hostnode::{Handoff, HostNode};

fn main() {
    let bin = PathBuf::from(flag("--bin").expect("--bin PATH: the agent to join and upgrade"));
    let out = PathBuf::from(flag("--out").unwrap_or_else(|| "handoff.json".into()));
    let runs: usize = flag("--runs").map_or(7, |r| r.parse().expect("--runs N"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = runtime.block_on(admin(&lab));
    let served = tempfile::tempdir().expect("a directory to serve");
    let binary = std::fs::read(&bin).expect("the agent binary");
    let sha = write_archive(&served.path().join("agent.tar.gz"), &binary);
    let archive_bytes = std::fs::metadata(served.path().join("agent.tar.gz"))
        .expect("archive")
        .len();
    let server = Served::dir(served.path());
    let node = HostNode::join(
        &lab,
        &format!("fxhb-{}", std::process::id()),
        "handoff-1",
        &bin,
    );
    let url = server.url("agent.tar.gz");

    let mut all: Vec<Handoff> = vec![];
    for i in 0..runs {
        let h = runtime.block_on(node.upgrade(&client, &format!("upgrade-{i}"), &url, &sha));
        assert_ne!(
            h.from_build, h.to_build,
            "upgrade-{i} did not switch: {h:?}"
        );
        eprintln!(
            "handoff: upgrade-{i} {} -> {}: gap {:.1} ms, after staging {:.1} ms, staging {:.1} ms",
            h.from_build,
            h.to_build,
            h.gap_ms(),
            h.after_staging_ms(),
            h.staging_ms()
        );
        all.push(h);
    }
    let part = |f: fn(&Handoff) -> f64| {
        let v: Vec<f64> = all.iter().map(f).collect();
        json!({ "median_ms": median(v.clone()), "runs_ms": v })
    };
    let result = json!({
        "runs": runs,
        "binary_bytes": binary.len(),
        "archive_bytes": archive_bytes,
        "gap": part(Handoff::gap_ms),
        "after_staging": part(Handoff::after_staging_ms),
        "staging": part(Handoff::staging_ms),
        "switch": part(Handoff::switch_ms),
        "timer": part(Handoff::timer_ms),
        "stop": part(Handoff::stop_ms),
        "start": part(Handoff::start_ms),
        "judge": part(Handoff::judge_ms),
        "publish": part(Handoff::publish_ms),
    });
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&result).expect("json") + "\n",
    )
    .expect("write the results");
    println!("handoff: results in {}", out.display());
}
