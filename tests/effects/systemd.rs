//! `DbusSystemd` against a real systemd: PID 1 of a systemd-nspawn container booted by
//! `e2e/nspawn/run` (Debian 12, systemd 252), reached over the container's system bus socket,
//! which the script exposes on the host. Needs root; the first run builds the rootfs (~75 s).
//! Fails when the tier is missing; skipped only with `FLEXNODE_SKIP_NSPAWN=1` (`tests/support/tier.rs`).

use crate::support;

use flexnode::effects::systemd::{DbusSystemd, RESTART_UNIT_PREFIX};
use flexnode::effects::{EffectError, Systemd, machine_unit};
use flexnode::lifecycle::Timestamp;
use flexnode::lifecycle::state::Side;
use flexnode_test_tier::tier;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::nspawn::Container;
use support::wait_for;
use zbus::proxy::CacheProperties;
use zbus_systemd::systemd1::UnitProxy;

const SLEEPER: &str = "fx-sleep.service";
const FAILER: &str = "fx-fail.service";

fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    Timestamp::from_millis(i64::try_from(d.as_millis()).expect("ms fit i64"))
}

fn failed_message(r: Result<(), EffectError>) -> String {
    match r {
        Err(EffectError::Failed(m)) => m,
        other => panic!("expected Failed, got {other:?}"),
    }
}

async fn description(sd: &DbusSystemd, unit: &str) -> String {
    let path = sd
        .manager()
        .load_unit(unit.to_string())
        .await
        .expect("LoadUnit");
    let p = UnitProxy::builder(sd.manager().inner().connection())
        .path(path)
        .cache_properties(CacheProperties::No)
        .build()
        .await
        .expect("unit proxy");
    p.description().await.expect("Description")
}

async fn active_state(sd: &DbusSystemd, unit: &str) -> Option<String> {
    sd.unit_state(unit)
        .await
        .expect("unit state")
        .map(|s| s.active_state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn)]
