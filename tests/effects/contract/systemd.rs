//! The `Systemd` contract. Each case uses its own unit names, so the cases can share one
//! manager (one container) and run in any order.

use super::{assert_about_now, failed_message, now, wait_for};
use flexnode::effects::{Systemd, machine_unit};
use flexnode::lifecycle::state::Side;
use std::time::Duration;

/// What differs between implementations.
#[allow(async_fn_in_trait)]
pub trait SystemdFixture {
    type S: Systemd;
    fn systemd(&self) -> &Self::S;
    /// Installs `unit` as a unit whose process exits non-zero (not yet reloaded).
    async fn write_failing_unit(&self, unit: &str);
    /// Makes `side`'s machine unit startable (a real host: a unit of that name; the simulated
    /// host: a provisioned rootfs).
    async fn prepare_machine(&self, side: Side);
}

/// A long-running service, with an `[Install]` section.
pub fn service(description: &str) -> String {
    format!(
        "[Unit]\nDescription={description}\n\n[Service]\nExecStart=/bin/sleep infinity\n\n\
         [Install]\nWantedBy=multi-user.target\n"
    )
}

/// The unit process exits 1.
pub const FAILING_SERVICE: &str =
    "[Unit]\nDescription=fails\n\n[Service]\nType=oneshot\nExecStart=/bin/false\n";

async fn install<S: Systemd>(sd: &S, unit: &str) {
    sd.write_unit(unit, &service(unit))
        .await
        .unwrap_or_else(|e| panic!("write_unit {unit}: {e}"));
    sd.daemon_reload().await.expect("daemon_reload");
}

async fn since<S: Systemd>(sd: &S, unit: &str) -> Option<flexnode::lifecycle::Timestamp> {
    sd.active_since(unit)
        .await
        .unwrap_or_else(|e| panic!("active_since {unit}: {e}"))
}

/// Every case, in order.
pub async fn run_all<F: SystemdFixture>(implementation: &'static str, fx: &F) {
    run_cases!(
        implementation,
        fx,
        [
            start_sets_active_since_to_now,
            start_of_an_active_unit_is_a_no_op,
            restart_advances_active_since,
            restart_of_an_inactive_unit_starts_it,
            stop_is_idempotent,
            start_of_an_unknown_unit_fails_naming_it,
            restart_of_an_unknown_unit_fails_naming_it,
            a_unit_that_exits_non_zero_fails_to_start,
            reset_failed_of_an_unknown_unit_is_ok,
            enable_and_disable_are_idempotent,
            unit_file_present_follows_write_and_remove,
            a_changed_unit_file_needs_a_reload,
            a_masked_unit_does_not_start,
            enable_without_a_unit_file_fails,
            remove_unit_is_idempotent,
            a_removed_unit_cannot_start,
            a_running_unit_survives_removal_of_its_file,
            paths_are_not_unit_names,
            machine_status_follows_the_machine_unit,
            schedule_restart_restarts_after_the_delay,
            schedule_restart_starts_an_inactive_unit,
            queued_start_and_restart_happen_without_waiting,
        ]
    );
}

/// write_unit, daemon_reload, start: active since about now (and not before the start), its
/// run started at or before that; neither once stopped.
pub async fn start_sets_active_since_to_now<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-start.service";
    assert_eq!(since(sd, unit).await, None, "never started");
    install(sd, unit).await;
    assert_eq!(since(sd, unit).await, None, "installed, not started");
    assert_eq!(sd.started_since(unit).await.expect("started_since"), None);
    let before = now();
    sd.start(unit).await.expect("start");
    let t = since(sd, unit).await.expect("active after start");
    assert_about_now("active_since after start", t, before);
    // The run began when it left inactive: at most when it became active.
    let started = sd
        .started_since(unit)
        .await
        .expect("started_since")
        .expect("started while active");
    assert_about_now("started_since after start", started, before);
    assert!(
        started <= t,
        "started {started:?} after it became active {t:?}"
    );
    sd.stop(unit).await.expect("stop");
    assert_eq!(sd.started_since(unit).await.expect("started_since"), None);
}

