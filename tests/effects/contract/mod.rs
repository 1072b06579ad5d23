//! The effects contract: what every implementation of the effects traits must do, written
//! once as generic functions over [`Systemd`](flexnode::effects::Systemd) and
//! [`Containerd`](flexnode::effects::Containerd), and run against the simulated host and the
//! real implementations (a booted systemd in an nspawn container, containerd 1.6 with a local
//! registry). A fixture supplies only what has to differ: how to make a unit whose process
//! fails, how to make a machine startable, how to get an image the registry serves.

#![allow(dead_code)]

/// Runs the named cases (generic fns taking the fixture) in order, each to its end, then fails
/// with every failing case.
macro_rules! run_cases {
    ($implementation:expr, $fx:expr, [$($case:ident),+ $(,)?]) => {{
        let mut cases = $crate::contract::Cases::new($implementation);
        $(cases.run(stringify!($case), $case($fx)).await;)+
        cases.finish();
    }};
}

pub mod containerd;
pub mod nspawn;
pub mod sim;
pub mod systemd;
pub mod tier;

use flexnode::effects::EffectError;
use flexnode::lifecycle::Timestamp;
use futures::FutureExt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock now, in the core's milliseconds.
pub fn now() -> Timestamp {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    Timestamp::from_millis(i64::try_from(d.as_millis()).expect("ms fit i64"))
}

/// The message of an `EffectError::Failed`; anything else fails the case.
pub fn failed_message<T: std::fmt::Debug>(what: &str, r: Result<T, EffectError>) -> String {
    match r {
        Err(EffectError::Failed(m)) => m,
        other => panic!("{what}: expected Failed, got {other:?}"),
    }
}

/// Asserts `t` lies between `before` (less a few ms of clock granularity) and now.
pub fn assert_about_now(what: &str, t: Timestamp, before: Timestamp) {
    let after = now();
    assert!(
        t.millis() >= before.millis() - 5 && t <= after,
        "{what}: {t:?} is not between {before:?} and {after:?}"
    );
}

/// Runs each case to the end even when an earlier one fails, then fails with every failure.
pub struct Cases {
    implementation: &'static str,
    failures: Vec<(&'static str, String)>,
    passed: Vec<(&'static str, Duration)>,
}

impl Cases {
    pub fn new(implementation: &'static str) -> Self {
        Self {
            implementation,
            failures: Vec::new(),
            passed: Vec::new(),
        }
    }

    pub async fn run(&mut self, name: &'static str, case: impl Future<Output = ()>) {
        let start = Instant::now();
        match AssertUnwindSafe(case).catch_unwind().await {
            Ok(()) => {
                eprintln!(
                    "[{}] ok   {name} ({} ms)",
                    self.implementation,
                    start.elapsed().as_millis()
                );
                self.passed.push((name, start.elapsed()));
            }
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "non-string panic".into());
                eprintln!("[{}] FAIL {name}: {msg}", self.implementation);
                self.failures.push((name, msg));
            }
        }
    }

    pub fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{}: {} of {} contract cases failed:\n{}",
            self.implementation,
            self.failures.len(),
            self.failures.len() + self.passed.len(),
            self.failures
                .iter()
                .map(|(n, m)| format!("  {n}: {m}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

pub use crate::support::wait_for;
