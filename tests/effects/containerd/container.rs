//! Containers (`src/effects/containerd/container.rs`, `spec.rs`): run, stopped, deleted.

use super::*;

both_versions!(containers_run_stop_and_delete);

/// The container's record in containerd: (labels, snapshot key), read with plain gRPC.
async fn container_record(
    ch: &Channel,
    id: &str,
) -> Option<(std::collections::HashMap<String, String>, String)> {
    match ContainersClient::new(ch.clone())
        .get(ns(GetContainerRequest { id: id.to_string() }))
        .await
    {
        Ok(r) => r.into_inner().container.map(|c| (c.labels, c.snapshot_key)),
        Err(s) if s.code() == Code::NotFound => None,
        Err(s) => panic!("get container: {s}"),
    }
}

/// The task's status name (`RUNNING`, …) and PID, read with plain gRPC.
async fn task(ch: &Channel, id: &str) -> Option<(String, u32)> {
    match TasksClient::new(ch.clone())
        .get(ns(GetRequest {
            container_id: id.to_string(),
            exec_id: String::new(),
        }))
        .await
    {
        Ok(r) => r.into_inner().process.map(|p| {
            let status = containerd_client::types::v1::Status::try_from(p.status)
                .map(|s| s.as_str_name().to_string())
                .unwrap_or_default();
            (status, p.pid)
        }),
        Err(s) if s.code() == Code::NotFound => None,
        Err(s) => panic!("get task: {s}"),
    }
}

/// Polls for a file's contents to satisfy `f`, for at most 10 s.
async fn wait_file(path: &Path, f: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if f(&text) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} never matched; has: {text:?}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The effective capability mask of a CapEff line in `text`.
fn cap_eff(text: &str) -> u64 {
    let hex = text
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .unwrap_or_else(|| panic!("no CapEff in {text:?}"))
        .trim();
    u64::from_str_radix(hex, 16).expect("hex CapEff")
}