/// Starting an active unit succeeds and changes nothing.
pub async fn start_of_an_active_unit_is_a_no_op<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-start-twice.service";
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    let t1 = since(sd, unit).await.expect("active");
    tokio::time::sleep(Duration::from_millis(20)).await;
    sd.start(unit).await.expect("start again");
    assert_eq!(
        since(sd, unit).await,
        Some(t1),
        "start again moved active_since"
    );
    sd.stop(unit).await.expect("stop");
}

/// restart: active again, since later than before.
pub async fn restart_advances_active_since<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-restart.service";
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    let t1 = since(sd, unit).await.expect("active");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = now();
    sd.restart(unit).await.expect("restart");
    let t2 = since(sd, unit).await.expect("active after restart");
    assert!(
        t2 > t1,
        "restart did not advance active_since: {t1:?} -> {t2:?}"
    );
    assert_about_now("active_since after restart", t2, before);
    sd.stop(unit).await.expect("stop");
}

/// restart of a stopped unit starts it.
pub async fn restart_of_an_inactive_unit_starts_it<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-restart-stopped.service";
    install(sd, unit).await;
    let before = now();
    sd.restart(unit).await.expect("restart");
    let t = since(sd, unit).await.expect("active after restart");
    assert_about_now("active_since", t, before);
    sd.stop(unit).await.expect("stop");
}

/// stop: not active; stopping again, or a unit nobody knows, is fine.
pub async fn stop_is_idempotent<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-stop.service";
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    assert!(since(sd, unit).await.is_some());
    sd.stop(unit).await.expect("stop");
    assert_eq!(since(sd, unit).await, None, "active after stop");
    sd.stop(unit).await.expect("stop again");
    assert_eq!(since(sd, unit).await, None);
    sd.stop("fxc-never-existed.service")
        .await
        .expect("stop of an unknown unit");
    assert_eq!(since(sd, "fxc-never-existed.service").await, None);
}

pub async fn start_of_an_unknown_unit_fails_naming_it<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-missing.service";
    let msg = failed_message("start of an unknown unit", sd.start(unit).await);
    assert!(msg.contains(unit), "does not name the unit: {msg}");
    assert_eq!(since(sd, unit).await, None);
}

pub async fn restart_of_an_unknown_unit_fails_naming_it<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-missing-restart.service";
    let msg = failed_message("restart of an unknown unit", sd.restart(unit).await);
    assert!(msg.contains(unit), "does not name the unit: {msg}");
    assert_eq!(since(sd, unit).await, None);
}

/// A unit whose process exits non-zero: start fails naming it, it is not active, and
/// reset_failed clears it so it can be tried again (and fails again).
pub async fn a_unit_that_exits_non_zero_fails_to_start<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-fail.service";
    fx.write_failing_unit(unit).await;
    sd.daemon_reload().await.expect("daemon_reload");
    let msg = failed_message("start of a failing unit", sd.start(unit).await);
    assert!(msg.contains(unit), "does not name the unit: {msg}");
    assert_eq!(since(sd, unit).await, None, "a failed unit is not active");
    sd.reset_failed(unit).await.expect("reset_failed");
    sd.reset_failed(unit).await.expect("reset_failed again");
    let msg = failed_message("second start of a failing unit", sd.start(unit).await);
    assert!(msg.contains(unit), "does not name the unit: {msg}");
    let msg = failed_message("restart of a failing unit", sd.restart(unit).await);
    assert!(msg.contains(unit), "does not name the unit: {msg}");
    sd.reset_failed(unit).await.expect("reset_failed");
    sd.remove_unit(unit).await.expect("remove_unit");
}

pub async fn reset_failed_of_an_unknown_unit_is_ok<F: SystemdFixture>(fx: &F) {
    fx.systemd()
        .reset_failed("fxc-never-existed.service")
        .await
        .expect("reset_failed of an unknown unit");
}

