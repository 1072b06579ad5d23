//! What the in-process daemons log, kept for tests that wait for a daemon's own account of
//! what it saw and decided (a positive signal) instead of sleeping and finding nothing.

use std::sync::Mutex;
use std::time::Duration;

static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Capture;

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        eprint!("{text}");
        let mut lines = LINES.lock().unwrap_or_else(|p| p.into_inner());
        lines.extend(text.lines().map(str::to_string));
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs the capturing subscriber (once per test binary; `RUST_LOG` filters what is shown,
/// `info` and up are always kept).
pub fn init() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(|| Capture)
        .try_init();
}

/// How many lines there are now: [`wait_line`] looks only at later ones.
pub fn mark() -> usize {
    LINES.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// The first line after `since` for which `pred` holds, waiting up to `limit`.
pub async fn wait_line(
    since: usize,
    limit: Duration,
    pred: impl Fn(&str) -> bool,
) -> Option<String> {
    super::wait_for(limit, || {
        let found = LINES.lock().unwrap_or_else(|p| p.into_inner())[since..]
            .iter()
            .find(|l| pred(l))
            .cloned();
        async move { found }
    })
    .await
}

/// Every line after `since` for which `pred` holds, as they are now.
pub fn lines(since: usize, pred: impl Fn(&str) -> bool) -> Vec<String> {
    LINES.lock().unwrap_or_else(|p| p.into_inner())[since..]
        .iter()
        .filter(|l| pred(l))
        .cloned()
        .collect()
}

/// When the daemon logged `line` (the subscriber's own timestamp, its first word).
pub fn time_of(line: &str) -> k8s_openapi::jiff::Timestamp {
    line.split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no timestamp in {line:?}"))
}
