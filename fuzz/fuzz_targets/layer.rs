//! cargo-fuzz target `layer`: the checks are in `fuzz/src/layer.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("layer"),
    |data: &[u8]| {
        flexnode_fuzz::layer::check(data, flexnode_fuzz::scratch("layer"));
    }
);
