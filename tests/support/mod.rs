//! Shared by the tests that need a real control plane.
#![allow(dead_code)]

pub mod account;
pub mod agent;
pub mod artifacts;
pub mod cli;
pub mod containerd;
pub mod history;
pub mod hostnode;
pub mod image;
pub mod logs;
pub mod lossy;
pub mod nspawn;
pub mod proc;
pub mod recording;
pub mod sandbox;
pub mod suite;
pub mod tier;
pub mod tmpfs;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The step a test is at, for [`Lab::watchdog`] to tell.
#[derive(Clone, Default)]
pub struct Steps(std::sync::Arc<std::sync::Mutex<String>>);

impl Steps {
    pub fn at(&self, step: &str) {
        if let Ok(mut s) = self.0.lock() {
            *s = step.to_string();
        }
    }
}

/// A control plane of our own (e2e/controlplane/run), stopped when dropped.
pub struct Lab {
    pub dir: PathBuf,
    /// The private directory `dir` lives in (removed after `down`).
    _parent: tempfile::TempDir,
}

/// True in a process of the test binary that runs only `test` (the crate path without the
/// crate, e.g. `status_model::one_operation_shows_in_every_rendering`) with `env` set;
/// elsewhere it runs that process, asserts the test passed in it, and returns false. For a
/// test that reads process-wide state the crate's other tests also write (the daemon's
/// metrics registry, src/metrics.rs, counts every daemon of the process), or that needs an
/// environment of its own (no system CA certificates).
pub fn in_own_process(test: &str, env: &[(&str, &str)]) -> bool {
    const CHILD: &str = "FLEXNODE_TEST_OWN_PROCESS";
    if std::env::var_os(CHILD).is_some() {
        return true;
    }
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--exact", test, "--test-threads=1", "--nocapture"])
        .env(CHILD, "1")
        .envs(env.iter().copied())
        .output()
        .expect("run the test in a process of its own");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test}, in a process of its own:\n{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    false
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/controlplane/run")
}

impl Lab {
    /// Fails the test when the control plane is not built (`tier::require`).
    pub fn up() -> Self {
        Self::start(&["--no-kcm"])
    }

    /// With kube-controller-manager (CSR approval and signing, bootstrap tokens) and
    /// kube-scheduler.
    pub fn up_with_controllers() -> Self {
        Self::start(&[])
    }

    /// Without controllers, logging every request of group `flexnode:agents` (metadata
    /// only) to `dir/logs/audit.log`.
    pub fn up_audited() -> Self {
        Self::start(&["--no-kcm", "--audit-agents"])
    }

    /// Without controllers, with the lab's identity provider and the API server's JWT
    /// authenticator for it (`up --issuer`: state ISSUER_URL, ISSUER_METADATA_URL).
    pub fn up_with_issuer() -> Self {
        Self::start(&["--no-kcm", "--issuer"])
    }

    /// With kube-controller-manager (signing) and the agents' requests audited.
    pub fn up_audited_with_controllers() -> Self {
        Self::start(&["--audit-agents"])
    }

    /// The response codes of `user`'s completed requests after byte `from` of the audit log:
    /// code → count.
    pub fn audited_codes(&self, user: &str, from: u64) -> std::collections::BTreeMap<i64, u64> {
        let mut by = std::collections::BTreeMap::new();
        for event in self.audit_events(from) {
            if event["user"]["username"] == user && event["stage"] == "ResponseComplete" {
                let code = event["responseStatus"]["code"].as_i64().unwrap_or(0);
                *by.entry(code).or_insert(0) += 1;
            }
        }
        by
    }

    fn start(flags: &[&str]) -> Self {
        tier::require(tier::Tier::ControlPlane);
        // A fresh private directory (0700, unpredictable name); the script creates `cp` in it.
        let parent = tempfile::Builder::new()
            .prefix("flexnode-lab-")
            .tempdir()
            .expect("lab parent dir");
        let dir = parent.path().join("cp");
        let out = Command::new(script())
            .arg("up")
            .args(flags)
            .arg("--dir")
            .arg(&dir)
            .output()
            .expect("run e2e/controlplane/run up");
        assert!(
            out.status.success(),
            "control plane did not come up:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            dir,
            _parent: parent,
        }
    }

    /// The API server and etcd stop (`e2e/controlplane/run stop`): etcd's data is kept.
    pub fn stop_apiserver(&self) {
        self.script(&["stop"]);
    }

