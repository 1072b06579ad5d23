//! The security review on a real host install (docs/reliability.md, "Security review"): a host
//! install joined in a booted nspawn container (real systemd 252, support/hostnode.rs) against
//! a real kube-apiserver, with secrets planted where an operator or the cluster puts them — the
//! node's private key (its kubeconfig), a registry password (`registryCredentialsFile`), a SAS
//! token in an AgentUpgrade's URL query and a password in one's userinfo. While it runs three
//! upgrades, every process in the container is sampled; then nothing planted may be
//! in any process's command line or environment, in the journal, in `flexnode status` or
//! `history`, in an operation's status or in an Event. The candidate check's own view of its
//! process (a candidate that records it), the modes of everything the agent wrote, and the
//! sandbox of the installed units (`systemd-analyze security`, the running daemon's status)
//! are checked on the same install.

use crate::support;

use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use flexnode_test_tier::tier;
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support::agent::{admin, apply_rbac};
use support::artifacts::{Served, pack};
use support::hostnode::HostNode;
use support::sandbox::{host_capability_mask, recorded, status_field};
use support::{Lab, wait_for};

/// Where the recording candidate writes what it saw (a path the sandbox lets it write).
const PROBE: &str = "var/lib/flexnode/probe";

/// A candidate whose `version` records its own command line, environment, privileges and
/// umask, then fails (so its upgrade ends `ExecutionFailed` before anything switches).
const RECORDING_CANDIDATE: &str = "#!/bin/sh\n\
    out=/var/lib/flexnode/probe\n\
    { tr '\\0' '\\n' < /proc/$$/cmdline; echo ---; tr '\\0' '\\n' < /proc/$$/environ; echo ---;\n\
      grep -E '^(NoNewPrivs|Seccomp|CapBnd|Umask):' /proc/$$/status; } > $out\n\
    exit 3\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(nspawn, controlplane)]
