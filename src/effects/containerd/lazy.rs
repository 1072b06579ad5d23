//! containerd connected on first use: a host install never needs it for archive upgrades,
//! and a daemon must not fail to start because containerd is down.

use super::{GrpcContainerd, Heartbeat, IO_TIMEOUT, RegistryConfig};
use crate::effects::{Containerd, EffectResult};
use crate::lifecycle::agent::{ImageRef, Sha256Hex};
use std::path::{Path, PathBuf};
use tokio::sync::OnceCell;

pub struct LazyContainerd {
    socket: PathBuf,
    namespace: String,
    registry: RegistryConfig,
    heartbeat: Option<Heartbeat>,
    client: OnceCell<GrpcContainerd>,
}

impl std::fmt::Debug for LazyContainerd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyContainerd")
            .field("socket", &self.socket)
            .field("namespace", &self.namespace)
            .field("registry", &self.registry)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl LazyContainerd {
    pub fn new(socket: impl Into<PathBuf>, namespace: &str, registry: RegistryConfig) -> Self {
        Self {
            socket: socket.into(),
            namespace: namespace.to_string(),
            registry,
            heartbeat: None,
            client: OnceCell::new(),
        }
    }

    /// The client's [`GrpcContainerd::with_heartbeat`] once it connects.
    pub fn with_heartbeat(mut self, heartbeat: Heartbeat) -> Self {
        self.heartbeat = Some(heartbeat);
        self
    }

    async fn client(&self) -> EffectResult<&GrpcContainerd> {
        self.client
            .get_or_try_init(|| async {
                let client = GrpcContainerd::connect(&self.socket, &self.namespace)
                    .await?
                    .with_registry(self.registry.clone());
                Ok(match &self.heartbeat {
                    Some(h) => client.with_heartbeat(h.clone()),
                    None => client,
                })
            })
            .await
    }
}

impl Containerd for LazyContainerd {
    async fn pull(&self, reference: &str, digest: &Sha256Hex) -> EffectResult {
        self.client().await?.pull(reference, digest).await
    }

    async fn image_present(&self, digest: &Sha256Hex) -> EffectResult<bool> {
        self.client().await?.image_present(digest).await
    }

    async fn check_image(&self, digest: &Sha256Hex) -> EffectResult<String> {
        self.client().await?.check_image(digest).await
    }

    async fn name_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        self.client().await?.name_agent_image(digest).await
    }

    /// The registry alone: no containerd connection needed.
    async fn resolve_tag(
        &self,
        image: &ImageRef,
        archive: Option<&Path>,
    ) -> EffectResult<Sha256Hex> {
        super::registry::resolve_tag(image, archive, &self.registry, IO_TIMEOUT).await
    }

    async fn pull_content(
        &self,
        reference: &str,
        digest: &Sha256Hex,
        archive: Option<&Path>,
    ) -> EffectResult {
        self.client()
            .await?
            .pull_content(reference, digest, archive)
            .await
    }

    async fn unpack_image_into(&self, digest: &Sha256Hex, dir: &Path) -> EffectResult {
        self.client().await?.unpack_image_into(digest, dir).await
    }

    async fn remove_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        self.client().await?.remove_agent_image(digest).await
    }
}
