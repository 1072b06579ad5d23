//! The command line: each command, and the module that runs it (`cli/<command>.rs`).

use super::{
    Output, approver, daemon, generated, host_exec, ignition, join, op, preflight, recover, reset,
    rollout, status, token,
};
use crate::store;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::ffi::OsString;
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
    Daemon(daemon::DaemonArgs),
    /// Join this host to the cluster (again: converge). Exit 78: a setting cannot work.
    Join {
        /// YAML or JSON; see docs/config.md.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// After failed attempts, wait a growing delay first (10 s doubling to 300 s; exit
        /// 78 and success start over): the bootstrap units' retries.
        #[arg(long)]
        backoff: bool,
        /// Preflight checks whose failure does not stop the join (NAME,…; `all`).
        #[arg(long, value_name = "NAME,...")]
        ignore_preflight_errors: Vec<String>,
    },
    /// Run every check `join` makes before it changes anything, each with its fix.
    Preflight {
        /// The join configuration; see docs/config.md.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        #[arg(long, short, value_enum, default_value_t = Output::Human)]
        output: Output,
        /// Checks whose failure is reported as ignored (NAME,…; `all`).
        #[arg(long, value_name = "NAME,...")]
        ignore_preflight_errors: Vec<String>,
    },
    /// Render a container install's first boot (Butane and Ignition, 0600) from a join config.
    Ignition {
        /// The join config (installMode: container, agentImage, agentImageDigest); see
        /// docs/container-install.md.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        /// Where config.bu and config.ign are written (created 0700).
        #[arg(long, value_name = "DIR", default_value = ".")]
        out: PathBuf,
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
        #[arg(long, default_value = recover::RECOVERY_MESSAGE)]
        message: String,
    },
    /// Run a host program with the host's root as `/` (the container install's agent, for
    /// what only the host's own tools do: src/effects/host/exec.rs).
    #[command(hide = true)]
    HostExec {
        #[arg(long, value_name = "DIR")]
        root: PathBuf,
        /// After `--`: the program (absolute, inside the root) and its arguments.
        #[arg(last = true, required = true, value_name = "PROGRAM")]
        command: Vec<OsString>,
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
    Op(op::command::OpArgs),
    /// Run an operation on every node a selector matches, in waves; resumable.
    Rollout(Box<rollout::RolloutArgs>),
    /// Approve the certificate requests of agents whose bootstrap token is bound to their node
    /// (or who renew their own identity); deny the rest asking for an agent identity.
    Approver(approver::ApproverArgs),
    /// An exec credential plugin: print an `ExecCredential` with a token from an identity
    /// provider (a kubeconfig's user runs `flexnode token …`).
    Token(token::TokenArgs),
    /// Print the shell completion script for SHELL (also in the repository's completions/).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version.
    Version,
}

impl Command {
    /// The daemons (the agent, the approver) and the commands that act on the node: they log
    /// what they do (at info by default).
    pub fn logs_actions(&self) -> bool {
        match self {
            Self::Daemon(_) | Self::Join { .. } | Self::Reset { .. } | Self::Approver(_) => true,
            Self::RecoverAgentUpgrade { .. } => true,
            Self::Status { .. }
            | Self::History { .. }
            | Self::Op(_)
            | Self::Rollout(_)
            | Self::Ignition { .. }
            | Self::Preflight { .. }
            | Self::HostExec { .. }
            | Self::Token(_)
            | Self::Completions { .. }
            | Self::Version => false,
        }
    }
}

/// The name kubectl finds a plugin by on PATH: installed under it (a link is enough),
/// `kubectl flexnode …` runs this binary.
pub const KUBECTL_PLUGIN: &str = "kubectl-flexnode";

/// The command line of this process. Run as the kubectl plugin, usage and help name the
/// command as the operator typed it (`kubectl flexnode`).
pub fn parse() -> Result<Cli, clap::Error> {
    let as_plugin = std::env::args_os().next().is_some_and(|arg0| {
        std::path::Path::new(&arg0)
            .file_name()
            .is_some_and(|n| n == KUBECTL_PLUGIN)
    });
    let mut cmd = Cli::command();
    if as_plugin {
        cmd = cmd.bin_name("kubectl flexnode");
    }
    Cli::from_arg_matches(&cmd.try_get_matches()?)
}

pub fn run(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Version => {
            println!("flexnode {}", crate::VERSION);
            ExitCode::SUCCESS
        }
        Command::Completions { shell } => {
            use std::io::Write;
            match std::io::stdout().write_all(&generated::completion(shell)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("flexnode: cannot write the completion script: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Status { output } => status::status(&cli.state, output),
        Command::History { limit, output } => status::history(&cli.state, limit, output),
        Command::Daemon(args) => daemon::run(&cli.state, args),
        Command::Join {
            config,
            backoff,
            ignore_preflight_errors,
        } => join::run(&cli.state, &config, backoff, &ignore_preflight_errors),
        Command::Preflight {
            config,
            output,
            ignore_preflight_errors,
        } => preflight::run(&cli.state, &config, output, &ignore_preflight_errors),
        Command::Ignition { config, out } => ignition::run(&config, &out),
        Command::Reset { yes } => reset::run(&cli.state, yes),
        Command::RecoverAgentUpgrade { message } => recover::run(&cli.state, &message),
        Command::Op(args) => op::command::run(args),
        Command::Rollout(args) => rollout::run(*args),
        Command::Approver(args) => approver::run(args),
        Command::Token(args) => token::run(args),
        Command::HostExec { root, command } => host_exec::run(&root, &command),
    }
}