async fn a_host_install_keeps_its_secrets_modes_and_sandbox() {
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    let bin = Path::new(env!("CARGO_BIN_EXE_flexnode"));
    let served = tempfile::tempdir().expect("a directory to serve");
    let (good, good_sha) = pack(served.path(), "agent", bin);
    let recording = served.path().join("recording.sh");
    std::fs::write(&recording, RECORDING_CANDIDATE).expect("write the recording candidate");
    let (rec, rec_sha) = pack(served.path(), "recording", &recording);
    let server = Served::dir(served.path());

    let token = unique("sas");
    let password = unique("pw");
    let registry_password = unique("reg");
    let credentials = format!(
        r#"{{"auths": {{"registry.invalid": {{"username": "puller", "password": "{registry_password}"}}}}}}"#
    );
    let node_name = "secrets-1";
    let container = format!("fxsec-{}", std::process::id());
    let node = HostNode::join_with(
        &lab,
        &container,
        node_name,
        bin,
        &[(
            "registryCredentialsFile",
            "registry.json",
            credentials.as_bytes(),
        )],
    );
    // The node's key as the join installed it.
    let (key_stored, key_pem) =
        private_key_excerpts(&node.container.root().join("etc/flexnode/kubeconfig"));
    let sampler = Sampler::start(&node);

    // 1. The recording candidate, from a URL whose query carries the token.
    let op = create_upgrade(
        &client,
        node_name,
        "sec-record",
        &format!("{}?sig={token}", server.url(&rec)),
        &rec_sha,
    )
    .await;
    assert_eq!(
        terminal(&client, &op).await,
        (OperationPhase::Failed, "ExecutionFailed".to_string())
    );
    // 2. A password in the URL: refused before anything runs.
    let url = server
        .url(&good)
        .replace("http://", &format!("http://puller:{password}@"));
    let op = create_upgrade(&client, node_name, "sec-userinfo", &url, &good_sha).await;
    assert_eq!(
        terminal(&client, &op).await,
        (OperationPhase::Failed, "InvalidParameters".to_string())
    );
    // 3. A good upgrade with the token: downloaded, handed off to the new daemon, judged.
    let handoff = node
        .upgrade(
            &client,
            "sec-upgrade",
            &format!("{}?sig={token}", server.url(&good)),
            &good_sha,
        )
        .await;
    assert_ne!(handoff.from_build, handoff.to_build, "{handoff:?}");
    let processes = sampler.stop();

    let root = node.container.root();
    let secrets = [
        ("the URL's query token", token.as_str()),
        ("the URL's password", password.as_str()),
        ("the registry password", registry_password.as_str()),
        (
            "the node's private key (base64 as stored)",
            key_stored.as_str(),
        ),
        ("the node's private key (its PEM)", key_pem.as_str()),
    ];

    // The candidate check, as the candidate saw it: no shell, only PATH, the sandbox's
    // privileges and umask.
    let probe = std::fs::read_to_string(root.join(PROBE)).expect("the candidate's record");
    let parts: Vec<&str> = probe.split("---\n").collect();
    let argv: Vec<&str> = parts[0].lines().collect();
    assert_eq!(argv.len(), 3, "{probe}");
    assert_eq!(
        argv[0], "/bin/sh",
        "the script's interpreter, nothing else: {probe}"
    );
    assert!(
        argv[1].starts_with("/opt/flexnode/lib/flexnode-") && argv[1].ends_with("/flexnode"),
        "{probe}"
    );
    assert_eq!(argv[2], "version", "{probe}");
    assert_eq!(
        parts[1].lines().collect::<Vec<_>>(),
        [format!("PATH={}", flexnode::effects::host::CHECK_PATH)],
        "the candidate's environment: {probe}"
    );
    let manager = manager_bounding_set(&root);
    assert_sandboxed(parts[2], manager, "the candidate check");
    assert_eq!(status_field(parts[2], "Umask"), Some("0077"), "{probe}");
    std::fs::remove_file(root.join(PROBE)).expect("remove the record");

    // Nothing planted in any process the container ran.
    let agent_seen = processes
        .iter()
        .filter(|p| p.cmdline.contains("flexnode daemon --config"))
        .count();
    assert!(
        agent_seen >= 2,
        "the sampler saw {agent_seen} agent daemons (before and after the hand-off) among {} \
         processes",
        processes.len()
    );
    for p in &processes {
        for (what, secret) in secrets {
            assert!(
                !p.cmdline.contains(secret) && !p.environ.contains(secret),
                "{what} in process {}: {} / {}",
                p.pid,
                p.cmdline,
                p.environ
            );
        }
    }
    eprintln!(
        "sampled {} processes of the container, {agent_seen} of them agent daemons",
        processes.len()
    );

    // Nor in the journal, the store's account, the operations or their Events.
    let journal = node
        .container
        .exec(&["journalctl", "--no-pager", "-o", "json", "-b"]);
    let flexnode = |args: &[&str]| {
        let mut cmd = vec!["/opt/flexnode/bin/flexnode"];
        cmd.extend(args);
        let out = node.container.exec(&cmd);
        assert!(out.status.success(), "flexnode {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let accounts = [
        (
            "the journal",
            String::from_utf8_lossy(&journal.stdout).to_string(),
        ),
        ("flexnode status", flexnode(&["status", "-o", "json"])),
        (
            "flexnode history",
            flexnode(&["history", "-o", "json", "--limit", "1000"]),
        ),
        ("the operations' status", operations_text(&client).await),
        ("the Events", events_text(&client).await),
    ];
    for (account, text) in &accounts {
        assert!(text.len() > 100, "{account} is nearly empty: {text}");
        for (what, secret) in secrets {
            assert!(!text.contains(secret), "{what} in {account}");
        }
    }
    assert!(
        accounts[0].1.contains("sec-record"),
        "the journal does not mention the operations at all"
    );

    check_modes(&root);
    check_sandbox(&node, &root);
}

/// Each sampled process: its PID, command line and environment (NUL as space).
struct Process {
    pid: u32,
    cmdline: String,
    environ: String,
}

/// Every process of the container (by its PID namespace), read from the host's `/proc` every
/// few milliseconds until stopped: long-lived ones for sure, short-lived ones when caught
/// (the candidate check reports itself, above).
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Process>>,
}

impl Sampler {
    fn start(node: &HostNode) -> Self {
        let leader = node.container.run(&["leader", &node.container.name]);
        let ns = std::fs::read_link(format!("/proc/{leader}/ns/pid")).expect("the container's ns");
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen: BTreeMap<(u32, String, String), ()> = BTreeMap::new();
            while !flag.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                    let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                        continue;
                    };
                    let dir = entry.path();
                    if std::fs::read_link(dir.join("ns/pid")).ok().as_ref() != Some(&ns) {
                        continue;
                    }
                    let read = |f: &str| {
                        std::fs::read(dir.join(f))
                            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                            .unwrap_or_default()
                    };
                    let (cmdline, environ) = (read("cmdline"), read("environ"));
                    seen.insert((pid, cmdline, environ), ());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            seen.into_keys()
                .map(|(pid, cmdline, environ)| Process {
                    pid,
                    cmdline,
                    environ,
                })
                .collect()
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<Process> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the sampler")
    }
}

/// A random-enough marker no code could print by chance.
fn unique(prefix: &str) -> String {
    let mut bytes = [0u8; 12];
    getrandom::fill(&mut bytes).expect("random");
    format!("{prefix}-{}", hex::encode(bytes))
}

