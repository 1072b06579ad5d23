//! The host-install suite: `e2e/run host` brings up a fresh lab — the control plane on this
//! host, the artifact server on loopback, a Debian QEMU/TCG guest restored from the saved
//! booted VM — installs flexnode in the guest with `flexnode join` and runs the named checks
//! of `e2e/host/suite.py`, then tears the lab down. Held to the suite's own list
//! (`tests/support/suite.rs`). A missing tier fails the test; it is skipped only with
//! `FLEXNODE_SKIP_HOST_SUITE=1` (`tests/support/tier.rs`).

mod support;

use support::tier::{Tier, require};

#[test]
#[cfg_attr(
    flexnode_skip = "host-suite",
    ignore = "SKIPPED host-suite: FLEXNODE_SKIP_HOST_SUITE=1"
)]
fn host_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::HostSuite);
    support::suite::passes("e2e/run", &["host"], "e2e/host/suite.py", 17);
}
