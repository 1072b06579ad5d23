//! The agent's certificate renewed while the daemon runs: at a jittered point of its life
//! (70–90 % by default), a new key, a request the approver grants to the agent's own identity,
//! the kubeconfig swapped whole — and the daemon's client switched to it in place, so its
//! watches and writes carry on without a restart (a request under way finishes on the
//! connection it started on, whose certificate is still valid). A renewal the API server
//! could not take (away, refused) is tried again until it is done.

use super::bootstrap::{BootstrapError, ask_and_write};
use super::credential::certificate_in;
use super::csr::Issued;
use crate::config::RenewAt;
use crate::config::kubeconfig::client_from_kubeconfig;
use hyper::{Request, Response};
use kube::client::Body;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// A client whose credential is switched in place: every request goes to the client
/// current when it is sent.
#[derive(Clone)]
pub struct Swappable {
    current: Arc<RwLock<kube::Client>>,
}

impl Swappable {
    /// The client the daemon uses, and the handle that switches it.
    pub fn new(first: kube::Client) -> (kube::Client, Self) {
        let swap = Self {
            current: Arc::new(RwLock::new(first)),
        };
        (kube::Client::new(swap.clone(), "default"), swap)
    }

    fn current(&self) -> kube::Client {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn switch(&self, to: kube::Client) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = to;
    }
}

impl tower_service::Service<Request<Body>> for Swappable {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, kube::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), kube::Error>> {
        // The current client queues its own requests (a buffer): always ready here.
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let client = self.current();
        Box::pin(async move { client.send(request).await })
    }
}

/// A new certificate for `node`'s identity asked with `client` (the agent's own), written
/// into the kubeconfig at `path` beside the API server and CA it names. Its key waits on disk
/// while the request is out, so a daemon restarted meanwhile finds the same request.
pub async fn renew(
    client: &kube::Client,
    node: &str,
    path: &Path,
    expiration_seconds: Option<i32>,
    limit: Duration,
) -> Result<Issued, BootstrapError> {
    let (server, ca_pem) = crate::config::kubeconfig_cluster(path)
        .map_err(|e| BootstrapError::Io(format!("cannot read {}: {e}", path.display())))?;
    ask_and_write(
        client,
        node,
        (&server, &ca_pem),
        path,
        expiration_seconds,
        limit,
        |_| {},
    )
    .await
}

/// What keeps the daemon's certificate renewed.
pub struct Renewer {
    pub node: String,
    pub kubeconfig: PathBuf,
    pub expiration_seconds: Option<i32>,
    pub renew_at: RenewAt,
}

/// How long a failed renewal waits before the next try, doubled up to the cap.
const RETRY_FIRST: Duration = Duration::from_secs(5);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// The wall clock is looked at at least this often while a renewal point nears (a host that
/// slept or a clock that was set passes it without a timer noticing).
const LOOK_EVERY: Duration = Duration::from_secs(60);
/// The least time between two renewals: a window that lies before the certificate's issue
/// (a signer that backdates it, a window set early) must not turn into a request a second.
const MIN_BETWEEN: i64 = 30;
/// How long one renewal waits for its certificate.
const RENEWAL_WAIT: Duration = Duration::from_secs(300);

fn draw() -> f64 {
    let mut b = [0u8; 8];
    // Without randomness, the middle of the window.
    if getrandom::fill(&mut b).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64
}

impl Renewer {
    /// Renews the certificate in the kubeconfig whenever its point comes, switching `swap`
    /// to each new one; runs until dropped. `on_renewed` hears of each certificate.
    pub async fn run(self, swap: Swappable, mut on_renewed: impl FnMut(&Issued)) {
        let mut retry = RETRY_FIRST;
        let mut last: Option<i64> = None;
        loop {
            let Some(cert) = certificate_in(&self.kubeconfig) else {
                tracing::warn!(kubeconfig = %self.kubeconfig.display(), "no certificate in the kubeconfig to renew");
                return;
            };
            let at = self
                .renew_at
                .point(cert.not_before, cert.not_after, draw())
                .max(last.map_or(i64::MIN, |t| t + MIN_BETWEEN));
            while super::unix_now() < at {
                let left = u64::try_from(at - super::unix_now()).unwrap_or(0);
                tokio::time::sleep(Duration::from_secs(left).min(LOOK_EVERY)).await;
            }
            let renewed = renew(
                &swap.current(),
                &self.node,
                &self.kubeconfig,
                self.expiration_seconds,
                RENEWAL_WAIT,
            )
            .await;
            match renewed {
                Ok(new) => match client_from_kubeconfig(&self.kubeconfig).await {
                    Ok(client) => {
                        swap.switch(client);
                        retry = RETRY_FIRST;
                        last = Some(super::unix_now());
                        tracing::info!(
                            valid_until = new.not_after,
                            "the agent's certificate renewed"
                        );
                        on_renewed(&new);
                    }
                    Err(e) => tracing::warn!(error = %e, "the renewed kubeconfig cannot be used"),
                },
                Err(e) => {
                    tracing::warn!(error = %e, retry_in_s = retry.as_secs(), "the agent's certificate was not renewed; trying again");
                    tokio::time::sleep(retry).await;
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
    }
}