/// enable/disable succeed, twice, and `is_enabled` follows them; disabling a unit without a
/// file is fine, and it is not enabled. Enabling does not start anything.
pub async fn enable_and_disable_are_idempotent<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-enable.service";
    install(sd, unit).await;
    assert!(
        !sd.is_enabled(unit).await.expect("is_enabled"),
        "enabled before enable"
    );
    sd.enable(unit).await.expect("enable");
    sd.enable(unit).await.expect("enable again");
    assert!(
        sd.is_enabled(unit).await.expect("is_enabled"),
        "not enabled after enable"
    );
    assert_eq!(since(sd, unit).await, None, "enable started the unit");
    sd.disable(unit).await.expect("disable");
    sd.disable(unit).await.expect("disable again");
    assert!(
        !sd.is_enabled(unit).await.expect("is_enabled"),
        "enabled after disable"
    );
    sd.disable("fxc-never-existed.service")
        .await
        .expect("disable of an unknown unit");
    assert!(
        !sd.is_enabled("fxc-never-existed.service")
            .await
            .expect("is_enabled of an unknown unit")
    );
    sd.remove_unit(unit).await.expect("remove_unit");
}

/// `unit_file_present` follows write_unit and remove_unit.
pub async fn unit_file_present_follows_write_and_remove<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-present.service";
    assert!(
        !sd.unit_file_present(unit).await.expect("present"),
        "before write"
    );
    install(sd, unit).await;
    assert!(
        sd.unit_file_present(unit).await.expect("present"),
        "after write"
    );
    sd.remove_unit(unit).await.expect("remove_unit");
    assert!(
        !sd.unit_file_present(unit).await.expect("present"),
        "after remove"
    );
    failed_message(
        "unit_file_present of a path",
        sd.unit_file_present("../fxc-present.service").await,
    );
}

/// write_unit says whether the file changed; a loaded unit whose file changed needs a
/// daemon-reload until one happens (what the daemon probes at start); an unknown unit does not.
pub async fn a_changed_unit_file_needs_a_reload<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-reload.service";
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    let needs = |u: &'static str| async move { sd.needs_reload(u).await.expect("needs_reload") };
    assert!(!needs(unit).await, "right after a reload");
    assert!(
        !sd.write_unit(unit, &service(unit)).await.expect("write"),
        "the same text again is no change"
    );
    assert!(!needs(unit).await, "after rewriting the same text");
    assert!(
        sd.write_unit(unit, &service("fxc-reload v2"))
            .await
            .expect("write"),
        "a new text is a change"
    );
    assert!(needs(unit).await, "a loaded unit whose file changed");
    sd.daemon_reload().await.expect("daemon_reload");
    assert!(!needs(unit).await, "after the reload");
    assert!(!needs("fxc-never-written.service").await, "an unknown unit");
    sd.stop(unit).await.expect("stop");
    sd.remove_unit(unit).await.expect("remove_unit");
}

/// A masked unit fails to start, saying so (what swap off relies on across boots; the swap
/// units come from the fstab generator or /usr, never from a file in the unit directory,
/// which masking refuses to replace); the swap units listed are swap units.
pub async fn a_masked_unit_does_not_start<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-masked.service";
    sd.mask(unit).await.expect("mask");
    sd.mask(unit).await.expect("mask again");
    sd.daemon_reload().await.expect("daemon_reload");
    let m = failed_message("start of a masked unit", sd.start(unit).await);
    assert!(m.contains(unit) && m.contains("masked"), "{m}");
    sd.remove_unit(unit).await.expect("remove_unit");
    sd.daemon_reload().await.expect("daemon_reload");
    let written = "fxc-masked-file.service";
    install(sd, written).await;
    let m = failed_message("mask of a written unit file", sd.mask(written).await);
    assert!(m.contains(written) && m.contains("exists"), "{m}");
    sd.remove_unit(written).await.expect("remove_unit");
    let swaps = sd.swap_units().await.expect("swap_units");
    assert!(swaps.iter().all(|u| u.ends_with(".swap")), "{swaps:?}");
}

