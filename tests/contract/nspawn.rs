//! A real systemd (PID 1 of a booted systemd-nspawn container, `e2e/nspawn/run`) as a contract
//! fixture, reached over the container's system bus. As in `tests/systemd_effects.rs`.

use super::systemd::{FAILING_SERVICE, SystemdFixture, service};
use flexnode::effects::systemd::DbusSystemd;
use flexnode::effects::{Systemd, machine_unit};
use flexnode::machine::state::Side;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A booted container; `down` on drop.
pub struct Container {
    pub name: String,
    script: PathBuf,
    pub bus: String,
    pub units: PathBuf,
}

impl Container {
    pub fn up(name: &str) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/nspawn/run");
        let out = Command::new(&script)
            .args(["up", name])
            .output()
            .expect("run e2e/nspawn/run up");
        assert!(
            out.status.success(),
            "nspawn up failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Constructed before the other calls, so a failure below still takes it down.
        let mut c = Self {
            name: name.to_string(),
            script,
            bus: String::new(),
            units: PathBuf::new(),
        };
        c.bus = c.run(&["bus", name]);
        c.units = PathBuf::from(c.run(&["units", name]));
        c
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new(&self.script)
            .args(args)
            .output()
            .expect("run e2e/nspawn/run");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .args(["down", &self.name])
            .status();
    }
}

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

    /// No nspawn inside the container: a plain long-running service under the machine unit's
    /// name stands in for it.
    async fn prepare_machine(&self, side: Side) {
        let unit = machine_unit(side);
        self.systemd
            .write_unit(&unit, &service(&format!("fake machine {}", side.name())))
            .await
            .expect("write machine unit");
        self.systemd.daemon_reload().await.expect("daemon_reload");
    }
}
