//! The agent's OCI image as the tests and benchmarks get it: `image/build`.

use super::containerd::Secure;
use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("image/build")
}

/// `image/build build --out OUT EXTRA…`; the index digest it printed. Its progress (the
/// layer sizes) goes to this process's stderr.
pub fn build(out: &Path, extra: &[&str]) -> String {
    let r = Command::new(script())
        .args(["build", "--out"])
        .arg(out)
        .args(extra)
        .output()
        .expect("run image/build");
    let stderr = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "image/build: {stderr}");
    eprint!("{stderr}");
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}

/// `image/build push LAYOUT REFERENCE`: over TLS with the lab CA and credentials of `secure`,
/// or plain http without it. Returns (the digest it printed, its stderr).
pub fn push(layout: &Path, reference: &str, secure: Option<&Secure>) -> (String, String) {
    let mut cmd = Command::new(script());
    cmd.arg("push").arg(layout).arg(reference);
    match secure {
        Some(s) => cmd
            .arg("--ca")
            .arg(&s.lab_ca)
            .arg("--credentials")
            .arg(&s.credentials),
        None => cmd.arg("--plain-http"),
    };
    let r = cmd.output().expect("run image/build push");
    let stderr = String::from_utf8_lossy(&r.stderr).to_string();
    assert!(r.status.success(), "image/build push: {stderr}");
    (
        String::from_utf8_lossy(&r.stdout).trim().to_string(),
        stderr,
    )
}
