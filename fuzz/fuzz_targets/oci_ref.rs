//! cargo-fuzz target `oci_ref`: the checks are in `fuzz/src/oci_ref.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("oci_ref"),
    |data: &[u8]| {
        flexnode_fuzz::oci_ref::check(data, flexnode_fuzz::scratch("oci_ref"));
    }
);
