//! Both install modes' suites, each in a fresh QEMU/TCG lab of its own, run side by side
//! (`tests/labs/main.rs`; their labs share nothing but the caches). Each is held to its suite's own list (`tests/support/suite.rs`); a missing tier
//! fails the test, skipped only with its variable (`tests/support/tier.rs`).
//!
//! - host: `e2e/run host` — the control plane on this host, the artifact server on loopback,
//!   a Debian guest restored from the saved booted VM; `flexnode join` installs flexnode in
//!   the guest, then the checks of `e2e/host/suite.py`.
//! - container: `e2e/container/run suite` — the control plane, a TLS registry with auth
//!   holding the agent's images, a guest provisioned by upstream Ignition from `flexnode
//!   ignition`'s config and booted with `/usr` read-only, where the bootstrap unit joins from a
//!   container of the agent's image; then the checks of `e2e/container/suite.py`.
//! - native: `e2e/native/lab suite` — the control plane and three native nodes (booted nspawn
//!   containers on the lab bridge, e2e/native/README.md), each joined by `flexnode join`;
//!   then the multi-node checks of `e2e/native/suite.py`.

use crate::support::tier::{Tier, require};

pub fn host_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::HostSuite);
    crate::support::suite::passes("host", "e2e/run", &["host"], "e2e/host/suite.py", 17);
}

pub fn container_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::ContainerSuite);
    crate::support::suite::passes(
        "container",
        "e2e/container/run",
        &["suite"],
        "e2e/container/suite.py",
        20,
    );
}

pub fn native_suite_passes_in_a_fresh_lab_of_three_nodes() {
    require(Tier::NativeSuite);
    crate::support::suite::passes(
        "native",
        "e2e/native/lab",
        &["suite"],
        "e2e/native/suite.py",
        6,
    );
}
