//! The container-install suite: `e2e/container/run suite` brings up a fresh lab — the
//! control plane, a TLS registry with auth holding the agent's images, a Debian QEMU/TCG guest
//! provisioned by upstream Ignition from `flexnode ignition`'s config and booted with `/usr`
//! read-only — where the bootstrap unit joins from a container of the agent's image, then
//! runs the named checks of `e2e/container/suite.py` and tears the lab down. Held to the
//! suite's own list (`tests/support/suite.rs`). A missing tier fails the test; it is skipped
//! only with `FLEXNODE_SKIP_CONTAINER_SUITE=1` (`tests/support/tier.rs`).

mod support;

use support::tier::{Tier, require};

#[test]
#[cfg_attr(
    flexnode_skip = "container-suite",
    ignore = "SKIPPED container-suite: FLEXNODE_SKIP_CONTAINER_SUITE=1"
)]
fn container_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::ContainerSuite);
    support::suite::passes(
        "e2e/container/run",
        &["suite"],
        "e2e/container/suite.py",
        20,
    );
}
