//! The candidate check: a staged build's `version`, run without a shell and nearly without an
//! environment, bounded in time and output.

use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::AgentBuild;
use std::io::ErrorKind;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// `PATH` of the candidate's `version` run (its only environment variable).
pub const CHECK_PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";
/// How long the candidate's `version` may run.
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(30);
/// How much of the candidate's output is kept.
pub const CHECK_OUTPUT_MAX: u64 = 4096;
/// `program` as the agent runs host programs: no shell, nothing of the environment but
/// [`CHECK_PATH`], `/` as its directory, stdin from /dev/null, killed when its handle drops.
pub(super) fn bare_command(program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    cmd.env_clear()
        .env("PATH", CHECK_PATH)
        .current_dir("/")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    cmd
}

/// Runs `<binary> version` without a shell, with only `PATH` set, stdin from /dev/null, at most
/// [`CHECK_OUTPUT_MAX`] bytes of stdout kept, killed after `timeout`.
pub(super) async fn run_version(
    build: &AgentBuild,
    binary: &Path,
    timeout: Duration,
) -> EffectResult<String> {
    use tokio::io::AsyncReadExt;
    let mut attempts = 0;
    let mut child = loop {
        let spawned = bare_command(binary)
            .arg("version")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn();
        match spawned {
            Ok(child) => break child,
            // A just-written file may still be open for writing in a forked child elsewhere.
            Err(e) if e.kind() == ErrorKind::ExecutableFileBusy && attempts < 5 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(EffectError::Failed(format!(
                    "candidate {build}: cannot run {}: {e}",
                    binary.display()
                )));
            }
        }
    };
    let stdout = child.stdout.take();
    let run = async {
        let mut buf = Vec::new();
        if let Some(mut out) = stdout {
            // Only the first bytes are kept; the rest is drained so the candidate's exit
            // status is its own (not a SIGPIPE), and the timeout bounds the whole run.
            let mut chunk = [0u8; 4096];
            loop {
                let n = out.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                let room = (CHECK_OUTPUT_MAX as usize).saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..n.min(room)]);
            }
        }
        let status = child.wait().await?;
        Ok::<_, std::io::Error>((status, buf))
    };
    let (status, output) = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => {
            let _ = child.kill().await;
            return Err(EffectError::Failed(format!(
                "candidate {build}: `version` failed: {e}"
            )));
        }
        Err(_) => {
            let _ = child.kill().await;
            return Err(EffectError::Failed(format!(
                "candidate {build}: `version` did not finish within {} s",
                timeout.as_secs_f64()
            )));
        }
    };
    if !status.success() {
        return Err(EffectError::Failed(format!(
            "candidate {build}: `version` failed ({status})"
        )));
    }
    let text = String::from_utf8_lossy(&output);
    if !text.starts_with("flexnode ") {
        return Err(EffectError::Failed(format!(
            "candidate {build}: `version` did not print \"flexnode <version>\""
        )));
    }
    Ok(text.lines().next().unwrap_or_default().trim().to_string())
}
