//! cargo-fuzz target `archive_url`: the checks are in `fuzz/src/archive_url.rs` (shared with
//! `tests/core/fuzz_findings.rs`, which replays every kept input).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: flexnode_fuzz::write_seeds("archive_url"),
    |data: &[u8]| {
        flexnode_fuzz::archive_url::check(data, flexnode_fuzz::scratch("archive_url"));
    }
);
