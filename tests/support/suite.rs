//! Runs a lab's named-check suite (`e2e/run host`, `e2e/container/run suite`, …) and holds it
//! to its own list: the test passes only when every check the suite places in the lab's tier
//! (`--list --tier`) printed
//! `PASS`, the summary says so, and the script exited 0. An inherited `SUITE_ARGS` is removed,
//! so nothing can shrink the suite. The output is streamed as it comes, each line prefixed
//! with the suite's tag: the two install suites run side by side (`tests/labs/install_suites.rs`).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

fn forward(
    stream: impl std::io::Read + Send + 'static,
    tag: &'static str,
    keep: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            // Straight to the terminal (libtest captures only the print macros).
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "[{tag}] {line}");
            let _ = err.flush();
            if let Ok(mut k) = keep.lock() {
                k.push(line);
            }
        }
    })
}

/// The checks the suite places in `tier`, in order.
fn defined_checks(repo: &Path, suite: &str, tier: &str, at_least: usize) -> Vec<String> {
    let out = Command::new("python3")
        .arg(repo.join(suite))
        .args(["--list", "--tier", tier])
        .output()
        .expect("run suite.py --list");
    assert!(out.status.success(), "{suite} --list --tier {tier} failed");
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(names.len() >= at_least, "{suite} lists only {names:?}");
    names
}

/// The watch recorder the Python suites read (examples/watch-recorder.rs), which a whole
/// `cargo test` builds beside the binaries; e2e/lib.sh `recorder_bin` builds it otherwise.
fn recorder() -> Option<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_BIN_EXE_flexnode")).parent()?;
    Some(dir.join("examples/watch-recorder")).filter(|p| p.is_file())
}

/// The name of a `PASS name (12.3 s)` / `FAIL name (…): why` line.
fn check_name<'a>(line: &'a str, prefix: &str) -> Option<&'a str> {
    line.strip_prefix(prefix)?.split(" (").next()
}

/// Runs `script` (relative to the repository) with `args`; `suite` is the suite it runs,
/// which must place at least `at_least` checks in `tier` (e2e/host/lab.py: qemu or native);
/// `tag` prefixes its output lines.
pub fn passes(
    tag: &'static str,
    script: &str,
    args: &[&str],
    (suite, tier): (&str, &str),
    at_least: usize,
) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let want = defined_checks(repo, suite, tier, at_least);
    let t = Instant::now();
    let mut child = Command::new(repo.join(script))
        .args(args)
        .current_dir(repo)
        // The binaries cargo built for this test run: no nested cargo build.
        .env("FLEXNODE_BIN", env!("CARGO_BIN_EXE_flexnode"))
        .envs(recorder().map(|r| ("RECORDER_BIN", r)))
        .env_remove("SUITE_ARGS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {script}: {e}"));
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let h1 = forward(child.stdout.take().expect("stdout"), tag, out.clone());
    let h2 = forward(child.stderr.take().expect("stderr"), tag, err.clone());
    let status = child
        .wait()
        .unwrap_or_else(|e| panic!("wait for {script}: {e}"));
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
        "{script}: {status} after {:.0} s: {summary}",
        t.elapsed().as_secs_f64()
    );
    assert!(
        !summary.is_empty(),
        "the suite printed no summary line (the lab did not come up?); exit {status}"
    );
    assert!(
        failed.is_empty(),
        "{suite}: checks failed: {summary}\n{}",
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
    assert!(status.success(), "{script} exited {status}: {summary}");
}
