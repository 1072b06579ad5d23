//! Files made from the command line's definition: the shell completions and the man pages.
//! They are checked in (`completions/`, `man/`) so that packages ship them without running
//! the binary; `cargo run --bin crdgen` writes them and `tests/core/generated.rs` fails on drift.
//! `flexnode completions SHELL` prints one script for a shell's own setup.

use super::command::Cli;
use clap::CommandFactory;
use clap_complete::{Generator, Shell};

/// The shells a script is checked in for.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// The completion script for `shell`.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "flexnode", &mut out);
    out
}

/// Every generated file: its path in the repository and its contents.
pub fn files() -> std::io::Result<Vec<(String, Vec<u8>)>> {
    let mut files: Vec<(String, Vec<u8>)> = SHELLS
        .iter()
        .map(|s| {
            (
                format!("completions/{}", s.file_name("flexnode")),
                completion(*s),
            )
        })
        .collect();
    let mut root = Cli::command();
    root.build();
    man_pages(&root, "flexnode", &mut files)?;
    Ok(files)
}

/// A page for `cmd` (named `name`, as `man` looks it up) and one for each visible subcommand
/// (`flexnode-op-create`).
fn man_pages(
    cmd: &clap::Command,
    name: &str,
    files: &mut Vec<(String, Vec<u8>)>,
) -> std::io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone().name(name.to_string())).render(&mut page)?;
    files.push((format!("man/{name}.1"), page));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        man_pages(sub, &format!("{name}-{}", sub.get_name()), files)?;
    }
    Ok(())
}
