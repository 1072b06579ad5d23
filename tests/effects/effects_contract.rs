//! One contract for the effects traits, run against the simulated host and the real
//! implementations, so the simulation cannot drift from the daemons it stands for. The cases
//! live in `tests/effects/contract/{systemd,containerd}.rs`, generic over the traits; each test here
//! runs all of one trait's cases against one implementation and reports every failing case.
//!
//! The real side needs root: a systemd booted in an nspawn container (`e2e/nspawn/run`) and
//! containerd 1.6 and 2.x with a local registry (`e2e/containerd/run`). A missing tier fails
//! the test; a tier is skipped only with `FLEXNODE_SKIP_NSPAWN=1` / `FLEXNODE_SKIP_CONTAINERD=1`
//! (`tests/support/tier.rs`).

use crate::contract;
use crate::support;

use contract::nspawn::Nspawn;
use contract::sim::Sim;
use contract::tier::Registry;
use flexnode_test_tier::tier;
use support::containerd::Flavor;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_systemd_keeps_the_contract() {
    contract::systemd::run_all("sim systemd", &Sim::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_containerd_keeps_the_contract() {
    contract::containerd::run_all("sim containerd", &Sim::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn)]
async fn dbus_systemd_keeps_the_contract() {
    let fx = Nspawn::up(&format!("fxct-{}", std::process::id())).await;
    contract::systemd::run_all("dbus systemd", &fx).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(containerd)]
async fn grpc_containerd_keeps_the_contract() {
    for (flavor, name) in [
        (Flavor::V1_6, "grpc containerd 1.6"),
        (Flavor::V2, "grpc containerd 2.x"),
    ] {
        let fx = Registry::up(flavor).await;
        contract::containerd::run_all(name, &fx).await;
    }
}