/// There is nothing to enable without a unit file: Failed, naming the unit.
pub async fn enable_without_a_unit_file_fails<F: SystemdFixture>(fx: &F) {
    let unit = "fxc-never-existed.service";
    let msg = failed_message(
        "enable of a unit without a file",
        fx.systemd().enable(unit).await,
    );
    assert!(msg.contains(unit), "does not name the unit: {msg}");
}

/// Removing a unit file that is not there is fine, as is removing twice.
pub async fn remove_unit_is_idempotent<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    sd.remove_unit("fxc-never-existed.service")
        .await
        .expect("remove_unit of an absent unit");
    let unit = "fxc-remove.service";
    install(sd, unit).await;
    sd.remove_unit(unit).await.expect("remove_unit");
    sd.remove_unit(unit).await.expect("remove_unit again");
    sd.daemon_reload().await.expect("daemon_reload");
}

/// Once its file is removed (and the manager reloaded), a stopped unit cannot be started.
pub async fn a_removed_unit_cannot_start<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-removed.service";
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    sd.stop(unit).await.expect("stop");
    sd.remove_unit(unit).await.expect("remove_unit");
    sd.daemon_reload().await.expect("daemon_reload");
    let msg = failed_message("start of a removed unit", sd.start(unit).await);
    assert!(msg.contains(unit), "does not name the unit: {msg}");
    assert_eq!(since(sd, unit).await, None);
}

/// Removing the file of a running unit does not stop it (the executor's uninstall relies on
/// stopping the agent unit after its file is gone): still active, same since, and stop works.
pub async fn a_running_unit_survives_removal_of_its_file<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-running-removed.service";
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    let t = since(sd, unit).await.expect("active");
    sd.remove_unit(unit).await.expect("remove_unit");
    sd.daemon_reload().await.expect("daemon_reload");
    assert_eq!(
        since(sd, unit).await,
        Some(t),
        "removing the file stopped the unit"
    );
    sd.stop(unit).await.expect("stop");
    assert_eq!(since(sd, unit).await, None, "active after stop");
    sd.stop(unit).await.expect("stop again");
}

/// A unit name is a file name with a unit suffix, never a path.
pub async fn paths_are_not_unit_names<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    for bad in ["../escape.service", "a/b.service", "no-suffix", ""] {
        failed_message(
            &format!("write_unit({bad:?})"),
            sd.write_unit(bad, "").await,
        );
        failed_message(&format!("start({bad:?})"), sd.start(bad).await);
        failed_message(&format!("remove_unit({bad:?})"), sd.remove_unit(bad).await);
    }
}

/// machine_status reports the machine `systemd-nspawn@<side>.service` runs: running with its
/// start time (when it registered, at most its unit's active time) while active, neither once
/// stopped; a restart moves the time; the other side is unaffected.
pub async fn machine_status_follows_the_machine_unit<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let side = Side::Kube1;
    let unit = machine_unit(side);
    assert_eq!(unit, "systemd-nspawn@kube1.service");
    let status = sd.machine_status(side).await.expect("machine_status");
    assert!(
        !status.running && status.started_at.is_none(),
        "before: {status:?}"
    );
    fx.prepare_machine(side).await;
    // Enabled (so it comes back at boot) and disabled again, as join and reset do.
    assert!(
        !sd.is_enabled(&unit).await.expect("is_enabled"),
        "enabled before enable"
    );
    sd.enable(&unit).await.expect("enable machine");
    assert!(
        sd.is_enabled(&unit).await.expect("is_enabled"),
        "not enabled after enable"
    );
    sd.disable(&unit).await.expect("disable machine");
    assert!(
        !sd.is_enabled(&unit).await.expect("is_enabled"),
        "enabled after disable"
    );
    let before = now();
    sd.start(&unit).await.expect("start machine");
    let status = sd.machine_status(side).await.expect("machine_status");
    assert!(status.running, "{status:?}");
    let m1 = status.started_at.expect("started_at while running");
    assert_about_now("started_at", m1, before);
    // machined's registration time: the machine registers before its (Type=notify) unit is
    // active, so it is at most the unit's active time.
    let active = since(sd, &unit).await.expect("the machine unit is active");
    assert!(
        m1 <= active,
        "machine started {m1:?} after its unit became active {active:?}"
    );
    // Starting a running machine changes nothing.
    tokio::time::sleep(Duration::from_millis(20)).await;
    sd.start(&unit).await.expect("start machine again");
    assert_eq!(
        sd.machine_status(side).await.expect("status").started_at,
        Some(m1)
    );
    sd.restart(&unit).await.expect("restart machine");
    let status = sd.machine_status(side).await.expect("machine_status");
    let m2 = status.started_at.expect("started_at after restart");
    assert!(status.running && m2 > m1, "{m1:?} -> {status:?}");
    let other = sd.machine_status(Side::Kube2).await.expect("kube2");
    assert!(
        !other.running && other.started_at.is_none(),
        "kube2: {other:?}"
    );
    sd.stop(&unit).await.expect("stop machine");
    let status = sd.machine_status(side).await.expect("machine_status");
    assert!(
        !status.running && status.started_at.is_none(),
        "after stop: {status:?}"
    );
    assert_eq!(since(sd, &unit).await, None);
    sd.stop(&unit).await.expect("stop machine again");
}

