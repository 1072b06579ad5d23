//! cargo-fuzz target `store`: the checks are in `fuzz/src/store.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("store"),
    |data: &[u8]| {
        flexnode_fuzz::store::check(data, flexnode_fuzz::scratch("store"));
    }
);
