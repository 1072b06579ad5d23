//! Staging against the machine's limit (docs/benchmarks.md, "Staging"), never a timed
//! assertion: `ArchiveFetcher::install` of an agent archive (download over loopback HTTP,
//! SHA-256 while streaming, gunzip, the tar member checks, write, fsync, rename) against
//! `sha256sum` of the archive plus `gunzip` of it into a file on the same disk — the work no
//! stager can skip — alternating, 7 runs each, medians and their ratio.
//!
//! `cargo bench --bench staging -- --bin PATH [--out FILE]`: PATH is the binary archived
//! (`bench/run` gives the stripped debug build, the one the test labs stage). The archive is
//! packed and served (127.0.0.1, stopped by its PID) by the host lab's own tools,
//! `e2e/artifacts/pack` and `e2e/artifacts/serve`.

#[path = "../tests/support/mod.rs"]
mod support;
// Flags, medians and the cache directory (benches/common/).
mod common;

use common::{cache_dir, flag, median};
use flexnode::effects::archive::ArchiveFetcher;
use flexnode::lifecycle::agent::{Arch, ArchiveUrl, Sha256Hex};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;
use support::artifacts::{Served, pack};

const RUNS: usize = 7;

fn main() {
    let bin = PathBuf::from(flag("--bin").expect("--bin PATH: the binary to archive"));
    let out = PathBuf::from(flag("--out").unwrap_or_else(|| "staging.json".into()));
    // On the cache's disk, as a node's /var/lib would be: not tmpfs.
    let work = tempfile::tempdir_in(cache_dir()).expect("a work directory");
    let arch = Arch::from_rust(std::env::consts::ARCH);
    let served = work.path().join("served");
    let (name, digest) = pack(&served, "agent", &bin);
    let archive = served.join(&name);
    let archive_bytes = std::fs::metadata(&archive).expect("archive").len();
    let binary_bytes = std::fs::metadata(&bin).expect("the binary").len();
    let sha = Sha256Hex::parse(&digest).expect("sha256");
    let server = Served::dir(&served);
    let url: ArchiveUrl = serde_json::from_value(json!(server.url(&name))).expect("url");

    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let fetcher = ArchiveFetcher::new();
    let (mut staged, mut baseline) = (vec![], vec![]);
    for run in 0..RUNS {
        let slot = work.path().join(format!("slot-{run}"));
        std::fs::create_dir_all(&slot).expect("slot");
        let start = Instant::now();
        runtime
            .block_on(fetcher.install(&url, &sha, arch, &slot))
            .expect("install");
        staged.push(start.elapsed().as_secs_f64() * 1000.0);
        baseline.push(sha256sum_and_gunzip(&archive, &slot.join("gunzipped")));
        std::fs::remove_dir_all(&slot).expect("clean the slot");
    }
    drop(server);
    let (staged_ms, baseline_ms) = (median(staged.clone()), median(baseline.clone()));
    let result = json!({
        "binary_bytes": binary_bytes,
        "archive_bytes": archive_bytes,
        "install_ms": staged_ms,
        "install_runs_ms": staged,
        "sha256sum_gunzip_ms": baseline_ms,
        "sha256sum_gunzip_runs_ms": baseline,
        "ratio": staged_ms / baseline_ms,
    });
    eprintln!("staging: {result}");
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&result).expect("json") + "\n",
    )
    .expect("write the results");
    println!("staging: results in {}", out.display());
}

/// Milliseconds of `sha256sum ARCHIVE` then `gunzip -c ARCHIVE > OUT`.
fn sha256sum_and_gunzip(archive: &Path, out: &Path) -> f64 {
    let start = Instant::now();
    let sum = Command::new("sha256sum")
        .arg(archive)
        .stdout(Stdio::null())
        .status()
        .expect("sha256sum");
    assert!(sum.success(), "sha256sum");
    let file = std::fs::File::create(out).expect("gunzip's output");
    let unzip = Command::new("gunzip")
        .arg("-c")
        .arg(archive)
        .stdout(file)
        .status()
        .expect("gunzip");
    assert!(unzip.success(), "gunzip");
    start.elapsed().as_secs_f64() * 1000.0
}