/// schedule_restart(unit, 300): not restarted before the delay, restarted (active_since
/// advances) within ~3 s.
pub async fn schedule_restart_restarts_after_the_delay<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-timer.service";
    let delay_ms = 300;
    install(sd, unit).await;
    sd.start(unit).await.expect("start");
    let t = since(sd, unit).await.expect("active");
    let scheduled = now();
    sd.schedule_restart(unit, delay_ms)
        .await
        .expect("schedule_restart");
    // Not restarted before the delay: judged by when it restarted (below), not by looking at
    // a fixed moment, which a loaded machine may reach late.
    let t2 = wait_for(Duration::from_secs(3), || async {
        since(sd, unit).await.filter(|t2| *t2 > t)
    })
    .await
    .expect("not restarted within 3 s");
    let after = t2.millis() - scheduled.millis();
    assert!(
        after >= i64::try_from(delay_ms).expect("small") - 5,
        "restarted {after} ms after scheduling, before the {delay_ms} ms delay"
    );
    sd.stop(unit).await.expect("stop");
}

/// A scheduled restart of a stopped unit starts it.
pub async fn schedule_restart_starts_an_inactive_unit<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-timer-stopped.service";
    install(sd, unit).await;
    sd.schedule_restart(unit, 100)
        .await
        .expect("schedule_restart");
    let started = wait_for(Duration::from_secs(3), || async { since(sd, unit).await }).await;
    assert!(
        started.is_some(),
        "scheduled restart did not start an inactive unit"
    );
    sd.stop(unit).await.expect("stop");
}

/// `start_no_wait`/`restart_no_wait` (what join and the recovery command use for the agent,
/// which waits for the store they hold): they return once the job is queued; the unit becomes
/// active, and a queued restart moves `active_since`.
pub async fn queued_start_and_restart_happen_without_waiting<F: SystemdFixture>(fx: &F) {
    let sd = fx.systemd();
    let unit = "fxc-queued.service";
    // Slow to start: a waited-for start would take ≥ 1 s.
    sd.write_unit(
        unit,
        "[Unit]\nDescription=slow start\n\n[Service]\nExecStartPre=/bin/sleep 1\n\
         ExecStart=/bin/sleep infinity\n",
    )
    .await
    .expect("write_unit");
    sd.daemon_reload().await.expect("daemon_reload");
    sd.start_no_wait(unit).await.expect("start_no_wait");
    let t1 = wait_for(Duration::from_secs(10), || async { since(sd, unit).await })
        .await
        .expect("active after a queued start");
    tokio::time::sleep(Duration::from_millis(20)).await;
    sd.restart_no_wait(unit).await.expect("restart_no_wait");
    wait_for(Duration::from_secs(10), || async {
        since(sd, unit).await.filter(|t| *t > t1)
    })
    .await
    .expect("a queued restart moves active_since");
    failed_message("a path", sd.start_no_wait("../escape.service").await);
    sd.stop(unit).await.expect("stop");
}
