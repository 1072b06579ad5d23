//! The core and what needs no daemon: the state machine's table and properties, the
//! simulated host, the store (SQLite) and its bad environments, the CLI, the fuzzers'
//! findings, and the generated and upstream-checked files (CRDs, unit files, Ignition). The
//! crash simulation is a crate of its own (`tests/crash_simulation/`): it runs itself again
//! as the child it kills, and its deaths want a process to themselves.

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod fuzz;
mod fuzz_findings;
mod generated;
mod ignition;
mod layers;
mod lifecycle_props;
mod lifecycle_table;
mod node_images;
mod pointers;
mod simulation;
mod store;
mod store_bad_env;
mod systemd_units;
mod upstream_crds;
mod url_secrets;

// The fuzz checks name each other from what is their crate's root in fuzz/src/lib.rs.
use fuzz::{archive, common, oci_ref};
