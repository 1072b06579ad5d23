//! The tests that wait on whole labs for many minutes, in one binary so that they wait side
//! by side: the install suites' labs (`install_suites`: a QEMU/TCG guest for each install
//! mode's checks that need a machine of their own, native nodes for the rest) and the API server
//! away (`apiserver_away`, two control planes stopped for minutes). libtest would run them
//! one per core, two at a time here, and the outage's five minutes would add to CI's time;
//! they mostly wait on guests and outages, so this harness (libtest-mimic: libtest's
//! arguments and output) starts them all at once unless `--test-threads` says otherwise.
//!
//! A tier's skip variable marks its trials ignored, as `build.rs` does for libtest's tests
//! (`tests/support/tier.rs`); the reason is printed, as libtest prints it.

#[path = "../support/mod.rs"]
mod support;

mod apiserver_away;
mod install_suites;

use libtest_mimic::{Arguments, Trial};
use std::future::Future;
use std::process::ExitCode;

/// An async test on a runtime of its own, as `#[tokio::test(flavor = "multi_thread",
/// worker_threads = 2)]` would run it.
fn on_runtime<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(test())
}

/// `skipped`: the reason, when a skip variable set at build time skips the trial.
fn trial(name: &str, skipped: Option<&str>, test: fn()) -> Trial {
    if let Some(reason) = skipped {
        eprintln!("{name}: ignored, {reason}");
    }
    Trial::test(name, move || {
        test();
        Ok(())
    })
    .with_ignored_flag(skipped.is_some())
}

fn main() -> ExitCode {
    let controlplane = cfg!(flexnode_skip = "controlplane")
        .then_some("SKIPPED controlplane: FLEXNODE_SKIP_CONTROLPLANE=1");
    let nspawn = cfg!(flexnode_skip = "nspawn").then_some("SKIPPED nspawn: FLEXNODE_SKIP_NSPAWN=1");
    let native = cfg!(flexnode_skip = "native-suite")
        .then_some("SKIPPED native-suite: FLEXNODE_SKIP_NATIVE_SUITE=1");
    let trials = vec![
        trial(
            "apiserver_away::the_api_server_away_for_minutes_in_the_middle_of_three_operations",
            nspawn.or(controlplane),
            || {
                on_runtime(apiserver_away::the_api_server_away_for_minutes_in_the_middle_of_three_operations)
            },
        ),
        trial(
            "apiserver_away::the_api_server_back_without_its_data",
            controlplane,
            || on_runtime(apiserver_away::the_api_server_back_without_its_data),
        ),
        trial(
            "install_suites::container_install_suite_passes_in_a_fresh_qemu_lab",
            cfg!(flexnode_skip = "container-suite")
                .then_some("SKIPPED container-suite: FLEXNODE_SKIP_CONTAINER_SUITE=1"),
            install_suites::container_install_suite_passes_in_a_fresh_qemu_lab,
        ),
        trial(
            "install_suites::host_install_suite_passes_in_a_fresh_qemu_lab",
            cfg!(flexnode_skip = "host-suite")
                .then_some("SKIPPED host-suite: FLEXNODE_SKIP_HOST_SUITE=1"),
            install_suites::host_install_suite_passes_in_a_fresh_qemu_lab,
        ),
        trial(
            "install_suites::container_install_suite_passes_on_a_native_node",
            native,
            install_suites::container_install_suite_passes_on_a_native_node,
        ),
        trial(
            "install_suites::host_install_suite_passes_on_a_native_node",
            native,
            install_suites::host_install_suite_passes_on_a_native_node,
        ),
        trial(
            "install_suites::native_suite_passes_in_a_fresh_lab_of_three_nodes",
            native,
            install_suites::native_suite_passes_in_a_fresh_lab_of_three_nodes,
        ),
    ];
    let mut args = Arguments::from_args();
    args.test_threads.get_or_insert(trials.len());
    libtest_mimic::run(&args, trials).exit_code()
}
