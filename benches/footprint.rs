//! The single-agent footprint (docs/benchmarks.md, "Footprint"), never a timed assertion:
//!
//! - the binary's size, and `version`'s wall time and peak RSS (11 runs under GNU time,
//!   medians) — of the Go agent too when `--anchor BIN` is given;
//! - the daemon as a node runs it: the host install joined in a booted nspawn container, under
//!   its systemd, against a real API server with the agents' RBAC: systemd's start → `READY=1`
//!   (5 restarts, median, from the journal), RSS after a minute and at the end of the idle
//!   window, CPU seconds per idle hour, and every API request it made in the window, from
//!   the API server's audit log of group `flexnode:agents`;
//! - SQLite commit latency (`synchronous=FULL`, WAL) of the store's intent and outcome
//!   transactions on the disk of `FLEXNODE_CACHE`, 201 of each, medians.
//!
//! `cargo bench --bench footprint -- --bin PATH [--anchor PATH] [--idle SECS] [--out FILE]`
//! (`bench/run` runs it with the release build and a 600 s window).

#[path = "../tests/support/mod.rs"]
mod support;
// Flags, medians and the cache directory (benches/common/).
mod common;

use common::{cache_dir, flag, median};
use flexnode::lifecycle::{Effect, Input, NodeState, Timestamp};
use flexnode::store::Store;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::Lab;
use support::agent::apply_rbac;
use support::hostnode::HostNode;
use support::proc::{cpu_secs_in, rss_mib_in};

const NODE: &str = "footprint-0";

fn main() {
    let bin = PathBuf::from(flag("--bin").expect("--bin PATH: the flexnode binary to measure"));
    let idle = Duration::from_secs(
        flag("--idle")
            .map(|s| s.parse().expect("--idle SECS"))
            .unwrap_or(600),
    );
    let out = PathBuf::from(flag("--out").unwrap_or_else(|| "footprint.json".into()));
    let mut results = json!({ "flexnode": binary(&bin) });
    if let Some(anchor) = flag("--anchor") {
        results["anchor"] = binary(Path::new(&anchor));
    }
    results["store"] = store_commits();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    results["daemon"] = runtime.block_on(daemon(&bin, idle));
    let text = serde_json::to_string_pretty(&results).expect("json");
    std::fs::write(&out, text + "\n").expect("write the results");
    println!("footprint: results in {}", out.display());
}

/// Size, and `version` under GNU time (`%M`: peak RSS in KiB).
fn binary(bin: &Path) -> Value {
    let size = std::fs::metadata(bin).expect("the binary").len();
    let (mut wall, mut peak) = (vec![], vec![]);
    for _ in 0..11 {
        let start = Instant::now();
        let out = Command::new("/usr/bin/time")
            .args(["-f", "%M"])
            .arg(bin)
            .arg("version")
            .stdout(Stdio::null())
            .output()
            .expect("/usr/bin/time (Debian package time; bench/run installs it)");
        assert!(out.status.success(), "{} version failed", bin.display());
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or_default().to_owned();
        let kib: f64 = last
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("GNU time said {last:?}"));
        // GNU time's own wall clock has 10 ms steps.
        wall.push(start.elapsed().as_secs_f64() * 1000.0);
        peak.push(kib / 1024.0);
    }
    let result = json!({
        "path": bin.display().to_string(),
        "bytes": size,
        "version_wall_ms": median(wall),
        "version_peak_rss_mib": median(peak),
    });
    eprintln!("footprint: {result}");
    result
}

/// The store's two transactions of every effectful step, each its own fsync'd commit.
fn store_commits() -> Value {
    let cache = cache_dir();
    let dir = tempfile::tempdir_in(&cache).expect("a directory on the cache's disk");
    let mut store = Store::open(&dir.path().join("flexnode/state.db")).expect("open");
    let s = NodeState::default();
    let t = Timestamp::from_millis(1_785_578_400_000);
    let (mut intents, mut outcomes) = (vec![], vec![]);
    for i in 0..201 {
        let start = Instant::now();
        let seq = store
            .begin_step(&s, &Input::Tick, &s, &[Effect::WipeNode], t.plus_secs(i))
            .expect("intent");
        intents.push(start.elapsed().as_secs_f64() * 1000.0);
        let start = Instant::now();
        store
            .finish_step(seq, "ok", None, t.plus_secs(i))
            .expect("outcome");
        outcomes.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    let result = json!({
        "disk": cache.display().to_string(),
        "intent_commit_ms": median(intents),
        "outcome_commit_ms": median(outcomes),
    });
    eprintln!("footprint: store {result}");
    result
}

/// The daemon as a node runs it: the host install joined in a booted nspawn container
/// (tests/support/hostnode.rs) under the container's systemd, against a real API server
/// that audits the agents' group.
async fn daemon(bin: &Path, idle: Duration) -> Value {
    let lab = Lab::up_audited();
    apply_rbac(&lab);
    let node = HostNode::join(&lab, &format!("fxfp-{}", std::process::id()), NODE, bin);
    let mut readies = vec![];
    for _ in 0..5 {
        readies.push(node.restart_agent().await);
    }
    let ready = median(readies.clone());
    let proc = node.agent_proc();
    eprintln!(
        "footprint: READY {ready:.0} ms after systemd's start; idle for {} s",
        idle.as_secs()
    );
    tokio::time::sleep(Duration::from_secs(60).min(idle)).await;
    let window_start = lab.audit_len();
    let (rss_warm, cpu_start, started) = (rss_mib_in(&proc), cpu_secs_in(&proc), Instant::now());
    while started.elapsed() < idle.saturating_sub(Duration::from_secs(60)) {
        tokio::time::sleep(Duration::from_secs(60)).await;
        eprintln!(
            "footprint: idle {:.0} s, RSS {:.1} MiB",
            started.elapsed().as_secs_f64() + 60.0,
            rss_mib_in(&proc)
        );
    }
    let window = started.elapsed().as_secs_f64();
    let (rss_end, cpu) = (rss_mib_in(&proc), cpu_secs_in(&proc) - cpu_start);
    assert_eq!(proc, node.agent_proc(), "the agent restarted while idle");
    let requests = lab.audited(&format!("system:flexnode:{NODE}"), window_start);
    let non_watch: u64 = requests
        .iter()
        .filter(|(k, _)| !k.starts_with("watch "))
        .map(|(_, n)| n)
        .sum();
    json!({
        "ready_ms": ready,
        "ready_runs_ms": readies,
        "rss_mib_after_1min": rss_warm,
        "rss_mib_idle": rss_end,
        "idle_window_secs": window,
        "cpu_secs_per_idle_hour": cpu * 3600.0 / window,
        "requests_in_window": requests,
        "non_watch_requests_per_idle_minute": non_watch as f64 * 60.0 / window,
    })
}
