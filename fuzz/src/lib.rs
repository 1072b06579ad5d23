//! The fuzz targets' checks, one module per target. Each `check(data, scratch)` feeds `data`
//! to the agent's own code and panics when a property fails, beyond "no panic": what is
//! accepted is well formed, no message shows a URL's secret, nothing is written outside its
//! directory. `tests/core/fuzz_findings.rs` compiles the same modules (by `#[path]`) with the
//! stable compiler and replays the kept inputs under `fuzz/regressions/`.

pub mod archive;
pub mod archive_url;
pub mod common;
pub mod config;
pub mod layer;
pub mod manifest;
pub mod oci_ref;
pub mod seeds;
pub mod store;
pub mod upgrade_params;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Before the fuzzer reads its corpora: writes `target`'s seeds (`seeds.rs`) into the directory
/// `FLEXNODE_FUZZ_SEEDS` names, if set (`fuzz/run` passes it as a corpus).
pub fn write_seeds(target: &str) {
    let Some(dir) = std::env::var_os("FLEXNODE_FUZZ_SEEDS").map(PathBuf::from) else {
        return;
    };
    std::fs::create_dir_all(&dir).expect("create the seed directory");
    for seed in seeds::all().into_iter().filter(|s| s.target == target) {
        std::fs::write(dir.join(&seed.name), &seed.data).expect("write a seed");
    }
}

/// The scratch directory of `target` for this process: under `FLEXNODE_FUZZ_SCRATCH` (which
/// `fuzz/run` points at a private tmpfs), else under `/dev/shm`.
pub fn scratch(target: &str) -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::var_os("FLEXNODE_FUZZ_SCRATCH")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(format!("/dev/shm/flexnode-fuzz-{}", std::process::id()))
            });
        let dir = base.join(target);
        std::fs::create_dir_all(&dir).expect("create the scratch directory");
        dir
    })
}
