//! The built `flexnode` binary run as an operator types it, against the lab's API server.

use std::path::Path;

/// What one run did.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn all(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }
}

impl From<std::process::Output> for Run {
    fn from(out: std::process::Output) -> Self {
        Self {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `flexnode COMMAND ARGS --kubeconfig KUBECONFIG`, `KUBECONFIG` unset; killed when dropped.
pub fn command(command: &str, kubeconfig: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_flexnode"));
    cmd.arg(command)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .kill_on_drop(true);
    cmd
}

/// Runs it to the end (without blocking the runtime a daemon of the test may share).
pub async fn run(command_name: &str, kubeconfig: &Path, args: &[&str]) -> Run {
    command(command_name, kubeconfig, args)
        .output()
        .await
        .expect("run flexnode")
        .into()
}
