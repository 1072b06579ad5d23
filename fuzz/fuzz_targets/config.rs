//! cargo-fuzz target `config`: the checks are in `fuzz/src/config.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("config"),
    |data: &[u8]| {
        flexnode_fuzz::config::check(data, flexnode_fuzz::scratch("config"));
    }
);