async fn dbus_systemd_drives_a_real_system_manager() {
    let c = Container::up(&format!("fxsd-{}", std::process::id()));
    eprintln!(
        "container {} booted in {} ms; bus {}",
        c.name, c.boot_ms, c.bus
    );
    let sd = DbusSystemd::at_address(&c.bus)
        .await
        .expect("connect to the container's systemd")
        .with_unit_dir(&c.units)
        .with_job_timeout(Duration::from_secs(30));

    // --- write_unit, daemon_reload: atomic, 0644, picked up on reload.
    let sleeper = |desc: &str| {
        format!(
            "[Unit]\nDescription={desc}\n\n[Service]\nExecStart=/bin/sleep infinity\n\n\
             [Install]\nWantedBy=multi-user.target\n"
        )
    };
    sd.write_unit(SLEEPER, &sleeper("fx sleeper v1"))
        .await
        .expect("write_unit");
    let file = c.units.join(SLEEPER);
    assert_eq!(
        std::fs::read_to_string(&file).expect("unit file"),
        sleeper("fx sleeper v1")
    );
    assert_eq!(
        std::fs::metadata(&file).expect("stat").permissions().mode() & 0o7777,
        0o644
    );
    sd.daemon_reload().await.expect("daemon_reload");
    assert_eq!(description(&sd, SLEEPER).await, "fx sleeper v1");
    sd.write_unit(SLEEPER, &sleeper("fx sleeper v2"))
        .await
        .expect("rewrite");
    sd.daemon_reload().await.expect("daemon_reload");
    assert_eq!(description(&sd, SLEEPER).await, "fx sleeper v2");
    let leftovers: Vec<_> = std::fs::read_dir(&c.units)
        .expect("ls units")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // --- start: active, active_since set to about now.
    assert_eq!(sd.active_since(SLEEPER).await.expect("active_since"), None);
    let before = now();
    sd.start(SLEEPER).await.expect("start");
    let t1 = sd
        .active_since(SLEEPER)
        .await
        .expect("active_since")
        .expect("active after start");
    assert!(
        t1 >= Timestamp::from_millis(before.millis() - 5) && t1 <= now(),
        "ActiveEnterTimestamp {t1:?} not between {before:?} and now"
    );
    let st = sd
        .unit_state(SLEEPER)
        .await
        .expect("state")
        .expect("loaded");
    assert_eq!(
        (st.active_state.as_str(), st.sub_state.as_str()),
        ("active", "running")
    );
    // Starting an active unit is a no-op that succeeds.
    sd.start(SLEEPER).await.expect("start again");
    assert_eq!(
        sd.active_since(SLEEPER).await.expect("active_since"),
        Some(t1)
    );

    // --- write_drop_in: applied at the next reload (systemd 252 does not count a new drop-in
    // directory in NeedDaemonReload, so the executor reloads before it starts a machine);
    // removing it (and only flexnode's) undoes it.
    let drop_in = "[Unit]\nDescription=fx sleeper (drop-in)\n";
    assert!(
        sd.write_drop_in(SLEEPER, drop_in)
            .await
            .expect("write_drop_in")
    );
    assert!(
        !sd.write_drop_in(SLEEPER, drop_in).await.expect("again"),
        "unchanged"
    );
    sd.daemon_reload().await.expect("daemon_reload");
    assert_eq!(description(&sd, SLEEPER).await, "fx sleeper (drop-in)");
    let dir = c.units.join(format!("{SLEEPER}.d"));
    std::fs::write(dir.join("other.conf"), "[Unit]\n").expect("someone else's drop-in");
    assert!(sd.remove_drop_in(SLEEPER).await.expect("remove_drop_in"));
    assert!(
        !sd.remove_drop_in(SLEEPER).await.expect("again"),
        "already gone"
    );
    assert!(
        dir.join("other.conf").exists(),
        "only flexnode's drop-in goes"
    );
    std::fs::remove_dir_all(&dir).expect("clean");
    sd.daemon_reload().await.expect("daemon_reload");
    assert_eq!(description(&sd, SLEEPER).await, "fx sleeper v2");

    // --- restart: active_since advances.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let rt = Instant::now();
    sd.restart(SLEEPER).await.expect("restart");
    let restart_ms = rt.elapsed().as_secs_f64() * 1000.0;
    let t2 = sd
        .active_since(SLEEPER)
        .await
        .expect("active_since")
        .expect("active after restart");
    assert!(
        t2 > t1,
        "restart did not advance ActiveEnterTimestamp: {t1:?} -> {t2:?}"
    );
    eprintln!("restart round trip: {restart_ms:.1} ms");

    // --- stop: inactive; stopping again or stopping an unknown unit is fine.
    sd.stop(SLEEPER).await.expect("stop");
    assert_eq!(sd.active_since(SLEEPER).await.expect("active_since"), None);
    // Inactive, or already unloaded (garbage-collected).
    let st = active_state(&sd, SLEEPER).await;
    assert!(matches!(st.as_deref(), None | Some("inactive")), "{st:?}");
    sd.stop(SLEEPER).await.expect("stop again");
    sd.stop("fx-never-existed.service")
        .await
        .expect("stop unknown");

    // --- a failing unit: Failed naming the unit and the job result; reset_failed clears it.
    sd.write_unit(
        FAILER,
        "[Unit]\nDescription=fx fails\n\n[Service]\nType=oneshot\nExecStart=/bin/false\n",
    )
    .await
    .expect("write failing unit");
    sd.daemon_reload().await.expect("daemon_reload");
    let msg = failed_message(sd.start(FAILER).await);
    eprintln!("failing start: {msg}");
    assert!(
        msg.contains(FAILER),
        "message does not name the unit: {msg}"
    );
    assert!(
        msg.contains("job failed"),
        "message does not give the job result: {msg}"
    );
    assert!(
        msg.contains("exit-code"),
        "message does not give the service result: {msg}"
    );
    assert_eq!(active_state(&sd, FAILER).await.as_deref(), Some("failed"));
    sd.reset_failed(FAILER).await.expect("reset_failed");
    let after = active_state(&sd, FAILER).await;
    assert!(
        after.as_deref() != Some("failed"),
        "still failed after reset_failed: {after:?}"
    );
    sd.reset_failed("fx-never-existed.service")
        .await
        .expect("reset_failed unknown");
    // A unit that does not exist: Failed, naming it.
    let msg = failed_message(sd.start("fx-missing.service").await);
    assert!(msg.contains("fx-missing.service"), "{msg}");
    // remove_unit: gone, and removing again is fine.
    sd.remove_unit(FAILER).await.expect("remove_unit");
    assert!(!c.units.join(FAILER).exists());
    sd.remove_unit(FAILER).await.expect("remove_unit again");
    // Paths are not unit names.
    failed_message(sd.write_unit("../escape.service", "").await.map(drop));

    // --- a job that outlives the timeout: Failed, naming the unit; stop cancels it.
    sd.write_unit(
        "fx-slow.service",
        "[Service]\nType=oneshot\nExecStart=/bin/sleep 30\n",
    )
    .await
    .expect("write slow unit");
    sd.daemon_reload().await.expect("daemon_reload");
    let impatient = sd.clone().with_job_timeout(Duration::from_millis(500));
    let msg = failed_message(impatient.start("fx-slow.service").await);
    assert!(
        msg.contains("fx-slow.service") && msg.contains("did not finish"),
        "{msg}"
    );
    sd.stop("fx-slow.service").await.expect("stop slow unit");
    sd.remove_unit("fx-slow.service").await.expect("remove");

    // --- enable/disable: the [Install] symlink, UnitFileState, and no reload left pending.
    let wants = c.units.join("multi-user.target.wants").join(SLEEPER);
    sd.enable(SLEEPER).await.expect("enable");
    assert!(
        wants.is_symlink(),
        "{} missing after enable",
        wants.display()
    );
    let state = sd
        .manager()
        .get_unit_file_state(SLEEPER.to_string())
        .await
        .expect("UnitFileState");
    assert_eq!(state, "enabled");
    sd.enable(SLEEPER).await.expect("enable again");
    sd.disable(SLEEPER).await.expect("disable");
    assert!(
        !wants.exists() && !wants.is_symlink(),
        "symlink left after disable"
    );
    let state = sd
        .manager()
        .get_unit_file_state(SLEEPER.to_string())
        .await
        .expect("UnitFileState");
    assert_eq!(state, "disabled");
    sd.disable(SLEEPER).await.expect("disable again");
    sd.disable("fx-never-existed.service")
        .await
        .expect("disable unknown");

    // --- schedule_restart: a transient timer restarts the unit after the delay.
    sd.start(SLEEPER).await.expect("start");
    let t3 = sd
        .active_since(SLEEPER)
        .await
        .expect("active_since")
        .expect("active");
    let delay_ms = 1000;
    let scheduled = now();
    let (timer, service) = sd
        .schedule_restart_named(SLEEPER, delay_ms)
        .await
        .expect("schedule_restart");
    assert!(
        timer.starts_with(RESTART_UNIT_PREFIX) && timer.ends_with(".timer"),
        "{timer}"
    );
    assert_eq!(
        timer.trim_end_matches(".timer"),
        service.trim_end_matches(".service")
    );
    assert_eq!(active_state(&sd, &timer).await.as_deref(), Some("active"));
    // Not before the delay: judged by when it restarted (below), not at a fixed moment.
    let t4 = wait_for(Duration::from_secs(10), || async {
        sd.active_since(SLEEPER)
            .await
            .expect("active_since")
            .filter(|t| *t > t3)
    })
    .await
    .expect("the timer did not restart the unit within 10 s");
    let fired_after = t4.millis() - scheduled.millis();
    eprintln!("schedule_restart({delay_ms} ms): restarted {fired_after} ms after scheduling");
    assert!(
        fired_after >= i64::try_from(delay_ms).expect("small") - 5,
        "restarted too early: {fired_after} ms"
    );
    // Both transient units are collected once done.
    let gone = wait_for(Duration::from_secs(5), || async {
        let left = sd
            .loaded_units_with_prefix(RESTART_UNIT_PREFIX)
            .await
            .expect("list units");
        left.is_empty().then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "transient units not collected: {:?}",
        sd.loaded_units_with_prefix(RESTART_UNIT_PREFIX).await
    );
    // The same for the trait method, on an inactive unit: it gets started.
    sd.stop(SLEEPER).await.expect("stop");
    sd.schedule_restart(SLEEPER, 100)
        .await
        .expect("schedule_restart");
    let started = wait_for(Duration::from_secs(5), || async {
        sd.active_since(SLEEPER).await.expect("active_since")
    })
    .await;
    assert!(
        started.is_some(),
        "scheduled restart did not start an inactive unit"
    );
    sd.stop(SLEEPER).await.expect("stop");

    // --- started_since sees a run that is still starting (a Type=notify unit that has not
    // said READY=1: the agent asking about itself during its start-up), active_since not.
    let starting = "fx-starting.service";
    sd.write_unit(
        starting,
        "[Unit]\nDescription=never ready\n\n[Service]\nType=notify\nTimeoutStartSec=infinity\n\
         ExecStart=/bin/sleep infinity\n",
    )
    .await
    .expect("write");
    sd.daemon_reload().await.expect("reload");
    let before = now();
    sd.start_no_wait(starting).await.expect("start_no_wait");
    let started = wait_for(Duration::from_secs(10), || async {
        sd.started_since(starting).await.expect("started_since")
    })
    .await
    .expect("started_since while activating");
    assert!(
        started.millis() >= before.millis() - 5,
        "{started:?} < {before:?}"
    );
    assert_eq!(
        active_state(&sd, starting).await.as_deref(),
        Some("activating")
    );
    assert_eq!(sd.active_since(starting).await.expect("active_since"), None);
    sd.stop(starting).await.expect("stop");
    assert_eq!(
        sd.started_since(starting).await.expect("started_since"),
        None
    );

    // machine_status of a real (nested) nspawn machine: the effects contract and
    // `machined_reports_and_terminates_a_nested_nspawn_machine` below.

    eprintln!(
        "summary: boot {} ms, restart round trip {restart_ms:.1} ms, timer {delay_ms} ms fired after {fired_after} ms",
        c.boot_ms
    );
}

/// Whether `pid` is a live process on the host.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
}

