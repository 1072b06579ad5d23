//! Benchmarks of the real effects (never timed assertions): `cargo bench --bench effects`.
//! Each prints medians; `docs/benchmarks.md` records them.
//!
//! - containerd: pull + unpack of a 10 MB, 2-layer image by digest, 5 runs, on containerd 1.6
//!   and 2.x (the image is removed between runs): flexnode over plain http and over TLS with
//!   the token flow, and `ctr images pull` (client-side, and 2.x's Transfer service);
//! - the agent's image (`image/build`, built into the cache): pull by index digest over TLS +
//!   token auth and the candidate check (`flexnode version` in a short-lived container), 5
//!   runs on containerd 1.6, the image removed between runs;
//! - the lab's node image (`e2e/node-image/build build node`, cached): pull by digest over
//!   TLS with token auth, then unpack into a machine's tree (`unpack_image_into`), 3 runs on
//!   containerd 1.6, the image and the tree removed between runs;
//! - systemd (a booted nspawn container): the D-Bus restart round trip (21 runs) and the
//!   transient-timer restart with a 1000 ms delay (5 runs).
//!
//! Needs the tiers the tests use (`.ci/run` installs them).

#[path = "../tests/support/mod.rs"]
mod support;
// Flags, medians and the cache directory (benches/common/).
mod common;

use common::{cache_dir, median};
use flexnode::effects::systemd::DbusSystemd;
use flexnode::effects::{Containerd, Systemd};
use flexnode::lifecycle::Timestamp;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::containerd::{Flavor, NS, Tier, snapshotter};
use support::nspawn::Container;
use support::wait_for;

fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    Timestamp::from_millis(i64::try_from(d.as_millis()).expect("ms fit i64"))
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1000.0
}

fn report(what: &str, times: &[f64]) {
    println!(
        "{what}: median {:.0} ms, runs {:?}",
        median(times.to_vec()),
        times.iter().map(|t| t.round()).collect::<Vec<_>>()
    );
}

/// `ctr` against the tier's daemon; panics when it fails.
fn ctr(tier: &Tier, args: &[&str]) {
    let out = Command::new(&tier.ctr)
        .arg("-a")
        .arg(&tier.socket)
        .args(["-n", NS])
        .args(args)
        .output()
        .expect("ctr");
    assert!(
        out.status.success(),
        "ctr {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Pull + unpack of a 10 MB, 2-layer image by digest, 5 runs each, the image removed (with
/// synchronous garbage collection) between runs: flexnode from the plain-HTTP registry (the
/// row earlier builds measured), flexnode from the TLS registry with the token flow, and
/// containerd's own pulls through `ctr` (client-side; on 2.x also the Transfer service).
async fn pull_10mb(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let secure = tier.secure();
    let digest = tier.image("e2e/big:v1", 10, false);
    let label = format!("containerd {} ({})", tier.version, snapshotter());
    let agent = tier.grpc(secure.registry_config()).await;
    for (what, registry) in [
        ("plain http", &tier.registry),
        ("TLS + token", &secure.token),
    ] {
        let reference = format!("{registry}/e2e/big@{}", digest.oci());
        let mut times = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            agent.pull(&reference, &digest).await.expect("pull");
            times.push(ms(start));
            assert!(agent.image_present(&digest).await.expect("present"));
            agent.remove_agent_image(&digest).await.expect("remove");
        }
        report(&format!("{label}: flexnode pull, {what}"), &times);
    }
    let reference = tier.reference("e2e/big", &digest);
    let snapshotter = snapshotter();
    let mut ways: Vec<(&str, Vec<&str>)> = Vec::new();
    match flavor {
        Flavor::V1_6 => ways.push(("ctr images pull (client-side)", vec!["--plain-http"])),
        Flavor::V2 => {
            ways.push(("ctr images pull (Transfer service)", vec!["--plain-http"]));
            ways.push((
                "ctr images pull --local (client-side)",
                vec!["--plain-http", "--local"],
            ));
        }
    }
    for (what, flags) in ways {
        let mut times = Vec::new();
        for _ in 0..5 {
            let mut args = vec!["images", "pull", "--snapshotter", &snapshotter];
            args.extend(&flags);
            args.push(&reference);
            let start = Instant::now();
            ctr(&tier, &args);
            times.push(ms(start));
            ctr(&tier, &["images", "rm", "--sync", &reference]);
        }
        report(&format!("{label}: {what}, plain http"), &times);
    }
}

async fn agent_image_pull_and_check() {
    let tmp = tempfile::tempdir().expect("tmp");
    let layout = tmp.path().join("layout");
    let digest = support::image::build(&layout, &[]);
    let tier = Tier::up(Flavor::V1_6);
    let secure = tier.secure();
    support::image::push(
        &layout,
        &format!("{}/flexnode/agent:bench", secure.basic),
        Some(&secure),
    );
    let index = flexnode::lifecycle::agent::Sha256Hex::parse(&digest).expect("digest");
    let agent = tier
        .grpc(secure.registry_config())
        .await
        .with_check(tier.dir.join("checks"), Duration::from_secs(60));
    let reference = format!("{}/flexnode/agent@{digest}", secure.token);
    let (mut pulls, mut checks) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        agent
            .pull_content(&reference, &index, None)
            .await
            .expect("pull");
        pulls.push(ms(t));
        let t = Instant::now();
        agent.check_image(&index).await.expect("check");
        checks.push(ms(t));
        agent.remove_agent_image(&index).await.expect("remove");
    }
    let label = format!(
        "agent image {} on containerd {}",
        &digest[..19],
        tier.version
    );
    report(&format!("{label}: pull by digest, TLS + token"), &pulls);
    report(&format!("{label}: candidate check"), &checks);
}

