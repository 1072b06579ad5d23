//! cargo-fuzz target `upgrade_params`: the checks are in `fuzz/src/upgrade_params.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("upgrade_params"),
    |data: &[u8]| {
        flexnode_fuzz::upgrade_params::check(data, flexnode_fuzz::scratch("upgrade_params"));
    }
);
