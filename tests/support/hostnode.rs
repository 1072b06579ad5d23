//! The host install at native speed: `flexnode join` in a booted nspawn container that shares
//! the host's network (so it reaches the lab's API server and artifact server on loopback),
//! then AgentUpgrades whose hand-off is read back from the container's journal.

use super::nspawn::Container;
use super::{Lab, wait_for};
use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// Its own start-up as that line reports it (`init_ms`, µs): the rest of exit → first
    /// line is systemd's (the fork, the unit's sandbox, the exec).
    pub init: u64,
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
    /// Each span of the upgrade in milliseconds, named as `benches/handoff.rs` reports it:
    /// the hand-off gap (old daemon exited → new daemon ready), claim → Complete without
    /// staging, staging, then the parts of the second one in order (the start also split
    /// into systemd's part and the daemon's own).
    pub fn spans(&self) -> [(&'static str, f64); 11] {
        let exec = self.starting.saturating_sub(self.init);
        [
            ("gap", ms(self.exited, self.ready)),
            ("after_staging", ms(self.staged, self.ready)),
            ("staging", ms(self.claim, self.staged)),
            ("switch", ms(self.staged, self.handing_off)),
            ("timer", ms(self.handing_off, self.stopping)),
            ("stop", ms(self.stopping, self.exited)),
            ("start", ms(self.exited, self.starting)),
            ("unit_start", ms(self.exited, exec)),
            ("init", ms(exec, self.starting)),
            ("judge", ms(self.starting, self.judged)),
            ("publish", ms(self.judged, self.ready)),
        ]
    }
}

impl HostNode {
    /// Boots `container`, copies `bin` in as the joining build, and joins it as `node` with
    /// the node's own credential.
    pub fn join(lab: &Lab, container: &str, node: &str, bin: &Path) -> Self {
        Self::join_with(lab, container, node, bin, &[])
    }

    /// The same, with more settings: each `(key, file name, contents)` a private file in the
    /// container's `/root` that the join config names under `key`.
    pub fn join_with(
        lab: &Lab,
        container: &str,
        node: &str,
        bin: &Path,
        files: &[(&str, &str, &[u8])],
    ) -> Self {
        let kubeconfig = lab.node_kubeconfig(node);
        let container = Container::up_host_network(container);
        let root = container.root().join("root");
        let exe = root.join("flexnode");
        std::fs::copy(bin, &exe).expect("copy the joining build in");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::copy(&kubeconfig, root.join("node.kubeconfig")).expect("copy the credential");
        let mut config = format!(
            "nodeName: {node}\nkubeconfig: /root/node.kubeconfig\n\
             kubernetesVersion: v1.34.2\ninstallMode: host\n"
        );
        for (key, name, contents) in files {
            let path = root.join(name);
            std::fs::write(&path, contents).expect("write a file the config names");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            config.push_str(&format!("{key}: /root/{name}\n"));
        }
        std::fs::write(root.join("join.yaml"), config).expect("write join.yaml");
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
        let since = format!("--since=@{}", since / 1_000_000);
        self.journal_entries(&["-u", "flexnode-agent", &since])
            .into_iter()
            .filter_map(|j| {
                Some(Line {
                    usec: j["__REALTIME_TIMESTAMP"].as_str()?.parse().ok()?,
                    message: j["MESSAGE"].as_str()?.to_string(),
                })
            })
            .collect()
    }