/// 40 characters from the middle of the kubeconfig's client key as it is stored (base64 of
/// the PEM), and 40 from the middle of the PEM's body: a key leaked as PEM contains only the
/// second.
fn private_key_excerpts(kubeconfig: &Path) -> (String, String) {
    use base64::Engine as _;
    let text = std::fs::read_to_string(kubeconfig).expect("the node's kubeconfig");
    let data = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("client-key-data:"))
        .expect("a client-key-data in the node's kubeconfig")
        .trim();
    assert!(data.len() > 200, "a short key: {}", data.len());
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .expect("client-key-data is base64");
    let body: String = String::from_utf8(pem)
        .expect("a PEM")
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(body.len() > 140, "a short PEM body: {}", body.len());
    (data[100..140].to_string(), body[100..140].to_string())
}

async fn create_upgrade(client: &Client, node: &str, name: &str, url: &str, sha: &str) -> String {
    let api: Api<MachineOperation> = Api::all(client.clone());
    let spec = MachineOperationSpec {
        machine_ref: Some(node.to_string()),
        operation_kind: OperationKind::AgentUpgrade,
        parameters: Some(BTreeMap::from([
            ("downloadURL".to_string(), url.to_string()),
            ("sha256".to_string(), sha.to_string()),
        ])),
        ..Default::default()
    };
    api.create(&PostParams::default(), &MachineOperation::new(name, spec))
        .await
        .expect("create the AgentUpgrade");
    name.to_string()
}

/// The operation's terminal phase and reason.
async fn terminal(client: &Client, name: &str) -> (OperationPhase, String) {
    let api: Api<MachineOperation> = Api::all(client.clone());
    wait_for(Duration::from_secs(120), || async {
        let status = api.get(name).await.expect("read the operation").status?;
        let phase = status.phase?;
        phase.is_terminal().then(|| {
            let reason = status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Completed")
                .map(|c| c.reason.clone())
                .unwrap_or_default();
            (phase, reason)
        })
    })
    .await
    .unwrap_or_else(|| panic!("{name} did not finish in 120 s"))
}

/// What the agent wrote of the operations: their status (their spec is the test's, with the
/// URLs it planted).
async fn operations_text(client: &Client) -> String {
    let api: Api<MachineOperation> = Api::all(client.clone());
    let list = api
        .list(&Default::default())
        .await
        .expect("list operations");
    let statuses: Vec<_> = list.items.iter().map(|op| &op.status).collect();
    serde_json::to_string(&statuses).expect("json")
}

async fn events_text(client: &Client) -> String {
    let api: Api<Event> = Api::all(client.clone());
    // The last operation's Events may still be on their way: wait for its result's.
    let list = wait_for(Duration::from_secs(20), || async {
        let list = api.list(&Default::default()).await.expect("list events");
        list.items
            .iter()
            .any(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("sec-upgrade")
                    && e.reason.as_deref() == Some("Succeeded")
            })
            .then_some(list)
    })
    .await
    .expect("the upgrade's Succeeded Event");
    serde_json::to_string(&list.items).expect("json")
}

/// `status` (of `/proc/PID/status`) shows the host units' sandbox: no new privileges, a
/// seccomp filter, the recorded capability bounding set within `manager`'s (systemd-nspawn
/// keeps `CAP_SYS_MODULE` from the container).
fn assert_sandboxed(status: &str, manager: u64, who: &str) {
    assert_eq!(
        status_field(status, "NoNewPrivs"),
        Some("1"),
        "{who}: {status}"
    );
    assert_eq!(
        status_field(status, "Seccomp"),
        Some("2"),
        "{who}: {status}"
    );
    let bounding = status_field(status, "CapBnd")
        .and_then(|m| u64::from_str_radix(m, 16).ok())
        .unwrap_or_else(|| panic!("{who}: no CapBnd in {status}"));
    assert_eq!(
        bounding,
        host_capability_mask() & manager,
        "{who}: capability bounding set {bounding:#x}"
    );
}

/// The capability bounding set of the container's systemd, which every unit's is within.
fn manager_bounding_set(root: &Path) -> u64 {
    let status = std::fs::read_to_string(root.join("proc/1/status")).expect("PID 1's status");
    status_field(&status, "CapBnd")
        .and_then(|m| u64::from_str_radix(m, 16).ok())
        .expect("PID 1's CapBnd")
}

