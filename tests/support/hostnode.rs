//! The host install at native speed: `flexnode join` in a booted nspawn container that shares
//! the host's network (so it reaches the lab's API server and artifact server on loopback),
//! then AgentUpgrades whose hand-off is read back from the container's journal.

use super::Lab;
use super::nspawn::Container;
use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A joined host install (no node images: its machine is the minimal tree, no kubelet).
pub struct HostNode {
    pub container: Container,
    pub node: String,
}

/// One line of the agent unit's journal: systemd's about the unit, or the daemon's own.
pub struct Line {
    pub usec: u64,
    pub message: String,
}

/// The moments of one AgentUpgrade, from the journal (µs since the epoch).
#[derive(Clone, Debug)]
pub struct Handoff {
    /// The old daemon's transition on the claim.
    pub claim: u64,
    /// Staging done (download, verify, unpack, the candidate's `version`): `Switching`.
    pub staged: u64,
    /// The link switched, the restart timer scheduled: `HandingOff`.
    pub handing_off: u64,
    /// The timer fired: systemd stops the old daemon.
    pub stopping: u64,
    /// The old daemon exited (`Deactivated successfully`).
    pub exited: u64,
    /// The new daemon's first line (configuration, TLS client, D-Bus, store opened).
    pub starting: u64,
    /// The new daemon's `DaemonStarted` transition: the judgement.
    pub judged: u64,
    /// `Started`: READY=1, sent after the result was published.
    pub ready: u64,
    /// The builds before and after (`slot blue`, `slot green`).
    pub from_build: String,
    pub to_build: String,
}

fn ms(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1000.0
}

impl Handoff {
    /// Old daemon exited → new daemon ready.
    pub fn gap_ms(&self) -> f64 {
        ms(self.exited, self.ready)
    }
    /// Claim → Complete without staging: switch, restart timer, stop, start, judge, publish.
    pub fn after_staging_ms(&self) -> f64 {
        ms(self.staged, self.ready)
    }
    pub fn staging_ms(&self) -> f64 {
        ms(self.claim, self.staged)
    }
    pub fn switch_ms(&self) -> f64 {
        ms(self.staged, self.handing_off)
    }
    pub fn timer_ms(&self) -> f64 {
        ms(self.handing_off, self.stopping)
    }
    pub fn stop_ms(&self) -> f64 {
        ms(self.stopping, self.exited)
    }
    pub fn start_ms(&self) -> f64 {
        ms(self.exited, self.starting)
    }
    pub fn judge_ms(&self) -> f64 {
        ms(self.starting, self.judged)
    }
    pub fn publish_ms(&self) -> f64 {
        ms(self.judged, self.ready)
    }
}

impl HostNode {
    /// Boots `container`, copies `bin` in as the joining build, and joins it as `node` with
    /// the node's own credential.
    pub fn join(lab: &Lab, container: &str, node: &str, bin: &Path) -> Self {
        let kubeconfig = lab.node_kubeconfig(node);
        let container = Container::up_host_network(container);
        let root = container.root().join("root");
        let exe = root.join("flexnode");
        std::fs::copy(bin, &exe).expect("copy the joining build in");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::copy(&kubeconfig, root.join("node.kubeconfig")).expect("copy the credential");
        std::fs::write(
            root.join("join.yaml"),
            format!(
                "nodeName: {node}\nkubeconfig: /root/node.kubeconfig\n\
                 kubernetesVersion: v1.34.2\ninstallMode: host\n"
            ),
        )
        .expect("write join.yaml");
        let out = container.exec(&["/root/flexnode", "join", "--config", "/root/join.yaml"]);
        assert!(
            out.status.success(),
            "join failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Self {
            container,
            node: node.to_string(),
        }
    }

