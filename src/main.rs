use std::process::ExitCode;

fn main() -> ExitCode {
    // A usage error exits 64 (EX_USAGE, docs/cli.md), not clap's 2: `status` exits 2 when
    // the node has no store.
    let cli = match flexnode::cli::command::parse() {
        Ok(cli) => cli,
        Err(e) => {
            // Help and version are asked for; printing them cannot usefully fail.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(flexnode::cli::EXIT_USAGE)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Daemons and commands that change the node log what they do; the others only warnings.
    let level = if cli.command.logs_actions() {
        "info"
    } else {
        "warn"
    };
    flexnode::log::init(level);
    flexnode::cli::command::run(cli)
}
