//! Generated files are checked in; these fail when they drift from the code.

use std::path::Path;

fn repo(p: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(p))
        .unwrap_or_else(|e| panic!("read {p}: {e}"))
}

#[test]
fn crds_match_the_api_types() {
    for (name, yaml) in flexnode::api::crds().expect("generate") {
        assert_eq!(
            repo(&format!("manifests/crds/{name}")),
            yaml,
            "manifests/crds/{name} is stale: run `cargo run --bin crdgen`"
        );
    }
}

#[test]
fn crds_declare_the_selectable_fields_and_columns() {
    let mop = repo("manifests/crds/machineoperations.unbounded-cloud.io.yaml");
    for want in [
        "scope: Cluster",
        "- mop",
        "jsonPath: .spec.machineRef\n",
        "- jsonPath: .spec.operationKind",
        "selectableFields:",
        "status: {}",
        "ttlSecondsAfterFinished:",
        "observedMachineGeneration:",
    ] {
        assert!(mop.contains(want), "MachineOperation CRD lacks {want:?}");
    }
    let mach = repo("manifests/crds/machines.unbounded-cloud.io.yaml");
    assert!(mach.contains("- mach") && mach.contains("scope: Cluster"));
}

#[test]
fn samples_parse_as_the_api_types() {
    use flexnode::api::{Machine, MachineOperation};
    let text = repo("manifests/samples/machineoperations.yaml");
    let ops: Vec<MachineOperation> = text
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str(doc).expect("MachineOperation"))
        .collect();
    assert_eq!(ops.len(), 4);
    assert_eq!(ops[0].spec.ttl_seconds_after_finished, Some(300));
    assert!(ops[3].spec.machine_selector.is_some());
    let m: Machine =
        serde_saphyr::from_str(&repo("manifests/samples/machine.yaml")).expect("Machine");
    assert_eq!(
        m.spec.kubernetes.and_then(|k| k.version).as_deref(),
        Some("v1.35.6")
    );
}

#[test]
fn design_doc_shows_the_current_state_diagram() {
    let doc = repo("docs/design.md");
    let diagram = flexnode::lifecycle::table::mermaid();
    assert!(
        doc.contains(&diagram),
        "docs/design.md is stale: paste the output of `cargo run --bin crdgen -- --diagram`:\n{diagram}"
    );
}

/// The core stays pure: no runtime, I/O, clock or platform crates in `src/lifecycle/`.
#[test]
fn the_core_imports_no_effects() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lifecycle");
    let forbidden = [
        "tokio",
        "kube::",
        "zbus",
        "rusqlite",
        "std::fs",
        "std::process",
        "std::net",
        "std::env",
        "SystemTime",
        "Instant::",
        "std::thread",
        "containerd",
        "tonic::",
        "rand::",
    ];
    let mut files = 0;
    let mut dirs = vec![dir];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("src/lifecycle") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let code = std::fs::read_to_string(&path).expect("read");
            files += 1;
            for word in forbidden {
                assert!(!code.contains(word), "{} mentions {word}", path.display());
            }
            // The transition and decision functions match enums exhaustively.
            let in_step = path.parent().is_some_and(|p| p.ends_with("step"));
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if in_step || name == "decide.rs" {
                assert!(
                    !code.contains("_ =>"),
                    "{} has a wildcard arm",
                    path.display()
                );
            }
        }
    }
    assert!(files >= 14, "only {files} files in src/lifecycle");
}

/// Every `.rs` file under `src/<dir>`, with its text.
fn sources(dir: &str) -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = Vec::new();
    let mut dirs = vec![root.join(dir)];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).expect("src dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(root)
                    .expect("under the repo")
                    .display()
                    .to_string();
                out.push((rel, std::fs::read_to_string(&path).expect("read")));
            }
        }
    }
    out.sort();
    out
}

/// Whether `code` names crate `krate` (`krate::…`, `use krate;`), not merely a word that
/// starts with it (`kubelet`).
fn names_crate(code: &str, krate: &str) -> bool {
    code.match_indices(krate).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = &code[at + krate.len()..];
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && (after.starts_with("::") || (after.starts_with(';') && code[..at].ends_with("use ")))
    })
}

#[test]
fn names_crate_tells_a_crate_from_a_word() {
    assert!(names_crate("use kube::Api;", "kube"));
    assert!(names_crate("let c = kube::Client::try_default();", "kube"));
    assert!(names_crate("use kube;", "kube"));
    assert!(!names_crate("pub use kubelet::{KUBELET_ENV};", "kube"));
    assert!(!names_crate("mod kubelet;", "kube"));
    assert!(!names_crate("pub mod kube;", "kube"));
}

/// The layering of docs/architecture.md: only the publisher (`src/effects/kube.rs` and its
/// modules in `src/effects/kube/`) talks to the API server among
/// the effects, the executor and the core; the executor is built by the composition root
/// (and the simulated node) only; the CLI's shared modules import no command module.
#[test]
fn the_layers_keep_their_rules() {
    for dir in ["src/effects", "src/exec", "src/lifecycle", "src/store"] {
        for (file, code) in sources(dir) {
            if file != "src/effects/kube.rs" && !file.starts_with("src/effects/kube/") {
                assert!(
                    !names_crate(&code, "kube"),
                    "{file} talks to the API server (only src/effects/kube.rs and its modules may)"
                );
            }
        }
    }
    for (file, code) in sources("src") {
        let builds = code.contains("Runner::new(");
        let allowed = ["src/exec/mod.rs", "src/cli/wiring.rs", "src/sim/node.rs"];
        assert!(
            !builds || allowed.contains(&file.as_str()),
            "{file} builds a Runner (only src/cli/wiring.rs does, and the simulated node)"
        );
    }
    for (shared, modules) in [
        (
            "src/cli/mod.rs",
            &[
                "command", "daemon", "ignition", "join", "op", "recover", "reset", "status",
                "wiring",
            ][..],
        ),
        (
            "src/cli/op/mod.rs",
            &["command", "create", "follow", "show"][..],
        ),
    ] {
        let code = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(shared))
            .expect("read");
        for line in code
            .lines()
            .filter(|l| !l.trim_start().starts_with("pub mod "))
        {
            let line = line.split("//").next().unwrap_or_default();
            for m in modules {
                assert!(
                    !line.contains(&format!("{m}::")),
                    "{shared} uses its submodule {m}: `{line}` (an import circle)"
                );
            }
        }
    }
}

