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
//! - native host: `e2e/native/lab host-suite` — one native node, and the host suite's checks
//!   that need no machine of their own (`--tier native`); the QEMU host lab keeps the rest.
//! - native container: `e2e/container/run native-suite` — the container lab with a native node
//!   (`/usr` a read-only bind) for the QEMU guest, and the container suite's checks that need
//!   no machine of their own. The native labs take turns (one lab address per machine).

use crate::support::suite::passes;
use crate::support::tier::{Tier, require};

// The floors: each tier's number of checks today (e2e/README.md, "Where each check runs"), so
// that a check moved between tiers must be counted in the other, and none is dropped.

pub fn host_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::HostSuite);
    passes(
        "host",
        "e2e/run",
        &["host"],
        ("e2e/host/suite.py", "qemu"),
        6,
    );
}

pub fn host_install_suite_passes_on_a_native_node() {
    require(Tier::NativeSuite);
    passes(
        "native-host",
        "e2e/native/lab",
        &["host-suite"],
        ("e2e/host/suite.py", "native"),
        21,
    );
}

pub fn container_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::ContainerSuite);
    passes(
        "container",
        "e2e/container/run",
        &["suite"],
        ("e2e/container/suite.py", "qemu"),
        6,
    );
}

pub fn container_install_suite_passes_on_a_native_node() {
    require(Tier::NativeSuite);
    passes(
        "native-container",
        "e2e/container/run",
        &["native-suite"],
        ("e2e/container/suite.py", "native"),
        24,
    );
}

pub fn native_suite_passes_in_a_fresh_lab_of_three_nodes() {
    require(Tier::NativeSuite);
    passes(
        "native",
        "e2e/native/lab",
        &["suite"],
        ("e2e/native/suite.py", "native"),
        9,
    );
}
