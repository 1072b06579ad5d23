//! `flexnode op`: its subcommands, and the module that runs each.

use super::create::{self, CreateArgs};
use super::{ops, show, unix_now};
use crate::cli::{Failure, Output};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct OpArgs {
    /// Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config].
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    pub command: OpCommand,
}

#[derive(Debug, Subcommand)]
pub enum OpCommand {
    /// Create a MachineOperation.
    Create(Box<CreateArgs>),
    /// List MachineOperations.
    List {
        /// Only operations addressed to this node by name.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
        #[arg(long, short, value_enum, default_value_t = Output::Human)]
        output: Output,
    },
    /// Show one MachineOperation.
    Get {
        name: String,
        #[arg(long, short, value_enum, default_value_t = Output::Human)]
        output: Output,
    },
}

pub fn run(args: OpArgs) -> ExitCode {
    crate::cli::block_on("op", dispatch(args))
}

async fn dispatch(args: OpArgs) -> Result<ExitCode, Failure> {
    let kubeconfig = args.kubeconfig;
    match args.command {
        OpCommand::Create(create_args) => {
            // Everything the user typed is checked before the cluster is contacted.
            let plan = create::plan(&create_args, unix_now())?;
            let api = ops(kubeconfig).await?;
            create::create(api, plan).await
        }
        OpCommand::List { node, output } => {
            let api = ops(kubeconfig).await?;
            show::list(api, node.as_deref(), output).await
        }
        OpCommand::Get { name, output } => {
            let api = ops(kubeconfig).await?;
            show::get(api, &name, output).await
        }
    }
}
