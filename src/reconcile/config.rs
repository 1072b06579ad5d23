//! What the daemon is started with: the command's flags and the configuration's settings
//! that reach the owner loop (`owner.rs`).

use super::watch::{OperationWatch, WatchCounters};
use std::sync::Arc;
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct DaemonConfig {
    pub node_name: String,
    /// How often deadlines, TTLs, the outbox and waiting claims are looked at.
    pub tick: Duration,
    pub operations: OperationWatch,
    /// Shared with whoever started the daemon (the fleet benchmark reads them).
    pub counters: Arc<WatchCounters>,
    /// The host's `/etc` as the daemon reaches it: while it is read-only no new work starts
    /// (src/reconcile/fault.rs). `None`: not looked at (a simulated host).
    pub etc: Option<std::path::PathBuf>,
    /// Where Prometheus metrics are served (`metricsAddress`, loopback only); `None`: off.
    pub metrics: Option<std::net::SocketAddr>,
    /// Answer `flexnode status` on the socket next to the store (`status_socket.rs`).
    pub live_status: bool,
    /// The pause after a repave's first failure, doubling per failure (`repave_pause.rs`).
    pub repave_retry: Duration,
}

impl Default for DaemonConfig {
    /// The daemon command's defaults (`--tick-ms 2000`); no node name.
    fn default() -> Self {
        Self {
            node_name: String::new(),
            tick: Duration::from_secs(2),
            operations: OperationWatch::default(),
            counters: Arc::default(),
            etc: None,
            metrics: None,
            live_status: false,
            repave_retry: Duration::from_secs(15),
        }
    }
}
