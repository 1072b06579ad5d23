//! cargo-fuzz target `archive`: the checks are in `fuzz/src/archive.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("archive"),
    |data: &[u8]| {
        flexnode_fuzz::archive::check(data, flexnode_fuzz::scratch("archive"));
    }
);
