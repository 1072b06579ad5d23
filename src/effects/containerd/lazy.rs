//! containerd connected on first use: a host install never needs it for archive upgrades,
//! and a daemon must not fail to start because containerd is down.

use super::{GrpcContainerd, RegistryConfig};
use crate::effects::{Containerd, EffectResult};
use crate::machine::agent::Sha256Hex;
use std::path::{Path, PathBuf};
use tokio::sync::OnceCell;

#[derive(Debug)]
pub struct LazyContainerd {
    socket: PathBuf,
    namespace: String,
    registry: RegistryConfig,
    client: OnceCell<GrpcContainerd>,
}

impl LazyContainerd {
    pub fn new(socket: impl Into<PathBuf>, namespace: &str, registry: RegistryConfig) -> Self {
        Self {
            socket: socket.into(),
            namespace: namespace.to_string(),
            registry,
            client: OnceCell::new(),
        }
    }

    async fn client(&self) -> EffectResult<&GrpcContainerd> {
        self.client
            .get_or_try_init(|| async {
                Ok(GrpcContainerd::connect(&self.socket, &self.namespace)
                    .await?
                    .with_registry(self.registry.clone()))
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

    async fn pull_content(&self, reference: &str, digest: &Sha256Hex) -> EffectResult {
        self.client().await?.pull_content(reference, digest).await
    }

    async fn unpack_image_into(&self, digest: &Sha256Hex, dir: &Path) -> EffectResult {
        self.client().await?.unpack_image_into(digest, dir).await
    }

    async fn remove_agent_image(&self, digest: &Sha256Hex) -> EffectResult {
        self.client().await?.remove_agent_image(digest).await
    }
}