/// create → start → running → stop (SIGTERM honoured; SIGTERM ignored → SIGKILL after the
/// grace) → delete, on a busybox image pulled by the agent, with runc on this host (cgroup v1
/// hybrid, cgroupfs driver, no resource limits).
async fn containers_run_stop_and_delete(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let t0 = Instant::now();
    let digest = tier.busybox_image("e2e/busybox:v1");
    let reference = tier.reference("e2e/busybox", &digest);
    let (_, _, top_chain) = tier.expected_layout(&digest);
    let agent = tier.agent().await;
    let ch = tier.channel().await;
    agent.pull(&reference, &digest).await.expect("pull busybox");
    let shared = tier.dir.join("shared");
    std::fs::create_dir_all(&shared).expect("shared dir");
    let mounts = vec![BindMount {
        source: shared.clone(),
        destination: "/shared".into(),
        read_only: false,
    }];
    let sh = |script: &str| vec!["/bin/sh".to_string(), "-c".to_string(), script.to_string()];
    // Container ids are global to runc's state dir (/run/containerd/runc/NS), shared by tiers
    // (both flavors run at once in one test process).
    let pid = std::process::id();
    let tag = match flavor {
        Flavor::V1_6 => "v16",
        Flavor::V2 => "v2",
    };
    let priv_id = format!("fx-priv-{pid}-{tag}");
    let term_id = format!("fx-term-{pid}-{tag}");

    // A privileged one: sleep as PID 1 (no handler, so SIGTERM does nothing), output to files.
    let created = Instant::now();
    agent
        .create_container(
            &priv_id,
            &digest,
            &sh("grep CapEff /proc/self/status; echo hello > /shared/priv; echo ready; exec sleep 1000"),
            true,
            &mounts,
        )
        .await
        .expect("create privileged");
    let create_ms = created.elapsed().as_millis();
    let (labels, key) = container_record(&ch, &priv_id).await.expect("record");
    assert_eq!(labels.get(MANAGED_LABEL).map(String::as_str), Some("true"));
    assert_eq!(key, priv_id);
    assert!(snapshot_exists(&ch, &priv_id).await, "active snapshot");
    // Creating again is a no-op.
    agent
        .create_container(&priv_id, &digest, &sh("true"), true, &mounts)
        .await
        .expect("create again");
    let (ok, leases) = tier.ctr(&["leases", "ls", "-q"]);
    assert!(ok && leases.trim().is_empty(), "leases left: {leases}");

    let stdout = tier.dir.join("io/priv.out");
    let stderr = tier.dir.join("io/priv.err");
    let started = Instant::now();
    let task_pid = agent
        .start_container(
            &priv_id,
            &TaskIo::Files {
                stdout: stdout.clone(),
                stderr: stderr.clone(),
            },
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "start privileged: {e}\ncontainerd log tail:\n{}",
                std::fs::read_to_string(tier.dir.join("logs/containerd.log"))
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        });
    let start_ms = started.elapsed().as_millis();
    assert!(task_pid > 1);
    assert_eq!(
        task(&ch, &priv_id).await,
        Some(("RUNNING".to_string(), task_pid))
    );
    let out = wait_file(&stdout, |t| t.contains("ready")).await;
    // Privileged: every capability of the bounding set containerd and this test run with
    // (the sandboxed development hosts lack CAP_SYS_RESOURCE there).
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).expect("hex"))
        .expect("CapBnd");
    assert_eq!(cap_eff(&out), bounding, "{out}");
    assert_eq!(
        std::fs::read_to_string(shared.join("priv")).expect("bind mount write"),
        "hello\n"
    );
    // The host's process is the one containerd reports, and it is `sleep` (polled: the shell
    // prints "ready" just before it execs sleep, so under load the exec may not be done yet).
    wait_file(Path::new(&format!("/proc/{task_pid}/comm")), |t| {
        t.trim() == "sleep"
    })
    .await;
    // Starting a running container returns its PID.
    assert_eq!(
        agent
            .start_container(&priv_id, &TaskIo::Null)
            .await
            .expect("start again"),
        task_pid
    );
    // A running container is not deleted.
    let m = failed(agent.delete_container(&priv_id).await);
    assert!(m.contains("RUNNING") && m.contains("stop"), "{m}");

    // An unprivileged one that exits on SIGTERM; output to /dev/null, readiness via the mount.
    agent
        .create_container(
            &term_id,
            &digest,
            &sh(
                "trap 'exit 3' TERM; grep CapEff /proc/self/status > /shared/term.caps; \
                 touch /shared/term.ready; sleep 1000 & wait",
            ),
            false,
            &mounts,
        )
        .await
        .expect("create unprivileged");
    agent
        .start_container(&term_id, &TaskIo::Null)
        .await
        .expect("start unprivileged");
    // (The file's existence is the signal; an absent file reads as "" in wait_file.)
    let ready = shared.join("term.ready");
    wait_file(&ready, |_| ready.exists()).await;
    assert_eq!(
        task(&ch, &term_id).await.map(|t| t.0).as_deref(),
        Some("RUNNING")
    );
    let caps = std::fs::read_to_string(shared.join("term.caps")).expect("caps");
    assert_eq!(cap_eff(&caps), 0xa804_25fb, "default capabilities: {caps}");
    assert_eq!(agent.managed_containers().await.expect("list"), {
        let mut v = vec![priv_id.clone(), term_id.clone()];
        v.sort();
        v
    });

    // Stop: SIGTERM honoured at once.
    let t = Instant::now();
    let stopped = agent
        .stop_container(&term_id, Duration::from_secs(10))
        .await
        .expect("stop term");
    let term_ms = t.elapsed().as_millis();
    assert_eq!(
        stopped,
        Some(StopOutcome {
            exit_status: 3,
            killed: false
        })
    );
    assert!(term_ms < 5000, "SIGTERM stop took {term_ms} ms");
    assert_eq!(task(&ch, &term_id).await, None);
    // Stop: SIGTERM ignored, SIGKILL after the grace period.
    let grace = Duration::from_millis(1500);
    let t = Instant::now();
    let stopped = agent
        .stop_container(&priv_id, grace)
        .await
        .expect("stop priv");
    let kill_ms = t.elapsed().as_millis();
    assert_eq!(
        stopped,
        Some(StopOutcome {
            exit_status: 137,
            killed: true
        })
    );
    assert!(
        kill_ms >= grace.as_millis() && kill_ms < grace.as_millis() + 5000,
        "SIGKILL stop took {kill_ms} ms"
    );
    assert_eq!(task(&ch, &priv_id).await, None);
    assert!(
        !Path::new(&format!("/proc/{task_pid}")).exists() || {
            // The PID may have been reused; it is not our sleep any more.
            std::fs::read_to_string(format!("/proc/{task_pid}/comm"))
                .unwrap_or_default()
                .trim()
                != "sleep"
        }
    );
    assert_eq!(
        agent
            .stop_container(&priv_id, grace)
            .await
            .expect("stop again"),
        None
    );

    // Delete: record and snapshot gone; the image's snapshot stays.
    for id in [&priv_id, &term_id] {
        agent.delete_container(id).await.expect("delete");
        assert!(
            container_record(&ch, id).await.is_none(),
            "{id} record left"
        );
        assert!(!snapshot_exists(&ch, id).await, "{id} snapshot left");
        agent.delete_container(id).await.expect("delete again");
    }
    assert!(agent.managed_containers().await.expect("list").is_empty());
    assert!(
        snapshot_exists(&ch, &top_chain).await,
        "image snapshot removed"
    );
    let (ok, list) = tier.ctr(&["containers", "ls", "-q"]);
    assert!(ok && list.trim().is_empty(), "containers left: {list}");

    // Containers not made by the agent are refused; an image not pulled is a clear error.
    let (ok, out) = tier.ctr(&[
        "containers",
        "create",
        "--snapshotter",
        &snapshotter(),
        &reference,
        "fx-theirs",
    ]);
    assert!(ok, "ctr containers create: {out}");
    let m = failed(agent.delete_container("fx-theirs").await);
    assert!(m.contains("not created by flexnode"), "{m}");
    let m = failed(
        agent
            .create_container("fx-theirs", &digest, &sh("true"), false, &[])
            .await,
    );
    assert!(m.contains("not created by flexnode"), "{m}");
    let absent = Sha256Hex::parse(&"cd".repeat(32)).expect("hex");
    let m = failed(
        agent
            .create_container("fx-nothing", &absent, &sh("true"), false, &[])
            .await,
    );
    assert!(m.contains("not pulled"), "{m}");
    eprintln!(
        "containers: create {create_ms} ms, start {start_ms} ms, stop by SIGTERM {term_ms} ms, \
         stop by SIGKILL after {} ms grace {kill_ms} ms; whole test {} ms",
        grace.as_millis(),
        t0.elapsed().as_millis()
    );
}
