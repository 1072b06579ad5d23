//! What the benchmark programs (`benches/*.rs`) share: their flags, medians, the cache
//! directory. A directory, so that cargo does not take it for a benchmark of its own; not
//! every benchmark uses every helper.
#![allow(dead_code)]

use std::path::PathBuf;

/// The value after `name` on the command line (`--out FILE`).
pub fn flag(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `FLEXNODE_CACHE` (default `~/.cache/flexnode`), created: a real disk, not tmpfs.
pub fn cache_dir() -> PathBuf {
    let cache = std::env::var_os("FLEXNODE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/flexnode")
        });
    std::fs::create_dir_all(&cache).expect("the cache directory");
    cache
}
