//! The `flexnode` command line: one module per command (`command.rs` lists them and
//! dispatches), and here what they share — the runtime, exit statuses, output formats and the
//! one error type. `wiring.rs` is the one place that assembles the executor and its effects
//! for a command or the daemon. This file imports none of its submodules: no import circle.

pub mod approver;
pub mod command;
pub mod daemon;
pub mod generated;
pub mod host_exec;
pub mod ignition;
pub mod join;
pub mod op;
pub mod preflight;
pub mod recover;
pub mod reset;
pub mod rollout;
pub mod status;
pub mod token;
pub mod wiring;

use clap::ValueEnum;
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Human,
    Json,
    Yaml,
}

/// Exit status for an impossible setting or bad input (never retried by the bootstrap unit).
pub const EXIT_CONFIG: u8 = 78;
/// Exit status when there is no store to read.
pub const EXIT_NO_STORE: u8 = 2;
/// Exit status when `op --wait` gave up waiting.
pub const EXIT_TIMEOUT: u8 = 3;
/// Exit status for a command line that needs more (e.g. `reset` without `--yes`).
pub const EXIT_USAGE: u8 = 64;

pub(crate) fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v)
        .map(|s| s + "\n")
        .unwrap_or_default()
}

pub(crate) fn yaml<T: serde::Serialize>(v: &T) -> String {
    serde_saphyr::to_string(v).unwrap_or_default()
}

/// How a command failed: what it prints and its exit status.
#[derive(Debug)]
pub struct Failure {
    pub code: u8,
    pub message: String,
}

impl Failure {
    /// A setting or an input that cannot work: exit 78.
    pub fn config(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_CONFIG,
            message: message.into(),
        }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            code: 1,
            message: message.into(),
        }
    }
}

/// A setting that cannot work (exit 78), named as the config names it.
pub fn impossible(e: crate::config::ConfigError) -> Failure {
    Failure::config(format!("impossible setting: {e}"))
}

impl<E: Into<anyhow::Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Self::failed(format!("{:#}", e.into()))
    }
}

/// What a successful command ends with.
pub trait Done {
    fn exit_code(self) -> ExitCode;
}

impl Done for () {
    fn exit_code(self) -> ExitCode {
        ExitCode::SUCCESS
    }
}

impl Done for ExitCode {
    fn exit_code(self) -> ExitCode {
        self
    }
}

/// Runs a command's future on a fresh runtime. A failure prints one line: error texts of
/// parsers go on to quote their input, and a kubeconfig holds secrets.
pub fn block_on<T: Done>(
    command: &str,
    fut: impl std::future::Future<Output = Result<T, Failure>>,
) -> ExitCode {
    // One worker beside the thread that runs `fut`, whatever the node's core count: an
    // agent's work is a few watches and one step at a time, and each worker costs a stack
    // and a malloc arena (docs/benchmarks.md, "Footprint"). Heavy work (unpacking,
    // hashing) runs on the blocking pool.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flexnode {command}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    finish(command, runtime.block_on(fut))
}

/// A command's exit: its status, and on failure one line (see [`block_on`]).
pub fn finish<T: Done>(command: &str, result: Result<T, Failure>) -> ExitCode {
    match result {
        Ok(done) => done.exit_code(),
        Err(f) => {
            eprintln!(
                "flexnode {command}: {}",
                f.message.lines().next().unwrap_or_default()
            );
            ExitCode::from(f.code)
        }
    }
}
