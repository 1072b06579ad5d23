//! docs/architecture.md's layer table, checked whole: every file of `src/` is placed in a
//! layer, and every import (`use crate::…`, `crate::…` in code, `super::…`) goes to the
//! same layer, a layer its row may import, or a file it names. An arrow against the table
//! fails with the two files named.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

struct Layer {
    name: String,
    /// Files (`src/<name>.rs`) and folders (`src/<name>/`).
    places: Vec<String>,
    /// Layer names, or `*` for every layer.
    layers: BTreeSet<String>,
    files: BTreeSet<String>,
}

/// The rows of the table whose header is `| layer | files | holds | may import |`.
fn table(doc: &str) -> Vec<Layer> {
    let mut rows = doc
        .lines()
        .skip_while(|l| !l.starts_with("| layer | files | holds | may import |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'));
    let mut out = Vec::new();
    for row in rows.by_ref() {
        let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(cells.len(), 4, "a layer row of four cells: {row}");
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(|p| p.to_string())
                .collect()
        };
        let (mut layers, mut files) = (BTreeSet::new(), BTreeSet::new());
        match cells[3] {
            "nothing" => {}
            "everything" => {
                layers.insert("*".to_string());
            }
            may => {
                for item in may.split(", ") {
                    match item.strip_prefix('`').and_then(|i| i.strip_suffix('`')) {
                        Some(file) => files.insert(file.to_string()),
                        None => layers.insert(item.to_string()),
                    };
                }
            }
        }
        out.push(Layer {
            name: cells[0].to_string(),
            places: ticked(cells[1]),
            layers,
            files,
        });
    }
    let names: BTreeSet<&str> = out.iter().map(|l| l.name.as_str()).collect();
    for l in &out {
        for n in &l.layers {
            assert!(
                n == "*" || names.contains(n.as_str()),
                "{}: may import {n:?}, which is no layer of the table",
                l.name
            );
        }
    }
    out
}

/// The layer of `file`: the row naming it, or the one naming the longest folder above it.
fn layer_of<'a>(layers: &'a [Layer], file: &str) -> Option<&'a Layer> {
    layers
        .iter()
        .filter_map(|l| {
            l.places
                .iter()
                .filter(|p| *p == file || (p.ends_with('/') && file.starts_with(p.as_str())))
                .map(|p| p.len())
                .max()
                .map(|len| (len, l))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, l)| l)
}

/// The module path of `file` (`src/<a>/<b>.rs`, `src/<a>/<b>/mod.rs` → `a::b`); `None` for a binary's
/// root, which names the library as `flexnode::`.
fn module_of(file: &str) -> Option<Vec<String>> {
    let rel = file.strip_prefix("src/")?.strip_suffix(".rs")?;
    if rel == "main" || rel.starts_with("bin/") {
        return None;
    }
    let mut segs: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
        segs.pop();
    }
    Some(segs)
}

/// The file a path names: the longest prefix of `segs` that is a module file.
fn file_of(files: &BTreeSet<String>, segs: &[String]) -> String {
    for n in (1..=segs.len()).rev() {
        let base = format!("src/{}", segs[..n].join("/"));
        for candidate in [format!("{base}.rs"), format!("{base}/mod.rs")] {
            if files.contains(&candidate) {
                return candidate;
            }
        }
    }
    "src/lib.rs".to_string()
}

/// `code` without comments and without its `#[cfg(test)] mod tests { … }` (tests may reach
/// anywhere).
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(at) if !l[..at].contains('"') => &l[..at],
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `prefix::{a, b::{c, d}}`'s paths, from the text after `{`; the rest after the closing `}`.
fn use_tree<'a>(prefix: &[String], mut rest: &'a str, out: &mut Vec<Vec<String>>) -> &'a str {
    let mut item = String::new();
    loop {
        let Some(c) = rest.chars().next() else {
            return rest;
        };
        rest = &rest[c.len_utf8()..];
        match c {
            '{' => {
                let mut p = prefix.to_vec();
                p.extend(segments(&item));
                rest = use_tree(&p, rest, out);
                item.clear();
            }
            ',' | '}' => {
                if !item.trim().is_empty() {
                    let mut p = prefix.to_vec();
                    p.extend(segments(&item));
                    out.push(p);
                }
                item.clear();
                if c == '}' {
                    return rest;
                }
            }
            c => item.push(c),
        }
    }
}

fn segments(item: &str) -> Vec<String> {
    let item = item.split(" as ").next().unwrap_or_default();
    item.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "self")
        .map(str::to_string)
        .collect()
}

/// The files `file` imports (other than itself).
fn imports(files: &BTreeSet<String>, file: &str, text: &str) -> BTreeSet<String> {
    let code = code_of(text);
    let module = module_of(file);
    let mut paths: Vec<Vec<String>> = Vec::new();
    let word = |c: char| c.is_alphanumeric() || c == '_';
    for root in ["crate::", "super::", "flexnode::"] {
        for (at, _) in code.match_indices(root) {
            // `a_crate::`, or the second `super::` of `super::super::`.
            if code[..at].chars().next_back().is_some_and(word) || code[..at].ends_with("::") {
                continue;
            }
            let rest = &code[at..];
            let end = rest
                .find(|c: char| !(word(c) || c == ':'))
                .unwrap_or(rest.len());
            let mut segs = segments(&rest[..end]);
            if rest[end..].starts_with('{') && segs.last().is_some() {
                use_tree(&segs, &rest[end + 1..], &mut paths);
                segs.clear();
            }
            if !segs.is_empty() {
                paths.push(segs);
            }
        }
    }
    let mut out = BTreeSet::new();
    for p in paths {
        let absolute: Vec<String> = match p.first().map(String::as_str) {
            Some("crate" | "flexnode") => p[1..].to_vec(),
            Some("super") => {
                let Some(mut here) = module.clone() else {
                    continue;
                };
                let ups = p.iter().take_while(|s| *s == "super").count();
                here.truncate(here.len().saturating_sub(ups));
                here.extend(p[ups..].iter().cloned());
                here
            }
            _ => continue,
        };
        let target = file_of(files, &absolute);
        if target != file {
            out.insert(target);
        }
    }
    out
}

