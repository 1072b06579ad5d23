//! The running daemon's answer to `flexnode status`: what only it knows (its STATUS, whether
//! its watches hear the API server), over a unix socket next to the store — the state
//! directory is private to root, so is the socket. The store stays the report's source; this
//! adds the live part, and `status` says which it shows. One JSON object per connection, then
//! EOF: there is no request to parse, so no HTTP stack.

use crate::reconcile::WatchCounters;
use crate::status_report::{DaemonSummary, GoalSummary};
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// The socket's name in the store's directory.
pub const SOCKET_NAME: &str = "daemon.sock";

pub fn socket_path(store: &Path) -> PathBuf {
    store.parent().unwrap_or(Path::new("/")).join(SOCKET_NAME)
}

/// What the owner loop tells the socket.
#[derive(Debug, Default)]
pub struct Live {
    pub status_text: Mutex<String>,
    /// The Machine's goal while the node has not applied it.
    pub waiting_goal: Mutex<Option<GoalSummary>>,
}

impl Live {
    /// The goal the Machine states while the node has not applied it; `None` once it has.
    pub fn set_waiting_goal(&self, goal: Option<GoalSummary>) {
        if let Ok(mut g) = self.waiting_goal.lock() {
            *g = goal;
        }
    }

    /// Sets STATUS's text; whether it changed.
    pub fn set_status(&self, text: &str) -> bool {
        match self.status_text.lock() {
            Ok(mut s) if *s != text => {
                text.clone_into(&mut s);
                true
            }
            _ => false,
        }
    }

    fn summary(&self, counters: &WatchCounters) -> DaemonSummary {
        DaemonSummary {
            pid: std::process::id(),
            status_text: self
                .status_text
                .lock()
                .map(|s| s.clone())
                .unwrap_or_default(),
            watches_synced: counters.synced(),
            watches_connected: counters.connected(),
            waiting_goal: self
                .waiting_goal
                .lock()
                .map(|g| g.clone())
                .unwrap_or_default(),
        }
    }
}

/// Binds `path` and answers until the task is dropped. A socket a dead daemon left there is
/// replaced; anything else at the path is left alone (an error).
pub fn serve(
    path: &Path,
    live: Arc<Live>,
    counters: Arc<WatchCounters>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
        Ok(_) => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    // Root's only, whatever the umask: connecting is reading the daemon's state.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let answer = serde_json::to_vec(&live.summary(&counters)).unwrap_or_default();
            tokio::spawn(async move {
                let _ = stream.write_all(&answer).await;
                let _ = stream.shutdown().await;
            });
        }
    }))
}

/// Serves at `path`; a failure is logged and the daemon runs on (status reads the store).
pub fn start(
    path: &Path,
    live: Arc<Live>,
    counters: Arc<WatchCounters>,
) -> Option<tokio::task::AbortHandle> {
    match serve(path, live, counters) {
        Ok(task) => Some(task.abort_handle()),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "flexnode status will not reach the daemon");
            None
        }
    }
}

/// The running daemon's summary, if one answers at the socket next to `store` within a
/// second.
pub fn ask(store: &Path) -> Option<DaemonSummary> {
    let stream = std::os::unix::net::UnixStream::connect(socket_path(store)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    let mut answer = Vec::new();
    stream.take(64 * 1024).read_to_end(&mut answer).ok()?;
    serde_json::from_slice(&answer).ok()
}
