//! The README's first command until the QEMU lab exists: the real core, store and executor
//! run against the simulated host, and `flexnode status` shows the node moving through an
//! AgentUpgrade, a crash-looping candidate that is rolled back, and a NodeReboot.
//!
//!     cargo run --example simulated-lab [-- STORE_DIR]

use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::lifecycle::input::ClaimKind;
use flexnode::sim::Build;
use flexnode::sim::{SimNode, upgrade};
use flexnode::status_report;
use flexnode::store::StoreReader;
use std::path::{Path, PathBuf};

const GOOD: &str = "https://artifacts.example/flexnode-0.2.0.tar.gz?sig=SAS-TOKEN-NEVER-SHOWN";
const GOOD_SHA: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
const BROKEN: &str = "https://artifacts.example/flexnode-0.3.0-broken.tar.gz";
const BROKEN_SHA: &str = "60303ae22b998861bce3b28f33eec1be758a213c86c93c076dbe9f558c11c752";

fn show(title: &str, store: &Path) -> anyhow::Result<()> {
    println!("\n=== {title}\n$ flexnode status");
    let reader = StoreReader::open(store)?;
    print!(
        "{}",
        status_report::render_human(&status_report::build(&reader)?)
    );
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let dir = match std::env::args().nth(1) {
        Some(d) => PathBuf::from(d),
        None => std::env::temp_dir().join(format!("flexnode-sim-{}", std::process::id())),
    };
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    let store = dir.join("state.db");
    let _ = std::fs::remove_file(&store);
    println!(
        "flexnode simulated lab: real core + SQLite store at {}, simulated host",
        store.display()
    );

    let mut node = SimNode::new(&store, Timestamp::from_millis(1_785_578_400_000));
    node.host.serve_artifact(
        GOOD,
        GOOD_SHA,
        Build {
            version: "0.2.0".into(),
            crashes: false,
        },
    );
    node.host.serve_artifact(
        BROKEN,
        BROKEN_SHA,
        Build {
            version: "0.3.0".into(),
            crashes: true,
        },
    );

    node.join(InstallMode::Host, "edge-07").await?;
    node.boot().await?;
    show(
        "joined: flexnode-agent.service runs the blue slot, kube1 is active",
        &store,
    )?;

    node.claim("upgrade-1", upgrade(GOOD, GOOD_SHA)).await?;
    show(
        "AgentUpgrade staged and switched; the old daemon scheduled its restart",
        &store,
    )?;
    node.settle().await?;
    show(
        "the successor (green slot) judged the hand-off and published Complete",
        &store,
    )?;

    node.claim("upgrade-2", upgrade(BROKEN, BROKEN_SHA)).await?;
    node.settle().await?;
    show(
        "the 0.3.0 candidate crash-looped: the recovery unit restored the last-good agent, which published DaemonFailed",
        &store,
    )?;

    node.claim("reboot-1", ClaimKind::node_reboot()).await?;
    show("NodeReboot restarted the active nspawn machine", &store)?;

    println!("\n$ flexnode history");
    let reader = StoreReader::open(&store)?;
    for e in reader.journal(100)? {
        println!("{}", status_report::journal_line(&e));
    }
    println!("\nStatus writes the simulated API server received:");
    for (op, r) in node.host.results() {
        println!(
            "  {} -> {}/{}: {}",
            op.name,
            r.reason.phase(),
            r.reason.as_str(),
            r.message
        );
    }
    println!(
        "\nstore kept at {} (try: flexnode --state {} status -o yaml)",
        store.display(),
        store.display()
    );
    Ok(())
}
