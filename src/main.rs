use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = flexnode::cli::command::Cli::parse();
    // Commands that change the node log what they do; read-only ones only warnings.
    let level = if cli.command.changes_node() {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // journald and pipes get plain text; colours only on a terminal.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    flexnode::cli::command::run(cli)
}
