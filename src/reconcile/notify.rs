//! The daemon's account of itself to systemd (`Type=notify`, `WatchdogSec=`,
//! `TimeoutStartSec=` in `units/`): ready once start-up is done, alive while it makes progress,
//! and what it does or waits for in one STATUS line.
//!
//! Start-up first finishes a step a crash or a power cut interrupted, and that step may be a
//! repave's: a node image pulled and unpacked (minutes on a slow host), machines stopped and
//! started, the kubelet awaited. Before `READY=1` each sign of progress extends the start
//! timeout (`EXTEND_TIMEOUT_USEC`), after it feeds the watchdog — also from inside one long
//! effect (the containerd effect's [`Heartbeat`](crate::effects::containerd::Heartbeat), per
//! chunk streamed or unpacked). A daemon that stops making progress still runs out of either;
//! one that is slow no longer does (the power-cut soak in `docs/reliability.md` found a repave
//! killed by both on a loaded host, its unpack started over at every restart).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long one sign of progress extends the start timeout: the agent unit's own
/// `TimeoutStartSec` (and `WatchdogSec`), so the longest quiet stretch allowed stays the same.
pub const EXTEND: Duration = Duration::from_secs(300);

/// Progress reports closer together than this are dropped (chunks arrive by the thousand).
const EVERY_MS: u64 = 1000;

static READY: AtomicBool = AtomicBool::new(false);
static LAST_MS: AtomicU64 = AtomicU64::new(0);

/// Start-up is done: `READY=1`; progress feeds the watchdog from now on.
pub fn ready() {
    READY.store(true, Ordering::Relaxed);
    notify(&[sd_notify::NotifyState::Ready]);
}

/// Waiting for the store counts as started for systemd (so it neither kills the agent for a
/// slow start nor restarts it); STATUS says what it waits for. The watchdog is fed meanwhile.
pub fn ready_while_waiting() {
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Watchdog,
    ]);
}

/// systemd's STATUS (`systemctl status`, `StatusText`): the first line of `text`, bounded.
pub fn status_text(text: &str) {
    let line: String = text
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(480)
        .collect();
    notify(&[sd_notify::NotifyState::Status(&line)]);
}

/// The daemon made progress (an effect finished, a chunk was streamed, the kubelet was
/// polled): at most once a second, what [`states`] says for this phase.
pub fn progress() {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let last = LAST_MS.load(Ordering::Relaxed);
    if !due(last, now)
        || LAST_MS
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    notify(&states(READY.load(Ordering::Relaxed)));
}

/// What a sign of progress tells systemd: the watchdog always; before `READY=1` also a
/// start timeout extended by [`EXTEND`] from now.
pub fn states(ready: bool) -> Vec<sd_notify::NotifyState<'static>> {
    let mut s = vec![sd_notify::NotifyState::Watchdog];
    if !ready {
        s.push(sd_notify::NotifyState::ExtendTimeoutUsec(
            EXTEND.as_micros() as u32,
        ));
    }
    s
}

/// Whether a report at `now_ms` is due after the last one at `last_ms`.
pub fn due(last_ms: u64, now_ms: u64) -> bool {
    now_ms.saturating_sub(last_ms) >= EVERY_MS || now_ms < last_ms
}

/// Tells systemd; a no-op outside a `Type=notify` unit. Never waits: a message the manager's
/// socket has no room for is dropped, since a watchdog ping or a STATUS line is worth nothing
/// late, while a wait would stall this runtime thread for as long as nothing reads the socket.
pub fn notify(states: &[sd_notify::NotifyState<'_>]) {
    match send(states) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
            tracing::debug!("sd_notify dropped: the notification socket is full");
        }
        Err(e) => tracing::warn!(error = %e, "sd_notify failed"),
    }
}

/// `sd_notify(3)`'s protocol, sent without blocking: the sd-notify and libsystemd crates send
/// with a blocking call and have no other (the states' text is still sd-notify's).
fn send(states: &[sd_notify::NotifyState<'_>]) -> std::io::Result<()> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(path) => send_to(&path, states),
        None => Ok(()),
    }
}

/// To the socket `path` names (a leading `@`: an abstract one).
fn send_to(path: &std::ffi::OsStr, states: &[sd_notify::NotifyState<'_>]) -> std::io::Result<()> {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
    let addr = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name)?,
        None => SocketAddr::from_pathname(path)?,
    };
    let sock = UnixDatagram::unbound()?;
    sock.set_nonblocking(true)?;
    sock.send_to_addr(msg.as_bytes(), &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_socket_nobody_reads_drops_the_message_instead_of_blocking() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("notify");
        let manager = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
        let ping = [sd_notify::NotifyState::Watchdog];
        let mut sent = 0;
        let full = loop {
            match send_to(path.as_os_str(), &ping) {
                Ok(()) => sent += 1,
                Err(e) => break e,
            }
            assert!(sent < 100_000, "the socket never filled");
        };
        assert_eq!(full.kind(), std::io::ErrorKind::WouldBlock, "{full}");
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"WATCHDOG=1\n");
        // Room again: the next message goes.
        send_to(path.as_os_str(), &[sd_notify::NotifyState::Ready]).expect("send");
    }

    #[test]
    fn an_abstract_socket_is_reached_by_its_name() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("flexnode-test-{}", std::process::id());
        let addr =
            std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let manager = std::os::unix::net::UnixDatagram::bind_addr(&addr).expect("bind");
        send_to(
            std::ffi::OsStr::new(&format!("@{name}")),
            &[sd_notify::NotifyState::Status("waiting")],
        )
        .expect("send");
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).expect("recv");
        assert_eq!(&buf[..n], b"STATUS=waiting\n");
    }

    #[test]
    fn before_ready_progress_extends_the_start_timeout_after_it_only_feeds_the_watchdog() {
        let text = |ready| {
            states(ready)
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(text(false), ["WATCHDOG=1", "EXTEND_TIMEOUT_USEC=300000000"]);
        assert_eq!(text(true), ["WATCHDOG=1"]);
    }

    #[test]
    fn progress_is_reported_at_most_once_a_second() {
        assert!(due(0, 1_700_000_000_000), "the first report");
        assert!(!due(1_700_000_000_000, 1_700_000_000_999));
        assert!(due(1_700_000_000_000, 1_700_000_001_000));
        assert!(
            due(1_700_000_001_000, 1_700_000_000_000),
            "a clock set back"
        );
    }
}
