//! Comments and documents point only at files of this repository, and at files that exist: a
//! comment of the Rust sources, `Cargo.toml` or an e2e script, or a line of a Markdown
//! document, that names a path under one of the repository's folders (`src/lifecycle/fault.rs`, `docs/design.md`), or a bare `.rs`/`.md`
//! file name (`owner.rs`, `README.md`), fails here once that file is moved or gone.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's top-level folders and files a pointer starts with.
const ROOTS: &[&str] = &[
    ".ci/",
    "bench/",
    "benches/",
    "completions/",
    "docs/",
    "e2e/",
    "examples/",
    "fuzz/",
    "image/",
    "man/",
    "manifests/",
    "src/",
    "state/",
    "tests/",
    "units/",
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file of the repository (relative), without build output and version control.
fn files() -> Vec<String> {
    let root = repo();
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("a repository folder") {
            let path = entry.expect("entry").path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if path.is_dir() {
                if !matches!(name, ".git" | "target" | "__pycache__") {
                    dirs.push(path);
                }
            } else {
                let rel = path.strip_prefix(&root).expect("under the repo");
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// The comment text of `file`'s lines: after `//` in Rust, after `#` in TOML and scripts;
/// every line of a Markdown document.
fn comments(file: &str, text: &str) -> Vec<(usize, String)> {
    if file.ends_with(".md") {
        return text
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, l.to_string()))
            .collect();
    }
    let marker = if file.ends_with(".rs") { "//" } else { "#" };
    text.lines()
        .enumerate()
        .filter_map(|(n, l)| {
            // A marker inside a string (`"https://…"`, `"#"`) starts no comment.
            let (at, _) = l
                .match_indices(marker)
                .find(|(at, _)| l[..*at].matches('"').count() % 2 == 0)?;
            Some((n + 1, l[at..].to_string()))
        })
        .collect()
}

/// The paths a comment names: words that start with a repository folder, or bare `.rs` and
/// `.md` names; a trailing `:function` or `:line` and punctuation dropped. Patterns
/// (`step/{join,claim}.rs`, `<kind>.rs`, `*.rs`) and variables are no single file.
fn pointers(comment: &str) -> Vec<String> {
    let is_path = |c: char| c.is_ascii_alphanumeric() || "._/-{},<>*$+@".contains(c);
    comment
        .split(|c: char| !is_path(c))
        .filter_map(|w| {
            let w = w.split(':').next().unwrap_or_default();
            let w = w.trim_end_matches(['.', ',', '-', '/']);
            if w.contains(['{', '}', '<', '>', '*', '$', '@', '+']) || w.contains("//") {
                return None;
            }
            let rooted = ROOTS.iter().any(|r| w.starts_with(r)) && w.contains('.');
            let bare = !w.contains('/')
                && (w.ends_with(".rs") || w.ends_with(".md"))
                && w.len() > 3
                && !w.starts_with('.');
            (rooted || bare).then(|| w.to_string())
        })
        .collect()
}

/// Whether `pointer`, named in `from`, is a file here: from the repository's root, from
/// `from`'s folder, or (a bare name or a path inside `src/`) anywhere as the end of a path.
fn exists(files: &BTreeSet<String>, from: &str, pointer: &str) -> bool {
    let dir = Path::new(from).parent().unwrap_or(Path::new(""));
    files.contains(pointer)
        || files.contains(&dir.join(pointer).display().to_string())
        || files
            .iter()
            .any(|f| f.ends_with(&format!("/{pointer}")) || f == pointer)
}

#[test]
fn comments_name_only_files_that_exist() {
    let all = files();
    let set: BTreeSet<String> = all.iter().cloned().collect();
    let scanned = all.iter().filter(|f| {
        f.ends_with(".rs")
            || f.ends_with(".md")
            || f.as_str() == "Cargo.toml"
            || (f.starts_with("e2e/")
                && (f.ends_with(".sh") || f.ends_with(".py") || !f.contains('.')))
    });
    let mut stale = Vec::new();
    let mut checked = 0;
    for file in scanned {
        let Ok(text) = std::fs::read_to_string(repo().join(file)) else {
            continue; // not text
        };
        for (line, comment) in comments(file, &text) {
            for p in pointers(&comment) {
                checked += 1;
                if !exists(&set, file, &p) {
                    stale.push(format!(
                        "{file}:{line}: names {p}, which is not in the repository"
                    ));
                }
            }
        }
    }
    assert!(
        checked > 500,
        "only {checked} pointers found: is the scan broken?"
    );
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

#[test]
fn a_moved_file_is_told_apart_from_a_pattern() {
    let files: BTreeSet<String> = ["src/lifecycle/fault.rs", "src/reconcile/owner/claims.rs"]
        .map(str::to_string)
        .into();
    let named = |c: &str| pointers(c);
    assert_eq!(named("// see src/fault.rs:of_store."), ["src/fault.rs"]);
    assert!(!exists(&files, "src/effects/kube.rs", "src/fault.rs"));
    assert!(exists(
        &files,
        "src/effects/kube.rs",
        "src/lifecycle/fault.rs"
    ));
    assert!(exists(&files, "src/reconcile/owner.rs", "owner/claims.rs"));
    assert_eq!(named("// domain.md §7.1.8 says"), ["domain.md"]);
    assert!(!exists(&files, "src/exec/apply.rs", "domain.md"));
    assert!(named("// step/{join,claim}.rs and src/lifecycle/step/<kind>.rs").is_empty());
    assert!(named("// https://example.com/src/x.rs and $DIR/src/y.rs").is_empty());
    assert_eq!(
        comments("x.rs", r#"let u = "https://h/src/x.rs"; // fine"#).len(),
        1
    );
}
