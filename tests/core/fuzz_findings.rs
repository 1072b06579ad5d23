//! The fuzz targets' checks (`fuzz/src/`, compiled here with the stable compiler) over every
//! input kept under `fuzz/regressions/<target>/` (each one a fault a fuzzer found, now fixed;
//! docs/reliability.md, "Fuzzing") and over the seed corpora, each of which must still take the
//! path it was made for (so the checks are not vacuous). Fast: about a hundred small inputs.

use crate::fuzz::{
    archive, archive_url, common, config, layer, manifest, oci_ref, seeds, store, upgrade_params,
};

use common::Outcome;
use std::path::{Path, PathBuf};

const TARGETS: [&str; 8] = [
    "upgrade_params",
    "oci_ref",
    "archive_url",
    "config",
    "store",
    "archive",
    "manifest",
    "layer",
];

fn check(target: &str, data: &[u8], scratch: &Path) -> Outcome {
    match target {
        "upgrade_params" => upgrade_params::check(data, scratch),
        "oci_ref" => oci_ref::check(data, scratch),
        "archive_url" => archive_url::check(data, scratch),
        "config" => config::check(data, scratch),
        "store" => store::check(data, scratch),
        "archive" => archive::check(data, scratch),
        "manifest" => manifest::check(data, scratch),
        "layer" => layer::check(data, scratch),
        other => panic!("no fuzz target {other}"),
    }
}

/// A scratch directory on tmpfs when there is one (as the fuzzers use).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    tempfile::Builder::new()
        .prefix("flexnode-fuzz-test")
        .tempdir_in(base)
        .expect("scratch directory")
}

#[test]
fn every_kept_fuzz_finding_passes_its_checks() {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions"));
    let tmp = scratch();
    let mut replayed = 0;
    let mut failed: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(&root).expect("fuzz/regressions") {
        let dir = entry.expect("entry").path();
        if !dir.is_dir() {
            continue;
        }
        let target = dir
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a target's name");
        assert!(
            TARGETS.contains(&target),
            "fuzz/regressions/{target}: no such target"
        );
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("list")
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).expect("read a kept input");
            let scratch = tmp.path().join(target);
            std::fs::create_dir_all(&scratch).expect("scratch");
            if std::panic::catch_unwind(|| check(target, &data, &scratch)).is_err() {
                failed.push(file.display().to_string());
            }
            replayed += 1;
        }
    }
    assert!(
        failed.is_empty(),
        "kept inputs that fail their target's checks: {failed:#?}"
    );
    eprintln!("replayed {replayed} kept fuzz findings");
}

#[test]
fn every_seed_takes_the_path_it_was_made_for() {
    let tmp = scratch();
    let seeds = seeds::all();
    for target in TARGETS {
        assert!(
            seeds.iter().any(|s| s.target == target && s.accepted)
                && seeds.iter().any(|s| s.target == target && !s.accepted),
            "{target} needs a seed accepted and one refused"
        );
    }
    for seed in &seeds {
        let scratch = tmp.path().join(seed.target);
        std::fs::create_dir_all(&scratch).expect("scratch");
        let outcome = std::panic::catch_unwind(|| check(seed.target, &seed.data, &scratch))
            .unwrap_or_else(|_| panic!("seed {}/{} fails its checks", seed.target, seed.name));
        assert_eq!(
            outcome == Outcome::Accepted,
            seed.accepted,
            "seed {}/{}: {outcome:?}",
            seed.target,
            seed.name
        );
    }
    eprintln!("{} seeds checked", seeds.len());
}