async fn node_image_pull_and_unpack() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(repo.join("e2e/node-image/build"))
        .args(["build", "node"])
        .output()
        .expect("run e2e/node-image/build");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let digest = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let layout = cache_dir().join("node-image/node-layout");
    let tier = Tier::up(Flavor::V1_6);
    let secure = tier.secure();
    support::image::push(
        &layout,
        &format!("{}/lab/node:bench", secure.basic),
        Some(&secure),
    );
    let index = flexnode::lifecycle::agent::Sha256Hex::parse(&digest).expect("digest");
    let agent = tier.grpc(secure.registry_config()).await;
    let reference = format!("{}/lab/node@{digest}", secure.token);
    let (mut pulls, mut unpacks) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let tree = tempfile::tempdir().expect("tmp");
        let t = Instant::now();
        agent
            .pull_content(&reference, &index, None)
            .await
            .expect("pull");
        pulls.push(ms(t));
        let t = Instant::now();
        agent
            .unpack_image_into(&index, &tree.path().join("kube1"))
            .await
            .expect("unpack");
        unpacks.push(ms(t));
        agent.remove_agent_image(&index).await.expect("remove");
    }
    let label = format!(
        "node image {} on containerd {}",
        &digest[..19],
        tier.version
    );
    report(&format!("{label}: pull by digest, TLS + token"), &pulls);
    report(&format!("{label}: unpack into a machine tree"), &unpacks);
}

async fn systemd_restarts() {
    let c = Container::up(&format!("fxbench-{}", std::process::id()));
    let sd = DbusSystemd::at_address(&c.bus)
        .await
        .expect("connect")
        .with_unit_dir(&c.units)
        .with_job_timeout(Duration::from_secs(30));
    let unit = "fx-bench.service";
    sd.write_unit(
        unit,
        "[Unit]\nDescription=bench\nStartLimitIntervalSec=0\n\n[Service]\nExecStart=/bin/sleep infinity\n",
    )
    .await
    .expect("write");
    sd.daemon_reload().await.expect("reload");
    sd.start(unit).await.expect("start");
    let mut restarts = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        sd.restart(unit).await.expect("restart");
        restarts.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let mut delays = Vec::new();
    for _ in 0..5 {
        let before = sd.active_since(unit).await.expect("since").expect("active");
        let scheduled = now();
        sd.schedule_restart(unit, 1000).await.expect("schedule");
        let after = wait_for(Duration::from_secs(10), || async {
            sd.active_since(unit)
                .await
                .expect("since")
                .filter(|t| *t > before)
        })
        .await
        .expect("restarted");
        delays.push((after.millis() - scheduled.millis()) as f64);
    }
    println!(
        "systemd: container boot {} ms; restart round trip median {:.1} ms (21 runs); \
         transient-timer restart (1000 ms) scheduled -> active median {:.0} ms (5 runs)",
        c.boot_ms,
        median(restarts),
        median(delays)
    );
}

/// `cargo bench --bench effects -- WORD…` runs the benchmarks whose names hold a WORD.
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let words: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| words.is_empty() || words.iter().any(|w| name.contains(w.as_str()));
    if wanted("pull_10mb") {
        pull_10mb(Flavor::V1_6).await;
        pull_10mb(Flavor::V2).await;
    }
    if wanted("agent_image_pull_and_check") {
        agent_image_pull_and_check().await;
    }
    if wanted("node_image_pull_and_unpack") {
        node_image_pull_and_unpack().await;
    }
    if wanted("systemd_restarts") {
        systemd_restarts().await;
    }
}