    /// The agent unit's journal since `since` (µs since the epoch).
    pub fn journal(&self, since: u64) -> Vec<Line> {
        let since = format!("@{}", since / 1_000_000);
        let out = self.container.exec(&[
            "journalctl",
            "--no-pager",
            "-o",
            "json",
            "-u",
            "flexnode-agent",
            "--since",
            &since,
        ]);
        assert!(
            out.status.success(),
            "journalctl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|j| {
                Some(Line {
                    usec: j["__REALTIME_TIMESTAMP"].as_str()?.parse().ok()?,
                    message: j["MESSAGE"].as_str()?.to_string(),
                })
            })
            .collect()
    }

    /// An AgentUpgrade to the archive at `url`: created, awaited until `Complete/Succeeded`,
    /// and its moments read from the journal. Panics on any other outcome.
    pub async fn upgrade(&self, client: &Client, op: &str, url: &str, sha: &str) -> Handoff {
        let since = now_usec().saturating_sub(2_000_000);
        let api: Api<MachineOperation> = Api::all(client.clone());
        let spec = MachineOperationSpec {
            machine_ref: Some(self.node.clone()),
            operation_kind: OperationKind::AgentUpgrade,
            parameters: Some(BTreeMap::from([
                ("downloadURL".to_string(), url.to_string()),
                ("sha256".to_string(), sha.to_string()),
            ])),
            ..Default::default()
        };
        api.create(&PostParams::default(), &MachineOperation::new(op, spec))
            .await
            .expect("create the AgentUpgrade");
        let start = Instant::now();
        let status = loop {
            let got = api.get(op).await.expect("read the AgentUpgrade");
            let status = got.status.unwrap_or_default();
            if matches!(
                status.phase,
                Some(OperationPhase::Complete | OperationPhase::Failed)
            ) {
                break status;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{op} did not finish in 120 s: {status:?}\n{}",
                self.journal_text(since)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            status.phase,
            Some(OperationPhase::Complete),
            "{op}: {status:?}\n{}",
            self.journal_text(since)
        );
        // systemd logs `Started` just after the new daemon's READY=1, which follows the
        // publication the loop above saw.
        let start = Instant::now();
        loop {
            if let Some(h) = handoff(&self.journal(since), op) {
                return h;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{op}: the journal does not show the whole hand-off:\n{}",
                self.journal_text(since)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts the agent unit and waits for it (`Type=notify`: until READY=1); returns
    /// systemd's `Starting` → `Started` in milliseconds, from the journal.
    pub fn restart_agent(&self) -> f64 {
        let since = now_usec().saturating_sub(2_000_000);
        let t0 = now_usec();
        // Its start limit (5 in 300 s) counts these restarts too; reset, as the agent's own
        // restart does (src/effects/systemd/jobs.rs).
        self.container
            .exec(&["systemctl", "reset-failed", "flexnode-agent"]);
        let out = self
            .container
            .exec(&["systemctl", "restart", "flexnode-agent"]);
        assert!(
            out.status.success(),
            "systemctl restart: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // journald may not have written systemd's last lines yet.
        let start = Instant::now();
        loop {
            let lines = self.journal(since);
            let first = |from: u64, prefix: &str| {
                lines
                    .iter()
                    .find(|l| l.usec >= from && l.message.starts_with(prefix))
                    .map(|l| l.usec)
            };
            if let Some(starting) = first(t0, "Starting flexnode-agent.service")
                && let Some(started) = first(starting, "Started flexnode-agent.service")
            {
                return ms(starting, started);
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the journal does not show the restart"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The running agent's `/proc/PID` as the host reaches it (the container's procfs).
    pub fn agent_proc(&self) -> std::path::PathBuf {
        let out = self
            .container
            .exec(&["systemctl", "show", "-P", "MainPID", "flexnode-agent"]);
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            pid.parse::<u32>().is_ok_and(|p| p > 0),
            "no agent process: MainPID {pid:?}"
        );
        self.container.root().join("proc").join(pid)
    }

    fn journal_text(&self, since: u64) -> String {
        self.journal(since)
            .into_iter()
            .map(|l| l.message)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn now_usec() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or_default()
}

/// The moments of `op`'s hand-off, each the first line after the one before it.
fn handoff(lines: &[Line], op: &str) -> Option<Handoff> {
    let after = |from: u64, pred: &dyn Fn(&str) -> bool| {
        lines
            .iter()
            .find(|l| l.usec >= from && pred(&l.message))
            .map(|l| (l.usec, l.message.as_str()))
    };
    let claimed = format!("OperationClaimed(AgentUpgrade {op})");
    let (claim, claim_line) = after(0, &|m| m.contains("transition") && m.contains(&claimed))?;
    let (staged, _) = after(claim, &|m| m.contains("to=Upgrading/Switching"))?;
    let (handing_off, _) = after(staged, &|m| m.contains("to=Upgrading/HandingOff"))?;
    let (stopping, _) = after(handing_off, &|m| {
        m.starts_with("Stopping flexnode-agent.service")
    })?;
    let (exited, _) = after(stopping, &|m| {
        m.starts_with("flexnode-agent.service: Deactivated successfully")
    })?;
    let (starting, _) = after(exited, &|m| m.contains("flexnode daemon starting"))?;
    let (judged, judged_line) = after(starting, &|m| m.contains("input=DaemonStarted("))?;
    let (ready, _) = after(judged, &|m| m.starts_with("Started flexnode-agent.service"))?;
    // `… agent=slot blue input=OperationClaimed(…)`, `… input=DaemonStarted(slot green) …`
    let between = |m: &str, open: &str, close: &str| {
        let rest = &m[m.find(open)? + open.len()..];
        Some(rest[..rest.find(close)?].to_string())
    };
    let from_build = between(claim_line, "agent=", " input=")?;
    let to_build = between(judged_line, "input=DaemonStarted(", ")")?;
    Some(Handoff {
        claim,
        staged,
        handing_off,
        stopping,
        exited,
        starting,
        judged,
        ready,
        from_build,
        to_build,
    })
}