/// machine1 against the container's machined, with a machine `kube1` that really runs: a
/// systemd-nspawn nested in the nspawn container, started as `systemd-nspawn@kube1.service`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn)]
async fn machined_reports_and_terminates_a_nested_nspawn_machine() {
    let t0 = Instant::now();
    let c = Container::up(&format!("fxmd-{}", std::process::id()));
    let sd = DbusSystemd::at_address(&c.bus)
        .await
        .expect("connect")
        .with_unit_dir(&c.units)
        .with_job_timeout(Duration::from_secs(30));
    let side = Side::Kube1;
    let unit = machine_unit(side);

    // Nothing yet: machined lists only the host; the status falls back to the (absent) unit.
    let list = sd.list_machines().await.expect("list_machines");
    assert!(
        list.iter().all(|m| m.class == "host"),
        "unexpected machines: {list:?}"
    );
    assert_eq!(sd.machine("kube1").await.expect("machine"), None);
    let status = sd.machine_status(side).await.expect("machine_status");
    assert!(!status.running && status.started_at.is_none(), "{status:?}");
    failed_message(sd.machine("../kube1").await.map(drop));

    // Start the machine unit: nspawn registers kube1 with machined.
    sd.write_unit(&unit, support::nspawn::NESTED_MACHINE_UNIT)
        .await
        .expect("write machine unit");
    sd.daemon_reload().await.expect("daemon_reload");
    let before = now();
    sd.start(&unit).await.expect("start nested machine");
    let info = sd
        .machine("kube1")
        .await
        .expect("machine")
        .expect("machined knows kube1");
    eprintln!("machined: {info:?}");
    assert_eq!(info.name, "kube1");
    assert_eq!(info.class, "container");
    assert_eq!(info.service, "systemd-nspawn");
    assert_eq!(info.unit, unit);
    assert_eq!(info.state, "running");
    assert!(info.leader > 1, "{info:?}");
    // The leader is the machine's PID 1, `sleep`, in the container's PID namespace.
    let comm = c.run(&[
        "exec",
        &c.name,
        "cat",
        &format!("/proc/{}/comm", info.leader),
    ]);
    assert_eq!(comm, "sleep");
    let registered = info.registered_at.expect("registration time");
    assert!(
        registered.millis() >= before.millis() - 5 && registered <= now(),
        "{registered:?} not between {before:?} and now"
    );
    let list = sd.list_machines().await.expect("list_machines");
    let entry = list
        .iter()
        .find(|m| m.name == "kube1")
        .unwrap_or_else(|| panic!("kube1 not listed: {list:?}"));
    assert_eq!(
        (entry.class.as_str(), entry.service.as_str()),
        ("container", "systemd-nspawn")
    );
    assert!(list.iter().any(|m| m.name == ".host"), "{list:?}");

    // machine_status prefers machined: its start time is the registration, not the unit's
    // ActiveEnterTimestamp (Type=notify: the unit becomes active after nspawn registered).
    let status = sd.machine_status(side).await.expect("machine_status");
    assert!(status.running, "{status:?}");
    assert_eq!(status.started_at, Some(registered));
    let unit_since = sd
        .active_since(&unit)
        .await
        .expect("active_since")
        .expect("unit active");
    eprintln!("registered {registered:?}, unit active since {unit_since:?}");
    assert!(!sd.machine_status(Side::Kube2).await.expect("kube2").running);

    // Terminate: machined stops the unit; the machine is gone, the unit inactive.
    let tt = Instant::now();
    sd.terminate_machine("kube1").await.expect("terminate");
    let terminate_ms = tt.elapsed().as_millis();
    assert_eq!(sd.machine("kube1").await.expect("machine"), None);
    assert!(
        sd.list_machines()
            .await
            .expect("list")
            .iter()
            .all(|m| m.name != "kube1")
    );
    let stopped = wait_for(Duration::from_secs(10), || async {
        sd.active_since(&unit)
            .await
            .expect("active_since")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(stopped.is_some(), "unit still active after terminate");
    let status = sd.machine_status(side).await.expect("machine_status");
    assert!(!status.running && status.started_at.is_none(), "{status:?}");
    // Idempotent, and an unknown machine is nothing to do.
    sd.terminate_machine("kube1")
        .await
        .expect("terminate again");
    sd.terminate_machine("never-there")
        .await
        .expect("terminate unknown");
    eprintln!(
        "summary: machine test {} ms (boot {} ms), terminate {terminate_ms} ms",
        t0.elapsed().as_millis(),
        c.boot_ms
    );
}

/// login1 `Reboot(false)` in the container: its systemd goes down. A plain `systemd-nspawn -b`
/// ends when the container reboots (exit status 133, meant for a restarting service manager),
/// so the reboot shows as the nspawn process exiting, the old leader gone, and the bus
/// connection dead. `down` (on drop) then only removes the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn)]
async fn reboot_takes_the_container_system_down() {
    let c = Container::up(&format!("fxrb-{}", std::process::id()));
    let sd = DbusSystemd::at_address(&c.bus).await.expect("connect");
    let nspawn: u32 = c.run(&["pid", &c.name]).parse().expect("nspawn pid");
    let leader: u32 = c.run(&["leader", &c.name]).parse().expect("leader pid");
    assert!(alive(nspawn) && alive(leader));
    let t = Instant::now();
    sd.reboot().await.expect("reboot");
    let down = wait_for(Duration::from_secs(30), || async {
        let current = Command::new(&c.script)
            .args(["leader", &c.name])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .trim()
                    .parse::<u32>()
                    .ok()
            });
        (!alive(leader) && current != Some(leader)).then_some(current)
    })
    .await;
    let went_down_ms = t.elapsed().as_millis();
    let new_leader = down.expect("the container's PID 1 was still there 30 s after Reboot");
    eprintln!(
        "reboot: old leader {leader} gone after {went_down_ms} ms; nspawn {} ; new leader {new_leader:?}",
        if alive(nspawn) {
            "still running"
        } else {
            "exited"
        }
    );
    // The old connection is dead: the manager that served it is gone.
    let call = tokio::time::timeout(Duration::from_secs(10), sd.manager().version()).await;
    assert!(
        !matches!(call, Ok(Ok(_))),
        "the old bus connection still answers after the reboot"
    );
}

