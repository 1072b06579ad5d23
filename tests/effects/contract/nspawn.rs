//! A real systemd (PID 1 of a booted systemd-nspawn container, `e2e/nspawn/run`) as a contract
//! fixture, reached over the container's system bus. As in `tests/effects/systemd.rs`.

use super::systemd::{FAILING_SERVICE, SystemdFixture};
use crate::support::nspawn::{Container, NESTED_MACHINE_UNIT};
use flexnode::effects::systemd::DbusSystemd;
use flexnode::effects::{Systemd, machine_unit};
use flexnode::lifecycle::state::Side;
use std::time::Duration;

pub struct Nspawn {
    pub systemd: DbusSystemd,
    /// Dropped last: the connection goes before the container.
    pub container: Container,
}

impl Nspawn {
    pub async fn up(name: &str) -> Self {
        let container = Container::up(name);
        let systemd = DbusSystemd::at_address(&container.bus)
            .await
            .expect("connect to the container's systemd")
            .with_unit_dir(&container.units)
            .with_job_timeout(Duration::from_secs(30));
        Self { systemd, container }
    }
}

impl SystemdFixture for Nspawn {
    type S = DbusSystemd;

    fn systemd(&self) -> &DbusSystemd {
        &self.systemd
    }

    async fn write_failing_unit(&self, unit: &str) {
        self.systemd
            .write_unit(unit, FAILING_SERVICE)
            .await
            .expect("write_unit");
    }

    /// A real machine: an nspawn container nested in the test container, registered with its
    /// machined (`support::nspawn::NESTED_MACHINE_UNIT`).
    async fn prepare_machine(&self, side: Side) {
        let unit = machine_unit(side);
        self.systemd
            .write_unit(&unit, NESTED_MACHINE_UNIT)
            .await
            .expect("write machine unit");
        self.systemd.daemon_reload().await.expect("daemon_reload");
    }
}
