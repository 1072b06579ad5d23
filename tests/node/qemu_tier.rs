//! Full e2e tier: `DbusSystemd` against a real Debian 12 guest under QEMU/TCG (`e2e/qemu/run`).
//! The guest is restored from a saved booted VM (the first run builds the image and the golden
//! state, a few minutes; later runs restore in seconds). Its system bus is forwarded to a host
//! unix socket over ssh, its `/etc/systemd/system` is sshfs-mounted on the host (the unit dir).
//! The test writes, enables and starts a unit, reboots the guest through login1 and proves the
//! reboot happened (boot_id changed, ssh back, the enabled unit active again).
//!
//! Fails when the tier is missing (not root, no QEMU, no image or saved VM: `e2e/qemu/run
//! check` says what); skipped only with `FLEXNODE_SKIP_QEMU=1` (`tests/support/tier.rs`).

use crate::support;

use flexnode::effects::Systemd;
use flexnode::effects::systemd::DbusSystemd;
use flexnode_test_tier::tier;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::tier::{Tier, require};

const UNIT: &str = "fx-qemu-tier.service";
const UNIT_TEXT: &str = "[Unit]\nDescription=flexnode qemu tier probe\n\n[Service]\nType=simple\nExecStart=/bin/sleep infinity\n\n[Install]\nWantedBy=multi-user.target\n";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/qemu/run")
}

fn run(args: &[&str]) -> String {
    let out = Command::new(script())
        .args(args)
        .output()
        .expect("run e2e/qemu/run");
    assert!(
        out.status.success(),
        "e2e/qemu/run {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A restored guest; `down` on drop (QEMU, bus forward, sshfs mount, overlay).
struct Guest {
    name: String,
}

impl Guest {
    fn up(name: &str) -> Self {
        // Constructed first, so a failed `up` is still taken down.
        let g = Self {
            name: name.to_string(),
        };
        run(&["up", name]);
        g
    }

    /// `ssh root@guest CMD`: (exit ok, stdout).
    fn ssh(&self, cmd: &str) -> (bool, String) {
        match Command::new(script())
            .args(["ssh", &self.name, cmd])
            .output()
        {
            Ok(o) => (
                o.status.success(),
                String::from_utf8_lossy(&o.stdout).trim().to_string(),
            ),
            Err(_) => (false, String::new()),
        }
    }

    fn ssh_ok(&self, cmd: &str) -> String {
        let (ok, out) = self.ssh(cmd);
        assert!(ok, "guest command failed: {cmd}: {out}");
        out
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = Command::new(script()).args(["down", &self.name]).status();
    }
}

/// Polls `f` every `every` until it returns `Some`, for at most `limit`.
fn poll<T>(limit: Duration, every: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(every);
    }
}

async fn connect(guest: &Guest) -> DbusSystemd {
    let addr = run(&["bus", &guest.name]);
    assert!(addr.starts_with("unix:path="), "bus address: {addr}");
    DbusSystemd::at_address(&addr)
        .await
        .expect("connect DbusSystemd to the guest's system bus")
        .with_job_timeout(Duration::from_secs(120))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(qemu)]
async fn dbus_systemd_drives_a_qemu_guest_through_a_reboot() {
    require(Tier::Qemu);
    let t = Instant::now();

    let t_up = Instant::now();
    let guest = Guest::up(&format!("qt{}", std::process::id()));
    let up_ms = t_up.elapsed().as_millis();

    let sd = connect(&guest).await;
    let units = PathBuf::from(run(&["units", &guest.name]));
    let sd = sd.with_unit_dir(&units);

    // The bus really is the guest's manager: PID 1 of a systemd 252 system.
    let version = sd.manager().version().await.expect("Manager.Version");
    assert!(
        version.starts_with("252"),
        "guest systemd version {version}"
    );
    let boot1 = guest.ssh_ok("cat /proc/sys/kernel/random/boot_id");
    assert_eq!(boot1.len(), 36, "boot_id {boot1}");

    // write + reload + enable + start, all through DbusSystemd.
    sd.write_unit(UNIT, UNIT_TEXT).await.expect("write_unit");
    assert_eq!(
        guest.ssh_ok(&format!("cat /etc/systemd/system/{UNIT}")),
        UNIT_TEXT.trim_end(),
        "unit file on the guest's disk"
    );
    sd.daemon_reload().await.expect("daemon_reload");
    sd.enable(UNIT).await.expect("enable");
    assert_eq!(
        guest.ssh_ok(&format!("systemctl is-enabled {UNIT}")),
        "enabled"
    );
    sd.start(UNIT).await.expect("start");
    let st = sd
        .unit_state(UNIT)
        .await
        .expect("unit_state")
        .expect("unit loaded");
    assert_eq!(
        (
            st.load_state.as_str(),
            st.active_state.as_str(),
            st.sub_state.as_str()
        ),
        ("loaded", "active", "running"),
        "{st:?}"
    );
    assert!(st.active_enter_usec > 0);
    assert_eq!(
        guest.ssh_ok(&format!("systemctl is-active {UNIT}")),
        "active"
    );
    let pid1 = guest.ssh_ok(&format!("systemctl show -P MainPID {UNIT}"));
    assert!(pid1.parse::<u32>().unwrap_or(0) > 1, "MainPID {pid1}");
    // The unit survives only if it is on disk: make sure it is before the reboot.
    guest.ssh_ok("sync");

    // Reboot through login1.
    let t_reboot = Instant::now();
    sd.reboot().await.expect("login1 Reboot");
    drop(sd);
    let boot2 = poll(Duration::from_secs(600), Duration::from_secs(2), || {
        let (ok, id) = guest.ssh("cat /proc/sys/kernel/random/boot_id");
        (ok && id.len() == 36 && id != boot1).then_some(id)
    })
    .expect("the guest came back with a new boot_id within 600 s");
    let reboot_ssh_ms = t_reboot.elapsed().as_millis();
    assert_ne!(boot1, boot2);
    let uptime: f64 = guest
        .ssh_ok("cut -d' ' -f1 /proc/uptime")
        .parse()
        .expect("uptime");
    assert!(
        uptime < t_reboot.elapsed().as_secs_f64() + 5.0,
        "uptime {uptime}s is older than the reboot"
    );

    // The enabled unit came back by itself (WantedBy=multi-user.target), seen over a new bus.
    let active = poll(Duration::from_secs(300), Duration::from_secs(2), || {
        let (_, s) = guest.ssh(&format!("systemctl is-active {UNIT}"));
        (s == "active").then_some(())
    });
    assert!(active.is_some(), "{UNIT} not active after the reboot");
    let reboot_unit_ms = t_reboot.elapsed().as_millis();
    let sd2 = connect(&guest).await;
    let st2 = sd2
        .unit_state(UNIT)
        .await
        .expect("unit_state after reboot")
        .expect("unit loaded after reboot");
    assert_eq!(
        (st2.active_state.as_str(), st2.sub_state.as_str()),
        ("active", "running"),
        "{st2:?}"
    );
    let pid2 = guest.ssh_ok(&format!("systemctl show -P MainPID {UNIT}"));
    assert!(pid2.parse::<u32>().unwrap_or(0) > 1, "MainPID {pid2}");

    eprintln!(
        "qemu tier timings: restore-to-ssh {up_ms} ms, reboot-to-ssh(new boot_id) \
         {reboot_ssh_ms} ms, reboot-to-unit-active {reboot_unit_ms} ms, total {} ms",
        t.elapsed().as_millis()
    );
    drop(sd2);
    drop(guest);
}