    /// They start again on the same ports (`start`); `wipe`: on an empty etcd, the CRDs
    /// applied again as `up` applies them (the agents' RBAC is the test's to apply again).
    /// Returns once the API server is ready, with the moment its `/readyz` first answered.
    pub fn start_apiserver(&self, wipe: bool) -> std::time::SystemTime {
        let out = self.script(if wipe {
            &["start", "--wipe"]
        } else {
            &["start"]
        });
        let ms: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("ready_ms="))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no ready_ms= in the output of start: {out}"));
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms)
    }

    fn script(&self, args: &[&str]) -> String {
        let out = Command::new(script())
            .args(args)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .expect("run e2e/controlplane/run");
        assert!(
            out.status.success(),
            "e2e/controlplane/run {args:?} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Ends the test process if the test still runs after `limit`, naming the step it was
    /// at and taking the control plane down first: a hang (a daemon task that died, a wait
    /// without end) fails the run in minutes instead of using up CI's time, as a cargo test has
    /// no time limit of its own.
    pub fn watchdog(&self, limit: std::time::Duration) -> Steps {
        let steps = Steps::default();
        let at = steps.clone();
        let dir = self.dir.clone();
        std::thread::spawn(move || {
            std::thread::sleep(limit);
            let step = at.0.lock().map(|s| s.clone()).unwrap_or_default();
            // Straight to stderr: libtest's capture (which `eprintln!` goes to) dies with us.
            let _ = writeln!(
                std::io::stderr(),
                "watchdog: the test still runs after {} s, at: {step}; taking its control plane down and exiting",
                limit.as_secs()
            );
            let _ = Command::new(script())
                .arg("down")
                .arg("--dir")
                .arg(&dir)
                .status();
            std::process::exit(101);
        });
        steps
    }

    /// The admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    fn audit_log(&self) -> PathBuf {
        self.dir.join("logs/audit.log")
    }

    /// The audit log's events after byte `from`.
    fn audit_events(&self, from: u64) -> Vec<serde_json::Value> {
        let text = std::fs::read(self.audit_log()).expect("the audit log (Lab::up_audited)");
        String::from_utf8_lossy(&text[from as usize..])
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The audit log's length (`up_audited`): where a window of [`Lab::audited`] starts.
    pub fn audit_len(&self) -> u64 {
        std::fs::metadata(self.audit_log()).map_or(0, |m| m.len())
    }

    /// Requests of `user` logged after byte `from` of the audit log, by `verb resource`: a
    /// watch counts when it starts, anything else when it completes.
    pub fn audited(&self, user: &str, from: u64) -> std::collections::BTreeMap<String, u64> {
        let mut by = std::collections::BTreeMap::new();
        for event in self.audit_events(from) {
            let verb = event["verb"].as_str().unwrap_or_default();
            let counted = if verb == "watch" {
                "ResponseStarted"
            } else {
                "ResponseComplete"
            };
            if event["user"]["username"] != user || event["stage"] != counted {
                continue;
            }
            let resource = event["objectRef"]["resource"].as_str().unwrap_or("-");
            *by.entry(format!("{verb} {resource}")).or_insert(0) += 1;
        }
        by
    }

    /// A client certificate for `system:flexnode:<node>` in group `flexnode:agents`.
    pub fn node_kubeconfig(&self, node: &str) -> PathBuf {
        self.node_kubeconfigs(&[node]).remove(0)
    }

    /// One such certificate for each of `nodes` (one run of the script).
    pub fn node_kubeconfigs(&self, nodes: &[&str]) -> Vec<PathBuf> {
        let out = Command::new(script())
            .arg("node-cert")
            .args(nodes)
            .arg("--dir")
            .arg(&self.dir)
            .output()
            .expect("node-cert");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        nodes
            .iter()
            .map(|n| self.dir.join(format!("nodes/{n}.kubeconfig")))
            .collect()
    }

    /// A value of the lab's `state` file (`KEY=value` lines).
    pub fn state(&self, key: &str) -> String {
        let state = std::fs::read_to_string(self.dir.join("state")).expect("read the lab's state");
        let prefix = format!("{key}=");
        state
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("{key}= in the lab's state"))
            .to_string()
    }

    /// The directory of the lab's Kubernetes binaries.
    pub fn bin(&self) -> PathBuf {
        PathBuf::from(self.state("BIN"))
    }

    /// The lab's kubectl with the admin kubeconfig: (success, stdout + stderr).
    pub fn kubectl(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(script())
            .args(["kubectl", "--dir"])
            .arg(&self.dir)
            .arg("--")
            .args(args)
            .output()
            .expect("kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["down", "--dir"])
            .arg(&self.dir)
            .status();
    }
}

/// Polls `f` every 20 ms until it yields a value or `limit` passes.
pub async fn wait_for<T, F, Fut>(limit: std::time::Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
