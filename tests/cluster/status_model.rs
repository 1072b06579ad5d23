//! One status model, every rendering: a daemon (simulated host, real kube-apiserver) runs one
//! NodeReboot, and the operation shows in the MachineOperation's status, the Machine's phase
//! (Rebooting, then Ready), its Events, the log line of each transition (the journal's
//! fields: tests/node/host_handoff.rs), `flexnode status` (with the running daemon's own part over
//! its socket, and without it once the daemon is gone, saying which) and the Prometheus
//! scrape (with a watch's reconnect once the API server went away and came back), which the
//! linter `promtool check metrics` runs (e2e/promlint, built from its Go module) accepts.

use crate::support;

use flexnode::api::machine_operation::OperationPhase;
use flexnode::api::{Machine, MachineOperation};
use flexnode::lifecycle::agent::InstallMode;
use flexnode::reconcile::DaemonConfig;
use flexnode_test_tier::tier;
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;
use support::agent::{
    Agent, admin, agent_client, apply_rbac, create_node_and_machine, node_reboot,
};
use support::{Lab, wait_for};

const NODE: &str = "metrics-1";

/// A loopback port nothing listens on now.
fn free_port() -> std::net::SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr")
}

async fn get(url: &str) -> (u16, String, String) {
    flexnode::effects::http::ensure_crypto_provider();
    let r = reqwest::get(url).await.expect("GET");
    let status = r.status().as_u16();
    let content_type = r
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, content_type, r.text().await.expect("body"))
}

