//! The host-install suite: `e2e/run host` brings up a fresh lab — the control plane on this
//! host, the artifact server on loopback, a Debian QEMU/TCG guest restored from the saved
//! booted VM — installs flexnode in the guest with `flexnode join` and runs the named checks
//! of `e2e/host/suite.py`, then tears the lab down.
//!
//! The output is streamed as it comes. The test passes only when every check the suite
//! defines (`suite.py --list`) printed `PASS`, the summary says so, and `e2e/run host` exited
//! 0: an inherited `SUITE_ARGS` is removed, so nothing can shrink the suite. A missing tier
//! fails the test; it is skipped only with `FLEXNODE_SKIP_HOST_SUITE=1`
//! (`tests/support/tier.rs`).

mod support;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use support::tier::{Tier, require};

fn forward(
    stream: impl std::io::Read + Send + 'static,
    keep: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            // Straight to the terminal (libtest captures only the print macros).
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{line}");
            let _ = err.flush();
            if let Ok(mut k) = keep.lock() {
                k.push(line);
            }
        }
    })
}

/// The checks the suite defines, in order.
fn defined_checks(repo: &Path) -> Vec<String> {
    let out = Command::new("python3")
        .arg(repo.join("e2e/host/suite.py"))
        .arg("--list")
        .output()
        .expect("run suite.py --list");
    assert!(out.status.success(), "suite.py --list failed");
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(names.len() >= 17, "the suite lists only {names:?}");
    names
}

/// The name of a `PASS name (12.3 s)` / `FAIL name (…): why` line.
fn check_name<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.strip_prefix(prefix)?.split(" (").next()
}

#[test]
#[cfg_attr(
    flexnode_skip = "host-suite",
    ignore = "SKIPPED host-suite: FLEXNODE_SKIP_HOST_SUITE=1"
)]
fn host_install_suite_passes_in_a_fresh_qemu_lab() {
    require(Tier::HostSuite);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let want = defined_checks(repo);
    let t = Instant::now();
    let mut child = Command::new(repo.join("e2e/run"))
        .arg("host")
        .current_dir(repo)
        // The binary cargo built for this test run: no nested cargo build.
        .env("FLEXNODE_BIN", env!("CARGO_BIN_EXE_flexnode"))
        .env_remove("SUITE_ARGS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start e2e/run host");
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let h1 = forward(child.stdout.take().expect("stdout"), out.clone());
    let h2 = forward(child.stderr.take().expect("stderr"), err.clone());
    let status = child.wait().expect("wait for e2e/run host");
    let _ = h1.join();
    let _ = h2.join();
    let lines = out.lock().expect("output").clone();
    let summary = lines
        .iter()
        .rev()
        .find(|l| l.contains(" passed, ") && l.contains(" failed"))
        .cloned()
        .unwrap_or_default();
    let passed: Vec<&str> = lines
        .iter()
        .filter_map(|l| check_name(l, "PASS "))
        .collect();
    let failed: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL ")).collect();
    eprintln!(
        "e2e/run host: {status} after {:.0} s: {summary}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        !summary.is_empty(),
        "the suite printed no summary line (the lab did not come up?); exit {status}"
    );
    assert!(
        failed.is_empty(),
        "host-install checks failed: {summary}\n{}",
        failed
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let passed_set: BTreeSet<&str> = passed.iter().copied().collect();
    let missing: Vec<&String> = want
        .iter()
        .filter(|n| !passed_set.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} checks did not pass: {missing:?} ({summary})",
        missing.len(),
        want.len()
    );
    assert_eq!(
        passed.len(),
        want.len(),
        "a check passed more than once: {passed:?}"
    );
    assert!(status.success(), "e2e/run host exited {status}: {summary}");
}
