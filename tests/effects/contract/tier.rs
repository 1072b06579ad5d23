//! containerd + a plain-HTTP registry on 127.0.0.1 (`tests/support/containerd.rs`) as a
//! contract fixture.

use super::containerd::ContainerdFixture;
use crate::support::containerd::{Flavor, NS, Tier, snapshotter};
use flexnode::effects::containerd::GrpcContainerd;
use flexnode::lifecycle::agent::Sha256Hex;

pub struct Registry {
    pub containerd: GrpcContainerd,
    pub tier: Tier,
}

impl Registry {
    pub async fn up(flavor: Flavor) -> Self {
        let tier = Tier::up(flavor);
        let containerd = GrpcContainerd::connect(&tier.socket, NS)
            .await
            .expect("connect to containerd")
            .with_snapshotter(&snapshotter());
        Self { containerd, tier }
    }
}

impl ContainerdFixture for Registry {
    type C = GrpcContainerd;

    fn containerd(&self) -> &GrpcContainerd {
        &self.containerd
    }

    /// Builds and pushes a two-layer 1 MB image.
    async fn image(&self, name: &str) -> Sha256Hex {
        self.tier.image(&format!("e2e/{name}:v1"), 1, false)
    }

    fn reference(&self, repository: &str, digest: &Sha256Hex) -> String {
        self.tier.reference(repository, digest)
    }
}
