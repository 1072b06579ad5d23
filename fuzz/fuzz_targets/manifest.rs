//! cargo-fuzz target `manifest`: the checks are in `fuzz/src/manifest.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("manifest"),
    |data: &[u8]| {
        flexnode_fuzz::manifest::check(data, flexnode_fuzz::scratch("manifest"));
    }
);
