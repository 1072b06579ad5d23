//! A booted systemd-nspawn container (`e2e/nspawn/run`) whose system bus the host reaches.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The unit of a machine nested in the container: a non-booted `systemd-nspawn` (PID 1
/// `sleep`) on a throwaway tmpfs root whose /usr is the container's own rootfs (bound at
/// `/var/lib/machines/.base` by `e2e/nspawn/run`), registered with the container's machined,
/// written as `systemd-nspawn@<side>.service` and enabled like the host's own template.
pub const NESTED_MACHINE_UNIT: &str = "[Unit]\nDescription=flexnode test machine %i\n\n[Service]\n\
    Type=notify\nKillMode=mixed\nDelegate=yes\n\
    ExecStart=/usr/bin/systemd-nspawn --quiet --keep-unit --register=yes --machine=%i \
    --directory=/var/lib/machines/.base --volatile=yes /usr/bin/sleep infinity\n\n\
    [Install]\nWantedBy=machines.target\n";

/// A booted container; `down` on drop.
pub struct Container {
    pub name: String,
    pub script: PathBuf,
    pub bus: String,
    pub units: PathBuf,
    pub boot_ms: u64,
}

impl Container {
    /// Fails the test when the nspawn tier is not installed (`tier::require`).
    pub fn up(name: &str) -> Self {
        Self::start(name, &[])
    }

    /// In the host's network namespace: it reaches the lab's servers on host loopback.
    pub fn up_host_network(name: &str) -> Self {
        Self::start(name, &["--host-network"])
    }

    fn start(name: &str, flags: &[&str]) -> Self {
        super::tier::require(super::tier::Tier::Nspawn);
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/nspawn/run");
        let out = Command::new(&script)
            .args(["up", name])
            .args(flags)
            .output()
            .expect("run e2e/nspawn/run up");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "nspawn up failed: {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Constructed before the other calls, so a failure below still takes it down.
        let mut c = Self {
            name: name.to_string(),
            script,
            bus: String::new(),
            units: PathBuf::new(),
            boot_ms: field(&stdout, "boot_ms=")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        };
        c.bus = c.run(&["bus", name]);
        c.units = PathBuf::from(c.run(&["units", name]));
        c
    }

    /// The container's `/` as the host reaches it (through its PID 1 now).
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.run(&["leader", &self.name])))
    }

    /// `CMD...` in the container's namespaces: its output, whatever the exit status.
    pub fn exec(&self, cmd: &[&str]) -> std::process::Output {
        Command::new(&self.script)
            .args(["exec", &self.name])
            .args(cmd)
            .output()
            .expect("run e2e/nspawn/run exec")
    }

    pub fn run(&self, args: &[&str]) -> String {
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

fn field<'a>(s: &'a str, key: &str) -> Option<&'a str> {
    s.split_whitespace().find_map(|w| w.strip_prefix(key))
}