/// The modes of everything the agent wrote: secrets 0600 in 0700 directories, nothing group-
/// or world-writable, everything root's.
fn check_modes(root: &Path) {
    let meta = |rel: &str| {
        std::fs::symlink_metadata(root.join(rel)).unwrap_or_else(|e| panic!("/{rel}: {e}"))
    };
    let mode = |rel: &str| meta(rel).mode() & 0o7777;
    for (dir, expected) in [
        ("etc/flexnode", 0o700),
        ("var/lib/flexnode", 0o700),
        ("var/lib/machines", 0o700),
        ("opt/flexnode", 0o755),
    ] {
        assert_eq!(mode(dir), expected, "/{dir}: {:o}", mode(dir));
    }
    for entry in std::fs::read_dir(root.join("etc/flexnode")).expect("list /etc/flexnode") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        let expected = if name == "README.md" { 0o644 } else { 0o600 };
        let rel = format!("etc/flexnode/{name}");
        assert!(meta(&rel).is_file(), "/{rel} is not a regular file");
        assert_eq!(mode(&rel), expected, "/{rel}: {:o}", mode(&rel));
    }
    for name in [
        "kubeconfig",
        "config.yaml",
        "registry-credentials.json",
        "README.md",
    ] {
        assert!(
            root.join("etc/flexnode").join(name).is_file(),
            "no /etc/flexnode/{name}"
        );
    }
    for entry in std::fs::read_dir(root.join("var/lib/flexnode")).expect("list") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        let rel = format!("var/lib/flexnode/{name}");
        assert_eq!(mode(&rel) & 0o077, 0, "/{rel}: {:o}", mode(&rel));
    }
    let mut walked = 0;
    let mut paths: Vec<PathBuf> = [
        "opt/flexnode",
        "etc/flexnode",
        "var/lib/flexnode",
        "etc/systemd/nspawn",
        "etc/modules-load.d/flexnode.conf",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    for entry in std::fs::read_dir(root.join("etc/systemd/system")).expect("list units") {
        let path = entry.expect("entry").path();
        if path
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("flexnode-"))
        {
            assert_eq!(
                std::fs::symlink_metadata(&path).expect("unit").mode() & 0o7777,
                0o644,
                "{}",
                path.display()
            );
            paths.push(path);
        }
    }
    while let Some(path) = paths.pop() {
        let Ok(m) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        walked += 1;
        let shown = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        assert_eq!((m.uid(), m.gid()), (0, 0), "/{shown} is not root's");
        if !m.file_type().is_symlink() {
            assert_eq!(
                m.mode() & 0o022,
                0,
                "/{shown} is writable by others: {:o}",
                m.mode()
            );
            assert_eq!(m.mode() & 0o6000, 0, "/{shown} is set-id: {:o}", m.mode());
        }
        if m.is_dir() {
            paths.extend(
                std::fs::read_dir(&path)
                    .expect("list")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    assert!(walked > 15, "walked only {walked} entries");
}

/// The installed units as systemd loaded them: no more exposed than recorded, documented by a
/// file that exists; the running daemon inside its sandbox.
fn check_sandbox(node: &HostNode, root: &Path) {
    for (mode, unit, _) in support::sandbox::EXPOSURE {
        if *mode != "host" {
            continue;
        }
        let out = node
            .container
            .exec(&["systemd-analyze", "security", "--no-pager", unit]);
        let text = String::from_utf8_lossy(&out.stdout);
        let exposure = support::sandbox::overall(&text);
        eprintln!("{unit} (booted, systemd 252): exposure {exposure}");
        assert!(
            exposure <= recorded(mode, unit),
            "{unit} is more exposed ({exposure}) than recorded:\n{text}"
        );
        let out = node
            .container
            .exec(&["systemctl", "show", "-P", "Documentation", unit]);
        let docs = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let path = docs
            .strip_prefix("file://")
            .unwrap_or_else(|| panic!("{unit}: Documentation={docs}"));
        assert_eq!(path, flexnode::units::DOC_PATH, "{unit}");
        assert_eq!(
            std::fs::read_to_string(root.join(path.trim_start_matches('/')))
                .unwrap_or_else(|e| panic!("{unit}: {path}: {e}")),
            flexnode::units::DOC,
            "{unit}: {path}"
        );
    }
    let proc = node.agent_proc();
    let status = std::fs::read_to_string(proc.join("status")).expect("the daemon's status");
    assert_sandboxed(&status, manager_bounding_set(root), "the daemon");
    // Read-only but for what it writes.
    let mounts = std::fs::read_to_string(proc.join("mountinfo")).expect("mountinfo");
    let options = |point: &str| {
        mounts
            .lines()
            .rfind(|l| l.split_whitespace().nth(4) == Some(point))
            .and_then(|l| l.split_whitespace().nth(5))
            .map(|o| o.split(',').next().unwrap_or_default().to_string())
    };
    for (point, expected) in [
        ("/", "ro"),
        ("/etc", "rw"),
        ("/var/lib/flexnode", "rw"),
        ("/opt/flexnode", "rw"),
        ("/var/lib/machines", "rw"),
    ] {
        assert_eq!(
            options(point).as_deref(),
            Some(expected),
            "{point} in the daemon's mounts:\n{mounts}"
        );
    }
}
