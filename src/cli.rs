//! The `flexnode` command line.

use crate::report;
use crate::store::{self, StoreError, StoreReader};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "flexnode",
    version,
    about = "Joins this host to Kubernetes and runs its node lifecycle"
)]
pub struct Cli {
    /// The node's state store.
    #[arg(long, global = true, env = "FLEXNODE_STATE", default_value = store::DEFAULT_PATH)]
    pub state: PathBuf,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent (reconciles Machine and MachineOperations).
    Daemon(crate::daemon_cli::DaemonArgs),
    /// Join this host to the cluster (again: converge). Exit 78: a setting cannot work.
    Join {
        /// YAML or JSON; see docs/config.md.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Remove this node's machines, runtime files, units and links, and stop the agent.
    Reset {
        /// Confirm.
        #[arg(long)]
        yes: bool,
    },
    /// Restore the last-good agent after a failed upgrade (run by the recovery unit).
    #[command(hide = true)]
    RecoverAgentUpgrade {
        #[arg(long, default_value = crate::recover_cli::RECOVERY_MESSAGE)]
        message: String,
    },
    /// Show the node's state; works while the daemon is stopped.
    Status {
        #[arg(long, short, value_enum, default_value_t = Output::Human)]
        output: Output,
    },
    /// Print the transition journal.
    History {
        /// How many of the newest entries.
        #[arg(long, default_value_t = 50)]
        limit: i64,
        #[arg(long, short, value_enum, default_value_t = Output::Human)]
        output: Output,
    },
    /// Create and inspect MachineOperations.
    Op(crate::opcli::OpArgs),
    /// Print the version.
    Version,
}

impl Command {
    /// The daemon and the commands that act on the node (they log at info by default).
    pub fn changes_node(&self) -> bool {
        match self {
            Self::Daemon(_) | Self::Join { .. } | Self::Reset { .. } => true,
            Self::RecoverAgentUpgrade { .. } => true,
            Self::Status { .. } | Self::History { .. } | Self::Op(_) | Self::Version => false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Human,
    Json,
    Yaml,
}

/// Exit status for usage and configuration errors (never retried by the bootstrap unit).
pub const EXIT_CONFIG: u8 = 78;
/// Exit status when there is no store to read.
pub const EXIT_NO_STORE: u8 = 2;
/// Exit status for a command line that needs more (e.g. `reset` without `--yes`).
pub const EXIT_USAGE: u8 = 64;

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Version => {
            println!("flexnode {}", crate::VERSION);
            ExitCode::SUCCESS
        }
        Command::Status { output } => read(&cli.state, |reader| {
            let report = report::build(reader)?;
            Ok(match output {
                Output::Human => report::render_human(&report),
                Output::Json => json(&report),
                Output::Yaml => yaml(&report),
            })
        }),
        Command::History { limit, output } => read(&cli.state, |reader| {
            let entries = reader.journal(limit.max(1))?;
            Ok(match output {
                Output::Human => entries
                    .iter()
                    .map(|e| report::journal_line(e) + "\n")
                    .collect(),
                Output::Json => json(&entries),
                Output::Yaml => yaml(&entries),
            })
        }),
        Command::Daemon(args) => crate::daemon_cli::run(&cli.state, args),
        Command::Join { config } => crate::join_cli::run(&cli.state, &config),
        Command::Reset { yes } => crate::reset_cli::run(&cli.state, yes),
        Command::RecoverAgentUpgrade { message } => crate::recover_cli::run(&cli.state, &message),
        Command::Op(args) => crate::opcli::run(args),
    }
}

fn read(
    path: &std::path::Path,
    render: impl FnOnce(&StoreReader) -> Result<String, StoreError>,
) -> ExitCode {
    let result = StoreReader::open(path).and_then(|reader| render(&reader));
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e @ StoreError::Missing(_)) => {
            eprintln!("flexnode: {e}");
            ExitCode::from(EXIT_NO_STORE)
        }
        Err(e) => {
            eprintln!("flexnode: {e}");
            ExitCode::FAILURE
        }
    }
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v)
        .map(|s| s + "\n")
        .unwrap_or_default()
}

fn yaml<T: serde::Serialize>(v: &T) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

/// How a failed command is reported: the line it prints and its exit status.
pub trait CommandError {
    fn report(&self) -> String;
    fn exit_code(&self) -> u8 {
        1
    }
}

impl CommandError for anyhow::Error {
    fn report(&self) -> String {
        format!("{self:#}")
    }
}

/// Runs a command's future on a fresh runtime and reports its failure.
pub fn block_on<E: CommandError>(
    command: &str,
    fut: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flexnode {command}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("flexnode {command}: {}", e.report());
            ExitCode::from(e.exit_code())
        }
    }
}
