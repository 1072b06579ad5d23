//! The simulated host as a contract fixture, on the wall clock (as the daemon runs it).

use super::containerd::ContainerdFixture;
use super::systemd::{FAILING_SERVICE, SystemdFixture};
use flexnode::effects::{Host, Systemd};
use flexnode::exec::{Clock, SystemClock};
use flexnode::lifecycle::agent::Sha256Hex;
use flexnode::lifecycle::state::Side;
use flexnode::sim::{Build, SimHost};
use sha2::{Digest, Sha256};

pub struct Sim {
    pub host: SimHost,
}

impl Sim {
    pub fn new() -> Self {
        let mut host = SimHost::new();
        host.set_time_source(|| SystemClock.now());
        Self { host }
    }
}

impl SystemdFixture for Sim {
    type S = SimHost;

    fn systemd(&self) -> &SimHost {
        &self.host
    }

    /// The simulated process of the unit exits non-zero.
    async fn write_failing_unit(&self, unit: &str) {
        self.host
            .write_unit(unit, FAILING_SERVICE)
            .await
            .expect("write_unit");
        self.host
            .world()
            .units
            .get_mut(unit)
            .expect("unit written")
            .fails = true;
    }

    /// The simulated host starts a machine only with a rootfs.
    async fn prepare_machine(&self, side: Side) {
        self.host
            .provision_machine(side, "v1.34.2")
            .await
            .expect("provision_machine");
    }
}

impl ContainerdFixture for Sim {
    type C = SimHost;

    fn containerd(&self) -> &SimHost {
        &self.host
    }

    async fn image(&self, name: &str) -> Sha256Hex {
        let digest = Sha256Hex::parse(&hex::encode(Sha256::digest(name.as_bytes()))).expect("hex");
        self.host.serve_image(
            digest.as_str(),
            Build {
                version: name.to_string(),
                crashes: false,
            },
        );
        digest
    }

    fn reference(&self, repository: &str, digest: &Sha256Hex) -> String {
        format!("registry.example/{repository}@{}", digest.oci())
    }
}