/// Every arrow against `layers`, as `from → to: why`, and every file the table does not place.
fn violations(layers: &[Layer], sources: &BTreeMap<String, String>) -> Vec<String> {
    let files: BTreeSet<String> = sources.keys().cloned().collect();
    let mut found = Vec::new();
    for (file, text) in sources {
        let Some(from) = layer_of(layers, file) else {
            found.push(format!(
                "{file}: in no layer of docs/architecture.md's table"
            ));
            continue;
        };
        for to_file in imports(&files, file, text) {
            let Some(to) = layer_of(layers, &to_file) else {
                continue; // reported as unplaced on its own
            };
            let allowed = to.name == from.name
                || from.layers.contains("*")
                || from.layers.contains(&to.name)
                || from.files.contains(&to_file);
            if !allowed {
                found.push(format!(
                    "{file} → {to_file}: {} may not import {} (docs/architecture.md)",
                    from.name, to.name
                ));
            }
        }
    }
    found
}

fn sources() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.join("src")];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("src dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs")
                // A test module of its own file (`#[cfg(test)] mod tests;`).
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                let rel = path.strip_prefix(root).expect("under the repo");
                let text = std::fs::read_to_string(&path).expect("read");
                out.insert(rel.display().to_string(), text);
            }
        }
    }
    out
}

fn doc() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    std::fs::read_to_string(path).expect("docs/architecture.md")
}

/// Pairs of files that import each other, but the command line and its generated parts (clap's
/// derive and the completions each need the other).
fn circles(sources: &BTreeMap<String, String>) -> Vec<String> {
    let files: BTreeSet<String> = sources.keys().cloned().collect();
    let arrows: BTreeMap<&String, BTreeSet<String>> = sources
        .iter()
        .map(|(f, t)| (f, imports(&files, f, t)))
        .collect();
    let allowed = ("src/cli/command.rs", "src/cli/generated.rs");
    let mut found = Vec::new();
    for (a, to) in &arrows {
        for b in to {
            let back = arrows.get(b).is_some_and(|t| t.contains(a.as_str()));
            if back && a.as_str() < b.as_str() && (a.as_str(), b.as_str()) != allowed {
                found.push(format!("{a} ↔ {b}: each imports the other"));
            }
        }
    }
    found
}

#[test]
fn no_two_files_import_each_other() {
    let found = circles(&sources());
    assert!(found.is_empty(), "{}", found.join("\n"));
    let pair = BTreeMap::from([
        ("src/a.rs".to_string(), "use crate::b::X;".to_string()),
        (
            "src/b.rs".to_string(),
            "fn f() { super::a::y(); }".to_string(),
        ),
    ]);
    assert_eq!(
        circles(&pair),
        ["src/a.rs ↔ src/b.rs: each imports the other"]
    );
}

#[test]
fn every_import_keeps_to_the_layer_table() {
    let layers = table(&doc());
    assert!(layers.len() >= 8, "the layer table was not found");
    let found = violations(&layers, &sources());
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check itself: an arrow up, a new file outside the table, and the forms an import takes.
#[test]
fn a_new_arrow_against_the_table_fails_naming_both_files() {
    let doc = "| layer | files | holds | may import |\n|---|---|---|---|\n\
        | core | `src/lifecycle/` | states | nothing |\n\
        | effects | `src/effects/` | parties | core |\n\
        | reconciler | `src/reconcile/` | the daemon | core, `src/effects/kube.rs` |\n";
    let layers = table(doc);
    let src = |files: &[(&str, &str)]| -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(f, t)| (f.to_string(), t.to_string()))
            .collect()
    };
    let base = [
        ("src/lifecycle/mod.rs", "pub mod fault;"),
        ("src/lifecycle/fault.rs", ""),
        ("src/effects/mod.rs", "use crate::lifecycle::fault::Fault;"),
        (
            "src/effects/kube.rs",
            "use super::super::lifecycle::{fault::{Fault}, X};",
        ),
        ("src/effects/host/mod.rs", ""),
        (
            "src/reconcile/mod.rs",
            "use crate::effects::kube::Publisher; // crate::effects::host\n\
             #[cfg(test)]\nmod tests { use crate::effects::host::X; }",
        ),
    ];
    assert_eq!(violations(&layers, &src(&base)), Vec::<String>::new());
    for (file, text, want) in [
        (
            "src/lifecycle/step.rs",
            "fn f() { crate::effects::kube::write(); }",
            "src/lifecycle/step.rs → src/effects/kube.rs: core may not import effects",
        ),
        (
            "src/reconcile/owner.rs",
            "use crate::{lifecycle::fault::Fault, effects::{host::{self, Y}}};",
            "src/reconcile/owner.rs → src/effects/host/mod.rs: reconciler may not import effects",
        ),
        (
            "src/reconcile/owner.rs",
            "use super::super::effects::host;",
            "src/reconcile/owner.rs → src/effects/host/mod.rs: reconciler may not import effects",
        ),
        (
            "src/status_report.rs",
            "",
            "src/status_report.rs: in no layer of docs/architecture.md's table",
        ),
    ] {
        let mut files = src(&base);
        files.insert(file.to_string(), text.to_string());
        let found = violations(&layers, &files);
        assert_eq!(found.len(), 1, "{file}: {found:?}");
        assert!(found[0].starts_with(want), "{found:?}");
    }
}
