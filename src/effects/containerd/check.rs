//! The candidate's self-check on the container install: the image's own `flexnode version`,
//! in a short-lived unprivileged container, within a time limit. What it prints is what the
//! host install's check of a staged binary returns (`effects/host/candidate.rs`).

use super::{GrpcContainerd, TaskIo};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::Sha256Hex;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The agent's binary in its image (`image/build`).
pub const AGENT_BINARY: &str = "/usr/bin/flexnode";
/// Where the check's output goes (root's, 0700).
pub const DEFAULT_CHECK_DIR: &str = "/var/lib/flexnode/checks";
pub const DEFAULT_CHECK_TIMEOUT: Duration = Duration::from_secs(60);
/// More than `version` prints; the rest is not read.
const MAX_OUTPUT: u64 = 4096;

impl GrpcContainerd {
    /// Runs `flexnode version` of the pulled image `digest`; the first line it printed. A
    /// container left by a check that died with its daemon is removed first; the container
    /// and its output are removed afterwards, whatever the outcome.
    pub async fn check_image(&self, digest: &Sha256Hex) -> EffectResult<String> {
        let id = format!("flexnode-check-{}", digest.short());
        let dir = self.check_dir.join(&id);
        self.discard_check(&id, &dir).await?;
        let result = self.run_check(&id, digest, &dir).await;
        let cleaned = self.discard_check(&id, &dir).await;
        let version = result?;
        cleaned?;
        Ok(version)
    }

    async fn run_check(&self, id: &str, digest: &Sha256Hex, dir: &Path) -> EffectResult<String> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| EffectError::Failed(format!("{}: {e}", dir.display())))?;
        let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
        let args = [AGENT_BINARY.to_string(), "version".to_string()];
        let candidate = |e: EffectError| match e {
            EffectError::Failed(m) => {
                EffectError::Failed(format!("candidate image {}: {m}", digest.short()))
            }
            other => other,
        };
        self.create_container(id, digest, &args, false, &[])
            .await
            .map_err(candidate)?;
        self.start_container(
            id,
            &TaskIo::Files {
                stdout: stdout.clone(),
                stderr: stderr.clone(),
            },
        )
        .await
        .map_err(candidate)?;
        let limit = self.check_timeout;
        let Ok(status) = tokio::time::timeout(limit, self.wait_task(id)).await else {
            return Err(EffectError::Failed(format!(
                "candidate image {}: `flexnode version` did not finish within {} s",
                digest.short(),
                limit.as_secs()
            )));
        };
        let status = status?;
        let out = first_line(&stdout);
        if status != 0 {
            let err = first_line(&stderr);
            return Err(EffectError::Failed(format!(
                "candidate image {}: `flexnode version` exited with status {status}{}",
                digest.short(),
                if err.is_empty() {
                    String::new()
                } else {
                    format!(": {err}")
                }
            )));
        }
        if out.is_empty() {
            return Err(EffectError::Failed(format!(
                "candidate image {}: `flexnode version` printed nothing",
                digest.short()
            )));
        }
        Ok(out)
    }

    async fn discard_check(&self, id: &str, dir: &Path) -> EffectResult {
        self.stop_container(id, Duration::ZERO).await?;
        self.delete_container(id).await?;
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(EffectError::Failed(format!("{}: {e}", dir.display()))),
        }
    }

    /// Where the check writes its output, and how long it may take.
    pub fn with_check(mut self, dir: impl Into<PathBuf>, timeout: Duration) -> Self {
        self.check_dir = dir.into();
        self.check_timeout = timeout;
        self
    }
}

fn first_line(path: &Path) -> String {
    use std::io::Read;
    let mut text = String::new();
    if let Ok(f) = std::fs::File::open(path) {
        let _ = f.take(MAX_OUTPUT).read_to_string(&mut text);
    }
    text.lines().next().unwrap_or_default().trim().to_string()
}