    /// The journal's entries that `args` select (`-u UNIT`, `FIELD=value`, as `journalctl`
    /// takes them), every field of each.
    pub fn journal_entries(&self, args: &[&str]) -> Vec<serde_json::Value> {
        let mut command = vec!["journalctl", "--no-pager", "-o", "json"];
        command.extend_from_slice(args);
        let out = self.container.exec(&command);
        assert!(
            out.status.success(),
            "journalctl: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
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
        let status = wait_for(Duration::from_secs(120), || async {
            let status = api.get(op).await.expect("read the AgentUpgrade").status?;
            status
                .phase
                .is_some_and(OperationPhase::is_terminal)
                .then_some(status)
        })
        .await
        .unwrap_or_else(|| panic!("{op} did not finish in 120 s\n{}", self.journal_text(since)));
        assert_eq!(
            status.phase,
            Some(OperationPhase::Complete),
            "{op}: {status:?}\n{}",
            self.journal_text(since)
        );
        // systemd logs `Started` just after the new daemon's READY=1, which follows the
        // publication seen above.
        wait_for(Duration::from_secs(20), || async {
            handoff(&self.journal(since), op)
        })
        .await
        .unwrap_or_else(|| {
            panic!(
                "{op}: the journal does not show the whole hand-off:\n{}",
                self.journal_text(since)
            )
        })
    }

    /// Restarts the agent unit and waits for it (`Type=notify`: until READY=1); returns
    /// systemd's `Starting` → `Started` in milliseconds, from the journal.
    pub async fn restart_agent(&self) -> f64 {
        let t0 = now_usec();
        // Its start limit (5 in 300 s) counts these restarts too; reset, as the agent's own
        // restart does (src/effects/systemd/jobs.rs).
        for verb in ["reset-failed", "restart"] {
            let out = self.container.exec(&["systemctl", verb, "flexnode-agent"]);
            assert!(
                out.status.success(),
                "systemctl {verb}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // journald may not have written systemd's last lines yet.
        wait_for(Duration::from_secs(20), || async {
            let lines = self.journal(t0.saturating_sub(2_000_000));
            let starting = first_where(&lines, t0, |m| {
                m.starts_with("Starting flexnode-agent.service")
            })?
            .usec;
            let started = first_where(&lines, starting, |m| {
                m.starts_with("Started flexnode-agent.service")
            })?
            .usec;
            Some(ms(starting, started))
        })
        .await
        .expect("the journal does not show the restart")
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

/// The first line at or after `from` whose message `pred` accepts.
fn first_where(lines: &[Line], from: u64, pred: impl Fn(&str) -> bool) -> Option<&Line> {
    lines.iter().find(|l| l.usec >= from && pred(&l.message))
}

/// The moments of `op`'s hand-off, each the first line after the one before it.
fn handoff(lines: &[Line], op: &str) -> Option<Handoff> {
    let claimed = format!("OperationClaimed(AgentUpgrade {op})");
    let claim = first_where(lines, 0, |m| {
        m.contains("transition") && m.contains(&claimed)
    })?;
    let staged = first_where(lines, claim.usec, |m| m.contains("to=Upgrading/Switching"))?.usec;
    let handing_off = first_where(lines, staged, |m| m.contains("to=Upgrading/HandingOff"))?.usec;
    let stopping = first_where(lines, handing_off, |m| {
        m.starts_with("Stopping flexnode-agent.service")
    })?
    .usec;
    let exited = first_where(lines, stopping, |m| {
        m.starts_with("flexnode-agent.service: Deactivated successfully")
    })?
    .usec;
    let starting = first_where(lines, exited, |m| m.contains("flexnode daemon starting"))?;
    let init_ms: f64 = starting
        .message
        .split(" init_ms=")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()?;
    let starting_usec = starting.usec;
    let judged = first_where(lines, starting_usec, |m| m.contains("input=DaemonStarted("))?;
    let ready = first_where(lines, judged.usec, |m| {
        m.starts_with("Started flexnode-agent.service")
    })?
    .usec;
    // `… agent=slot blue input=OperationClaimed(…)`, `… input=DaemonStarted(slot green) …`
    let between = |m: &str, open: &str, close: &str| {
        let rest = &m[m.find(open)? + open.len()..];
        Some(rest[..rest.find(close)?].to_string())
    };
    let from_build = between(&claim.message, "agent=", " input=")?;
    let to_build = between(&judged.message, "input=DaemonStarted(", ")")?;
    Some(Handoff {
        claim: claim.usec,
        staged,
        handing_off,
        stopping,
        exited,
        starting: starting_usec,
        init: (init_ms * 1000.0) as u64,
        judged: judged.usec,
        ready,
        from_build,
        to_build,
    })
}