/// A file holds one concept: none grows past 700 lines.
#[test]
fn no_source_file_is_over_700_lines() {
    for (file, code) in sources("src") {
        let lines = code.lines().count();
        assert!(
            lines <= 700,
            "{file} has {lines} lines; split it by concept"
        );
    }
}

#[test]
fn completions_and_man_pages_match_the_command_line() {
    let files = flexnode::cli::generated::files().expect("generate");
    let mut want: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
    for (path, contents) in &files {
        assert!(
            repo(path).as_bytes() == contents.as_slice(),
            "{path} is stale: run `cargo run --bin crdgen`"
        );
    }
    // Nothing checked in that the code no longer makes (a removed command's page).
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut have: Vec<String> = ["completions", "man"]
        .iter()
        .flat_map(|d| {
            std::fs::read_dir(root.join(d))
                .unwrap_or_else(|e| panic!("read {d}/: {e}"))
                .map(move |e| format!("{d}/{}", e.expect("entry").file_name().to_string_lossy()))
        })
        .collect();
    have.sort();
    want.sort();
    assert_eq!(
        have, want,
        "run `cargo run --bin crdgen` and remove what it no longer writes"
    );
    // A page per command an operator types, the nested ones included.
    for page in [
        "man/flexnode.1",
        "man/flexnode-status.1",
        "man/flexnode-op-create.1",
    ] {
        assert!(want.contains(&page), "{page} missing: {want:?}");
    }
}

/// docs/cli.md has a row for every exit status a command ends with.
#[test]
fn cli_doc_lists_every_exit_status() {
    use flexnode::cli::{EXIT_CONFIG, EXIT_NO_STORE, EXIT_TIMEOUT, EXIT_USAGE};
    let doc = repo("docs/cli.md");
    // The first cell of each table row: `| 126, 127 | …` documents both.
    let documented: Vec<u8> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| ")?.split(" |").next())
        .flat_map(|cell| cell.split(", ").filter_map(|c| c.parse().ok()))
        .collect();
    for code in [
        0,
        1,
        EXIT_NO_STORE,
        EXIT_TIMEOUT,
        EXIT_USAGE,
        EXIT_CONFIG,
        126,
        127,
    ] {
        assert!(
            documented.contains(&code),
            "docs/cli.md has no row for exit status {code}"
        );
    }
}

/// Every flexnode command docs/operator-guide.md shows (captured from the lab by
/// e2e/guide/capture) still exists, with every flag it uses.
#[test]
fn operator_guide_commands_exist_with_their_flags() {
    use clap::CommandFactory;
    let guide = repo("docs/operator-guide.md");
    let root = flexnode::cli::command::Cli::command();
    let mut checked = Vec::new();
    for line in guide.lines() {
        let Some(shell) = line
            .strip_prefix("$ ")
            .or_else(|| line.strip_prefix("node# "))
        else {
            continue;
        };
        for part in shell.split(['|', ';', '&']) {
            let words: Vec<&str> = part.split_whitespace().collect();
            let Some(at) = words
                .iter()
                .position(|w| *w == "flexnode" || w.ends_with("/flexnode"))
            else {
                continue;
            };
            guide_command_exists(&root, &words[at + 1..], part);
            checked.push(part.trim().to_string());
        }
    }
    assert!(
        checked.len() >= 12,
        "too few commands in the guide: {checked:#?}"
    );
}

fn guide_command_exists(root: &clap::Command, words: &[&str], line: &str) {
    let mut path = vec![root];
    let mut value_next = false;
    for word in words {
        if value_next {
            value_next = false;
            continue;
        }
        let cmd = path[path.len() - 1];
        let flag = |pick: &dyn Fn(&clap::Arg) -> bool| {
            path.iter()
                .rev()
                .flat_map(|c| c.get_arguments())
                .find(|a| pick(a))
                .cloned()
        };
        let arg = if let Some(long) = word.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or_default();
            let arg = flag(&|a| a.get_long() == Some(name));
            assert!(arg.is_some(), "`{line}`: no flag --{name}");
            arg.filter(|_| !long.contains('='))
        } else if let Some(short) = word.strip_prefix('-').filter(|s| s.len() == 1) {
            let c = short.chars().next().unwrap_or_default();
            let arg = flag(&|a| a.get_short() == Some(c));
            assert!(arg.is_some(), "`{line}`: no flag -{c}");
            arg
        } else {
            match cmd.find_subcommand(word) {
                Some(sub) => path.push(sub),
                // A positional value; a command with subcommands has none here.
                None => assert!(!cmd.has_subcommands(), "`{line}`: no command {word:?}"),
            }
            None
        };
        value_next = arg.is_some_and(|a| a.get_action().takes_values());
    }
}