/// The host install's bootstrap unit runs `flexnode join` until the join has enabled the
/// agent: a join cut short after writing the units (the agent's unit file there, not enabled)
/// is run again at the next boot, instead of leaving a host where neither runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn)]
async fn the_bootstrap_unit_runs_until_the_join_enabled_the_agent() {
    use flexnode::effects::{AGENT_UNIT, BOOTSTRAP_UNIT};
    let c = Container::up(&format!("fxbs-{}", std::process::id()));
    let sd = DbusSystemd::at_address(&c.bus)
        .await
        .expect("connect to the container's systemd")
        .with_unit_dir(&c.units)
        .with_job_timeout(Duration::from_secs(30));
    flexnode::exec::write_units(&sd, flexnode::lifecycle::agent::InstallMode::Host)
        .await
        .expect("the host install's units written");
    let condition = |expected: &'static str| {
        // The start fails where the condition holds (no flexnode binary in this container);
        // the condition's result is what counts.
        let _ = c.exec(&["systemctl", "start", BOOTSTRAP_UNIT]);
        let out = c.exec(&[
            "systemctl",
            "show",
            "--property=ConditionResult",
            "--value",
            BOOTSTRAP_UNIT,
        ]);
        let _ = c.exec(&["systemctl", "stop", BOOTSTRAP_UNIT]);
        let _ = c.exec(&["systemctl", "reset-failed", BOOTSTRAP_UNIT]);
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            expected,
            "the bootstrap unit's condition"
        );
    };
    assert!(
        c.units.join(AGENT_UNIT).exists(),
        "the agent's unit file is written"
    );
    condition("yes");
    sd.enable(AGENT_UNIT).await.expect("enable the agent");
    condition("no");
}