/// The wall clock in seconds, as the metrics' timestamps give it.
fn now_secs() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64()
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn promlint(text: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/promlint/build");
    let built = Command::new(&script)
        .output()
        .expect("run e2e/promlint/build");
    assert!(
        built.status.success(),
        "e2e/promlint/build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let bin = String::from_utf8_lossy(&built.stdout).trim().to_string();
    let mut child = Command::new(bin)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promlint");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed promlint");
    let out = child.wait_with_output().expect("promlint");
    assert!(
        out.status.success(),
        "promlint: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn one_operation_shows_in_every_rendering() {
    // Its counts are exact: no other test's daemon may have counted in its process.
    if !support::in_own_process("status_model::one_operation_shows_in_every_rendering", &[]) {
        return;
    }
    support::logs::init();
    let since = support::logs::mark();
    let lab = Lab::up();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    create_node_and_machine(&admin, NODE, &[]).await;
    let addr = free_port();
    let started = now_secs();
    let config = DaemonConfig {
        node_name: NODE.into(),
        tick: Duration::from_millis(300),
        metrics: Some(addr),
        live_status: true,
        ..Default::default()
    };
    let dir = tempfile::tempdir().expect("tmp");
    let store = dir.path().join("state/state.db");
    let mut agent = Agent::join_with(
        agent_client(&lab, NODE).await,
        dir,
        InstallMode::Host,
        config,
    )
    .await;

    // The Machine's phases as a watch sees them (the API server orders its events).
    let phases = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let machines: Api<Machine> = Api::all(admin.clone());
    let sink = phases.clone();
    let machine_watch = tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={NODE}"));
        let mut stream = watcher::watcher(machines, config).boxed();
        while let Some(event) = stream.next().await {
            let (Ok(watcher::Event::Apply(m)) | Ok(watcher::Event::InitApply(m))) = event else {
                continue;
            };
            let phase = format!("{:?}", m.status.and_then(|s| s.phase));
            let mut seen = sink.lock().unwrap_or_else(|p| p.into_inner());
            if seen.last() != Some(&phase) {
                seen.push(phase);
            }
        }
    });
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    ops.create(&PostParams::default(), &node_reboot("reboot-m", NODE))
        .await
        .expect("create");
    let done = wait_for(Duration::from_secs(60), || async {
        let op = ops.get("reboot-m").await.ok()?;
        (op.status.as_ref()?.phase == Some(OperationPhase::Complete)).then_some(op)
    })
    .await;
    assert!(done.is_some(), "reboot-m did not complete");

    // The Machine was Rebooting, and is Ready again.
    let ready = wait_for(Duration::from_secs(10), || async {
        let seen = phases.lock().unwrap_or_else(|p| p.into_inner()).clone();
        (seen.last().map(String::as_str) == Some("Some(Ready)")).then_some(seen)
    })
    .await;
    machine_watch.abort();
    let seen = phases.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let ready = ready.unwrap_or_else(|| panic!("the Machine is not Ready again: {seen:?}"));
    let rebooting = ready.iter().position(|p| p == "Some(Rebooting)");
    assert!(
        rebooting.is_some_and(|i| ready[i..].iter().any(|p| p == "Some(Ready)")),
        "the Machine's phases: {ready:?}"
    );

    // The log line of each transition names its operation, as the journal's fields do
    // (src/log.rs; tests/node/host_handoff.rs reads them from a real journal).
    let uid = done
        .as_ref()
        .and_then(|op| op.metadata.uid.clone())
        .expect("uid");
    for (transition, phase) in [
        (
            "Ready --OperationClaimed--> Rebooting_Draining",
            "Rebooting",
        ),
        (
            "Rebooting_Draining --EffectsDone--> Rebooting_Restarting",
            "Rebooting",
        ),
        ("Rebooting_Restarting --EffectsDone--> Ready", "Ready"),
    ] {
        let fields = format!(
            "operation=reboot-m operation_uid={uid} kind=NodeReboot phase={phase} transition={transition}"
        );
        let lines = support::logs::lines(since, |l| l.contains(" transition from="));
        assert!(
            lines.iter().any(|l| l.ends_with(&fields)),
            "no line ends with {fields:?}: {lines:#?}"
        );
    }

    let url = format!("http://{addr}/metrics");
    // The result is counted once it is published: the scrape may come just before.
    let text = wait_for(Duration::from_secs(10), || async {
        let (status, content_type, text) = get(&url).await;
        assert_eq!(status, 200);
        assert!(
            content_type.starts_with("text/plain; version=0.0.4"),
            "{content_type}"
        );
        (sample(
            &text,
            "flexnode_operations_total{kind=\"NodeReboot\",reason=\"Succeeded\"}",
        ) == Some(1.0))
        .then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("no NodeReboot result in the scrape"));
    // The claim and the reboot's end, as the transition table names them.
    for series in [
        "flexnode_transition_duration_seconds_count{from=\"Ready\",input=\"OperationClaimed\",to=\"Rebooting_Draining\"}",
        "flexnode_transition_duration_seconds_count{from=\"Rebooting_Restarting\",input=\"EffectsDone\",to=\"Ready\"}",
    ] {
        assert!(
            sample(&text, series).is_some_and(|n| n >= 1.0),
            "{series} not in:\n{text}"
        );
    }
    assert!(
        sample(&text, "flexnode_store_commit_duration_seconds_count").is_some_and(|n| n >= 2.0),
        "{text}"
    );
    let contact = sample(&text, "flexnode_last_api_contact_timestamp_seconds").expect("contact");
    assert!(
        contact >= started,
        "last API contact {contact} before the test {started}"
    );
    assert!(
        !text.contains("reboot-m"),
        "an object's name is never a label value"
    );
    assert_eq!(promlint(&text), "");

    // Only /metrics, only GET.
    let (status, _, _) = get(&format!("http://{addr}/other")).await;
    assert_eq!(status, 404);
    flexnode::effects::http::ensure_crypto_provider();
    let post = reqwest::Client::new()
        .post(&url)
        .send()
        .await
        .expect("POST");
    assert_eq!(post.status().as_u16(), 405);

    // The operation's Events.
    let events: Api<Event> = Api::all(admin.clone());
    let reasons: Vec<String> = events
        .list(&Default::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("reboot-m"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(reasons.iter().any(|r| r == "Succeeded"), "{reasons:?}");

    // `flexnode status`: the store's report with the daemon's own part, then without it.
    let status = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_flexnode"))
            .args([
                "--state",
                &store.display().to_string(),
                "status",
                "-o",
                format,
            ])
            .output()
            .expect("flexnode status");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let json: serde_json::Value = serde_json::from_str(&status("json")).expect("status JSON");
    assert_eq!(json["lastResult"]["operation"], "reboot-m", "{json}");
    assert_eq!(json["lastResult"]["reason"], "Succeeded", "{json}");
    assert_eq!(json["daemon"]["pid"], std::process::id(), "{json}");
    assert_eq!(json["daemon"]["watchesConnected"], true, "{json}");
    assert!(
        json["daemon"]["statusText"]
            .as_str()
            .is_some_and(|t| t.starts_with("Ready")),
        "{json}"
    );
    let human = status("human");
    assert!(
        human.contains("Source:           the store and the running daemon (pid "),
        "{human}"
    );
    assert!(human.contains("reboot-m"), "{human}");

    // The API server goes away and comes back: each watch's reconnect is counted, and the
    // last contact is after the return.
    let own = "flexnode_watch_reconnects_total{watch=\"own\"}";
    assert_eq!(sample(&get(&url).await.2, own), None, "no reconnect yet");
    lab.stop_apiserver();
    // Any contact after this is with the API server that came back.
    let stopped = now_secs();
    lab.start_apiserver(false);
    let text = wait_for(Duration::from_secs(60), || async {
        let text = get(&url).await.2;
        (sample(&text, own) == Some(1.0)).then_some(text)
    })
    .await
    .unwrap_or_else(|| panic!("no reconnect of the own watch counted"));
    let contact = sample(&text, "flexnode_last_api_contact_timestamp_seconds").expect("contact");
    assert!(
        contact > stopped,
        "last contact {contact}, API server stopped at {stopped}"
    );
    assert_eq!(promlint(&text), "");
    agent.kill().await;
    let json: serde_json::Value = serde_json::from_str(&status("json")).expect("status JSON");
    assert_eq!(json["lastResult"]["operation"], "reboot-m", "{json}");
    assert!(
        json.get("daemon").is_none(),
        "no daemon answers now: {json}"
    );
    assert!(status("human").contains("Source:           the store (no daemon answers)"));
}
