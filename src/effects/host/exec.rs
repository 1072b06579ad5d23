//! Host programs run in the host's root. The container install's agent sees the host at
//! `/host`, but a host program (its `modprobe`) needs the host's libraries and files at `/`.
//! `chroot` changes the root of a whole process and the daemon is multi-threaded, so a fresh
//! process does it: this executable again as `flexnode host-exec` (`src/cli/host_exec.rs`),
//! which chroots while it is still single-threaded and then execs the program. On the host
//! install the root is `/` and the program runs directly. Either way: no shell, only `PATH` in
//! the environment, stdin from /dev/null, bounded in time and output.

use super::candidate::bare_command;
use crate::effects::{EffectError, EffectResult};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// How long a host program may run.
pub const HOST_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// How much of its error output a failure quotes.
const STDERR_MAX: usize = 1024;

/// Runs `program` (absolute, inside `root`) with `args` and `root` as its `/`; `agent` is this
/// agent's executable (the one that knows `host-exec`).
pub async fn run_in_root(
    agent: &Path,
    root: &Path,
    program: &str,
    args: &[&str],
    timeout: Duration,
) -> EffectResult {
    let mut cmd = if root == Path::new("/") {
        bare_command(program)
    } else {
        let mut c = bare_command(agent);
        c.arg("host-exec")
            .arg("--root")
            .arg(root)
            .arg("--")
            .arg(program);
        c
    };
    cmd.args(args).stdout(Stdio::null()).stderr(Stdio::piped());
    let what = format!("host {program}");
    let run = cmd.output();
    let out = match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) => out,
        Ok(Err(e)) => return Err(EffectError::Failed(format!("{what}: cannot run: {e}"))),
        Err(_) => {
            return Err(EffectError::Failed(format!(
                "{what}: did not finish within {} s",
                timeout.as_secs()
            )));
        }
    };
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr[..out.stderr.len().min(STDERR_MAX)]);
    Err(EffectError::Failed(format!(
        "{what} failed ({}): {}",
        out.status,
        stderr.trim()
    )))
}
