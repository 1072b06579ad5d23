//! The agent's identity obtained by a CSR (src/identity/) and decided by `flexnode approver`
//! (src/approver/), against the real control plane with kube-controller-manager signing
//! (`e2e/controlplane/run`): a token bound to a node gets that node's identity and no other,
//! an agent renews its own, what asks for no agent identity is left alone, a join that died
//! waiting finds its request again, an expired token is refused. The approver runs with its
//! own service account's token and the RBAC of manifests/approver/.

use crate::support::Lab;
use crate::support::agent::{Agent, admin, apply_rbac, create_node_and_machine, node_reboot};
use flexnode::api::machine_operation::OperationPhase;
use flexnode::api::{Machine, MachineOperation};
use flexnode::config::RenewAt;
use flexnode::config::kubeconfig::client_from_kubeconfig;
use flexnode::identity::bootstrap::{
    BootstrapError, Obtained, PENDING_KEY, TokenRequest, by_token,
};
use flexnode::identity::credential::token_client;
use flexnode::identity::csr::AgentKey;
use flexnode::identity::request::{RequestError, obtain};
use flexnode::identity::rotation::{Renewer, Swappable};
use flexnode::lifecycle::agent::InstallMode;
use flexnode::reconcile::DaemonConfig;
use flexnode_test_tier::tier;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(60);

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// A bootstrap token in `groups` (its Secret's `auth-extra-groups`), valid `ttl` seconds.
fn token(lab: &Lab, ttl: &str, groups: &str) -> String {
    let mut cmd = Command::new(crate::support::script());
    cmd.args(["bootstrap-token", "--ttl", ttl]);
    if !groups.is_empty() {
        cmd.args(["--groups", groups]);
    }
    let out = cmd
        .arg("--dir")
        .arg(&lab.dir)
        .output()
        .expect("bootstrap-token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let text = std::fs::read_to_string(path).expect("the token's kubeconfig");
    text.lines()
        .find_map(|l| l.trim().strip_prefix("token: "))
        .expect("a token line")
        .to_string()
}

fn bound_to(node: &str) -> String {
    format!("system:bootstrappers:flexnode,system:bootstrappers:flexnode:{node}")
}

fn ca(lab: &Lab) -> Vec<u8> {
    std::fs::read(lab.dir.join("pki/ca.crt")).expect("the lab's CA")
}

/// The approver's client: its service account's token (manifests/approver/rbac.yaml).
async fn approver_client(lab: &Lab) -> Client {
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/approver/rbac.yaml");
    let (ok, out) = lab.kubectl(&["apply", "-f", &rbac.display().to_string()]);
    assert!(ok, "{out}");
    let (ok, token) = lab.kubectl(&[
        "create",
        "token",
        "flexnode-approver",
        "-n",
        "flexnode-system",
    ]);
    assert!(ok, "{token}");
    token_client(
        &lab.state("APISERVER_URL"),
        &ca(lab),
        token.trim().to_string().into(),
    )
    .await
    .expect("the approver's client")
}

fn request<'a>(
    server: &'a str,
    ca: &'a [u8],
    node: &'a str,
    token: &str,
    kubeconfig: &'a Path,
) -> TokenRequest<'a> {
    TokenRequest {
        node,
        server,
        ca_pem: ca,
        token: token.to_string().into(),
        expiration_seconds: Some(3600),
        kubeconfig,
    }
}

/// `node`'s first certificate in `kubeconfig`, through a token bound to it, asked to live
/// 600 s (the renewal tests' shortest life; the approver must run).
async fn short_lived(lab: &Lab, node: &str, kubeconfig: &Path) -> flexnode::identity::csr::Issued {
    let (server, ca) = (lab.state("APISERVER_URL"), ca(lab));
    let token = token(lab, "3600", &bound_to(node));
    let mut first = request(&server, &ca, node, &token, kubeconfig);
    first.expiration_seconds = Some(600);
    let Obtained::New(first) = by_token(first, now(), WAIT, |_| {}).await.expect("joined") else {
        panic!("a first certificate is new")
    };
    first
}

/// A join's certificate for `node` with `token`, waiting at most [`WAIT`].
async fn join(
    server: &str,
    ca: &[u8],
    node: &str,
    token: &str,
    kubeconfig: &Path,
) -> Result<Obtained, BootstrapError> {
    by_token(
        request(server, ca, node, token, kubeconfig),
        now(),
        WAIT,
        |_| {},
    )
    .await
}

async fn who(client: &Client) -> (String, Vec<String>) {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    (
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    )
}

fn denied(e: &BootstrapError) -> (String, String) {
    match e {
        BootstrapError::Request(RequestError::Denied {
            reason, message, ..
        }) => (reason.clone(), message.clone()),
        other => panic!("not denied: {other}"),
    }
}

/// The Events about the request `name`: (type, reason, note).
async fn events_of(admin: &Client, name: &str) -> Vec<(String, String, String)> {
    let api: Api<Event> = Api::all(admin.clone());
    let got = crate::support::wait_for(Duration::from_secs(30), || async {
        let list = api.list(&Default::default()).await.ok()?;
        let of: Vec<_> = list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect();
        (!of.is_empty()).then_some(of)
    })
    .await;
    got.unwrap_or_else(|| panic!("no Event about {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_node_bound_token_gets_its_nodes_identity_and_no_other() {
    // The approver's metrics are the process's (src/metrics.rs): counted here alone.
    if !crate::support::in_own_process(
        "identity::a_node_bound_token_gets_its_nodes_identity_and_no_other",
        &[],
    ) {
        return;
    }
    let lab = Lab::up_with_controllers();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let server = lab.state("APISERVER_URL");
    let ca = ca(&lab);

    // A request for no agent identity, there before the approver starts: never decided by it.
    let someone = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "someone");
    let pem = params
        .serialize_request(&someone)
        .expect("request")
        .pem()
        .expect("pem");
    let other = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some("someone-else".into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: k8s_openapi::ByteString(pem.into_bytes()),
            signer_name: "kubernetes.io/kube-apiserver-client".into(),
            usages: Some(vec!["client auth".into()]),
            ..Default::default()
        },
        status: None,
    };
    csrs.create(&PostParams::default(), &other)
        .await
        .expect("create");
    let approver = tokio::spawn(flexnode::approver::run(approver_client(&lab).await));

    // node-a's token gets node-a's identity: a 0600 kubeconfig the API server knows as the
    // agent of node-a, which RBAC lets read Machines.
    let token_a = token(&lab, "3600", &bound_to("node-a"));
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig_a = dir.path().join("kubeconfig");
    let got = join(&server, &ca, "node-a", &token_a, &kubeconfig_a)
        .await
        .expect("node-a's certificate");
    let Obtained::New(cert) = got else {
        panic!("a first join keeps no certificate")
    };
    assert_eq!(cert.common_name, "system:flexnode:node-a");
    assert_eq!(cert.organizations, ["flexnode:agents"]);
    assert!(cert.not_after - cert.not_before <= 3600 + 300, "{cert:?}");
    let mode = std::fs::metadata(&kubeconfig_a)
        .expect("kubeconfig")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        !dir.path().join(PENDING_KEY).exists(),
        "the waiting key was left"
    );
    let agent_a = client_from_kubeconfig(&kubeconfig_a)
        .await
        .expect("agent client");
    let (user, groups) = who(&agent_a).await;
    assert_eq!(user, "system:flexnode:node-a");
    assert!(groups.iter().any(|g| g == "flexnode:agents"), "{groups:?}");
    Api::<Machine>::all(agent_a.clone())
        .list(&Default::default())
        .await
        .expect("the agent's RBAC applies to the obtained identity");
    let text = std::fs::read_to_string(&kubeconfig_a).expect("kubeconfig");
    assert!(!text.contains(&token_a), "the token is in the kubeconfig");

    // Run again (a converging join): the certificate is kept, no second request.
    let again = join(&server, &ca, "node-a", &token_a, &kubeconfig_a)
        .await
        .expect("kept");
    assert!(matches!(again, Obtained::Kept(_)));
    let of_a = |list: &[CertificateSigningRequest]| {
        list.iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("flexnode-node-a-"))
            })
            .count()
    };
    let list = csrs.list(&Default::default()).await.expect("list").items;
    assert_eq!(of_a(&list), 1, "a second request for node-a");

    // node-a's token asking for node-b's identity: denied, the reason on the request, an
    // Event, nothing written.
    let dir_b = tempfile::tempdir().expect("tmp");
    let kubeconfig_b = dir_b.path().join("kubeconfig");
    let e = join(&server, &ca, "node-b", &token_a, &kubeconfig_b)
        .await
        .err()
        .expect("node-b's identity with node-a's token");
    let (reason, message) = denied(&e);
    assert_eq!(reason, "RequesterNotBound", "{message}");
    assert!(message.contains("node node-b"), "{message}");
    assert!(!kubeconfig_b.exists());
    let name_b = match &e {
        BootstrapError::Request(RequestError::Denied { name, .. }) => name.clone(),
        _ => unreachable!(),
    };
    let ev = events_of(&admin, &name_b).await;
    assert!(
        ev.iter()
            .any(|(t, r, n)| t == "Warning" && r == "Denied" && n.starts_with("RequesterNotBound")),
        "{ev:?}"
    );
    // A token in no node's group (the kubelet's kind): denied too.
    let unbound = token(&lab, "3600", "");
    let e = join(&server, &ca, "node-b", &unbound, &kubeconfig_b)
        .await
        .err()
        .expect("an unbound token");
    assert_eq!(denied(&e).0, "RequesterNotBound");
    for e in [format!("{e}"), format!("{e:?}")] {
        assert!(
            !e.contains(&unbound) && !e.contains(&token_a),
            "a token in {e}"
        );
    }

    // The agent renews its own identity with a new key, and cannot take another node's.
    let key = AgentKey::generate().expect("key");
    let (_, renewed) = obtain(&agent_a, "node-a", &key, Some(3600), WAIT, |_| {})
        .await
        .expect("renewal");
    assert!(key.matches(&renewed));
    let e = obtain(
        &agent_a,
        "node-b",
        &AgentKey::generate().expect("key"),
        None,
        WAIT,
        |_| {},
    )
    .await
    .expect_err("node-b's identity asked by node-a's agent");
    assert!(
        matches!(e, RequestError::Denied { ref reason, .. } if reason == "RequesterNotBound"),
        "{e}"
    );

    // The decisions in the approver's metrics (counted once its decision is written, which
    // the requester may see first).
    let want = [
        r#"flexnode_approver_decisions_total{decision="Approved",reason="BoundBootstrapToken"} 1"#,
        r#"flexnode_approver_decisions_total{decision="Approved",reason="Renewal"} 1"#,
        r#"flexnode_approver_decisions_total{decision="Denied",reason="RequesterNotBound"} 3"#,
    ];
    let counted = crate::support::wait_for(Duration::from_secs(10), || async {
        let metrics = flexnode::metrics::render();
        want.iter().all(|l| metrics.contains(l)).then_some(())
    })
    .await;
    assert!(
        counted.is_some(),
        "{want:?} not in:\n{}",
        flexnode::metrics::render()
    );
    let other = csrs.get("someone-else").await.expect("someone-else");
    let decided = other
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.type_ == "Approved" || c.type_ == "Denied")
        .count();
    assert_eq!(
        decided, 0,
        "the approver decided a request for no agent identity"
    );
    approver.abort();
}

/// Intent before action: the key is on disk before its request is sent, so a join that gave
/// up waiting (or died) asks again with the same request and takes its certificate once an
/// approver decides it; an expired token is refused as such (`join` exits 78 on it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_join_that_gave_up_waiting_finds_its_request_again() {
    let lab = Lab::up_with_controllers();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let server = lab.state("APISERVER_URL");
    let ca = ca(&lab);
    let token_c = token(&lab, "3600", &bound_to("node-c"));
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");

    // No approver yet: the wait ends naming what to do, the key and the request stay.
    let mut waits = 0;
    let e = by_token(
        request(&server, &ca, "node-c", &token_c, &kubeconfig),
        now(),
        Duration::from_secs(2),
        |_| waits += 1,
    )
    .await
    .err()
    .expect("nothing approves it");
    let BootstrapError::Request(RequestError::NotApproved { name, .. }) = &e else {
        panic!("{e}");
    };
    let name = name.clone();
    assert!(e.to_string().contains("flexnode approver"), "{e}");
    assert!(
        e.to_string()
            .contains(&format!("kubectl certificate approve {name}")),
        "{e}"
    );
    assert!(
        waits >= 2,
        "the wait said nothing: {waits} progress reports"
    );
    let pending = dir.path().join(PENDING_KEY);
    let mode = std::fs::metadata(&pending)
        .expect("the waiting key")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(!kubeconfig.exists());

    // The approver comes; the same request is found and its certificate taken.
    let approver = tokio::spawn(flexnode::approver::run(approver_client(&lab).await));
    let got = join(&server, &ca, "node-c", &token_c, &kubeconfig)
        .await
        .expect("the certificate");
    assert!(matches!(got, Obtained::New(_)));
    let list = csrs.list(&Default::default()).await.expect("list").items;
    let of_c: Vec<_> = list
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .filter(|n| n.starts_with("flexnode-node-c-"))
        .collect();
    assert_eq!(of_c, [name], "one request for node-c");
    assert!(!pending.exists());
    let agent = client_from_kubeconfig(&kubeconfig).await.expect("client");
    assert_eq!(who(&agent).await.0, "system:flexnode:node-c");

    // An expired token: refused, which `join` tells as the token's fault.
    let expired = token(&lab, "1", &bound_to("node-d"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dir_d = tempfile::tempdir().expect("tmp");
    let e = join(
        &server,
        &ca,
        "node-d",
        &expired,
        &dir_d.path().join("kubeconfig"),
    )
    .await
    .err()
    .expect("an expired token");
    let BootstrapError::Request(r) = &e else {
        panic!("{e}")
    };
    assert!(r.refused(), "{e}");
    assert!(!format!("{e:?}").contains(&expired), "the token in {e:?}");
    approver.abort();
}

/// `node`'s renewer running, its point `secs` from now (the signer backdates a certificate:
/// the percent is reckoned from `first`, the one it issued); each renewed certificate is sent
/// on the channel.
fn renewing_in(
    secs: i64,
    node: &str,
    kubeconfig: &Path,
    first: &flexnode::identity::csr::Issued,
    swap: Swappable,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::mpsc::UnboundedReceiver<flexnode::identity::csr::Issued>,
) {
    let life = first.not_after - first.not_before;
    let percent = u8::try_from(((now() + secs - first.not_before) * 100 / life).clamp(1, 99))
        .expect("a percent");
    let (tx, renewed) = tokio::sync::mpsc::unbounded_channel();
    let renewer = Renewer {
        node: node.into(),
        kubeconfig: kubeconfig.to_path_buf(),
        expiration_seconds: Some(600),
        renew_at: RenewAt {
            from_percent: percent,
            to_percent: percent,
        },
    };
    let renewing = tokio::spawn(renewer.run(swap, move |c| {
        let _ = tx.send(c.clone());
    }));
    (renewing, renewed)
}

/// The next certificate the renewer reports.
async fn next(
    renewed: &mut tokio::sync::mpsc::UnboundedReceiver<flexnode::identity::csr::Issued>,
    what: &str,
) -> flexnode::identity::csr::Issued {
    tokio::time::timeout(Duration::from_secs(90), renewed.recv())
        .await
        .unwrap_or_else(|_| panic!("no {what} renewal"))
        .expect("the renewer ended")
}

/// The operation `name` once terminal (Complete expected).
async fn completed(admin: &Client, name: &str) {
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    let done = crate::support::wait_for(Duration::from_secs(60), || async {
        ops.get_opt(name)
            .await
            .ok()
            .flatten()
            .filter(MachineOperation::is_terminal)
    })
    .await
    .unwrap_or_else(|| panic!("{name} did not finish"));
    let phase = done.status.and_then(|s| s.phase);
    assert_eq!(phase, Some(OperationPhase::Complete), "{name}");
}

/// Rotation: the daemon's certificate renewed twice by its own identity (a new key each
/// time, approved `Renewal`), its client switched in place — the daemon never restarted,
/// operations before, between and after the renewals done, and not one request of the
/// agent's refused (401/403) in the API server's audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn the_daemon_renews_its_certificate_twice_without_a_restart_or_a_failed_request() {
    let lab = Lab::up_audited_with_controllers();
    apply_rbac(&lab);
    let admin = admin(&lab).await;
    let approver = tokio::spawn(flexnode::approver::run(approver_client(&lab).await));
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    let first = short_lived(&lab, "node-r", &kubeconfig).await;
    create_node_and_machine(&admin, "node-r", &[]).await;
    let audit_from = lab.audit_len();
    let (client, swap) = Swappable::new(client_from_kubeconfig(&kubeconfig).await.expect("client"));
    let config = DaemonConfig {
        node_name: "node-r".into(),
        tick: Duration::from_millis(300),
        ..Default::default()
    };
    let store = tempfile::tempdir().expect("tmp");
    let agent = Agent::join_with(client, store, InstallMode::Host, config).await;
    let ops: Api<MachineOperation> = Api::all(admin.clone());
    let reboot = |name: &str| {
        let ops = ops.clone();
        let op = node_reboot(name, "node-r");
        async move {
            ops.create(&PostParams::default(), &op)
                .await
                .expect("create")
        }
    };
    reboot("rotate-before").await;
    completed(&admin, "rotate-before").await;

    let (renewing, mut renewed) = renewing_in(8, "node-r", &kubeconfig, &first, swap);
    let one = next(&mut renewed, "first").await;
    reboot("rotate-between").await;
    completed(&admin, "rotate-between").await;
    let two = next(&mut renewed, "second").await;
    reboot("rotate-after").await;
    completed(&admin, "rotate-after").await;

    for cert in [&one, &two] {
        assert_eq!(cert.common_name, "system:flexnode:node-r");
        assert!(cert.not_after > first.not_after, "{cert:?}");
    }
    assert!(two.not_after >= one.not_after);
    let in_file =
        flexnode::identity::credential::certificate_in(&kubeconfig).expect("a certificate");
    assert_eq!(in_file, two, "the kubeconfig holds the last certificate");
    assert!(agent.running(), "the daemon stopped");
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let mut reasons: Vec<String> = csrs
        .list(&Default::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|c| {
            c.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("flexnode-node-r-"))
        })
        .flat_map(|c| c.status.and_then(|s| s.conditions).unwrap_or_default())
        .filter(|c| c.type_ == "Approved")
        .filter_map(|c| c.reason)
        .collect();
    reasons.sort();
    assert_eq!(reasons, ["BoundBootstrapToken", "Renewal", "Renewal"]);
    let codes = lab.audited_codes("system:flexnode:node-r", audit_from);
    let refused: u64 = codes
        .iter()
        .filter(|(c, _)| [401, 403].contains(c))
        .map(|(_, n)| n)
        .sum();
    assert!(
        codes.values().sum::<u64>() > 10,
        "the agent's requests: {codes:?}"
    );
    assert_eq!(refused, 0, "requests of the agent refused: {codes:?}");
    eprintln!("ROTATION two renewals; the agent's requests by code: {codes:?}");
    renewing.abort();
    approver.abort();
}

/// A renewal point that passes while the API server is away (stopped, etcd with it): the
/// renewer tries again (5 s, doubling) and renews once the API server is back, without
/// waiting for the next point.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_renewal_point_passed_while_the_api_server_was_away_is_caught_up() {
    let lab = Lab::up_with_controllers();
    apply_rbac(&lab);
    let approver = tokio::spawn(flexnode::approver::run(approver_client(&lab).await));
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    let first = short_lived(&lab, "node-w", &kubeconfig).await;
    let (_client, swap) =
        Swappable::new(client_from_kubeconfig(&kubeconfig).await.expect("client"));
    // A renewal point 8 s from now, which passes while the API server is away.
    lab.stop_apiserver();
    let (renewing, mut renewed) = renewing_in(8, "node-w", &kubeconfig, &first, swap);
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(
        renewed.try_recv().is_err(),
        "renewed while the API server was away"
    );
    let back = lab.start_apiserver(false);
    // The renewer's next try (its wait doubles: 5, 10, 20, 40 s), then the approver's and the
    // signer's watches back (their own backoff): 8-60 s here.
    let caught_up = tokio::time::timeout(Duration::from_secs(240), renewed.recv())
        .await
        .expect("no renewal within 240 s of the API server's return")
        .expect("the renewer ended");
    let after = std::time::SystemTime::now()
        .duration_since(back)
        .unwrap_or_default();
    assert_eq!(caught_up.common_name, "system:flexnode:node-w");
    assert!(caught_up.not_after > first.not_after, "{caught_up:?}");
    assert_eq!(
        flexnode::identity::credential::certificate_in(&kubeconfig),
        Some(caught_up),
        "the kubeconfig holds the renewed certificate"
    );
    eprintln!(
        "CAUGHT UP {:.1} s after the API server was back",
        after.as_secs_f64()
    );
    renewing.abort();
    approver.abort();
}

/// A kubeconfig of the lab's server and CA whose certificate expired on 2020-01-02.
fn expired_kubeconfig(lab: &Lab, path: &Path) {
    let key = rcgen::KeyPair::generate().expect("key");
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "system:flexnode:node-x");
    params.not_before = rcgen::date_time_ymd(2020, 1, 1);
    params.not_after = rcgen::date_time_ymd(2020, 1, 2);
    let cert = params.self_signed(&key).expect("cert").pem();
    let key = AgentKey::from_pem(&key.serialize_pem()).expect("key");
    let text =
        flexnode::identity::credential::render(&lab.state("APISERVER_URL"), &ca(lab), &cert, &key)
            .expect("render");
    std::fs::write(path, text).expect("write");
}

/// A node back after its certificate expired (it was off past its renewal): the daemon's
/// start replaces it through the bootstrap token while that is valid; with the token expired
/// too, the start is refused with `CertificateExpired`, which only an operator ends (78).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(controlplane)]
async fn a_certificate_expired_while_the_node_was_off_is_replaced_through_the_token() {
    let lab = Lab::up_with_controllers();
    apply_rbac(&lab);
    let approver = tokio::spawn(flexnode::approver::run(approver_client(&lab).await));
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    let token_file = dir.path().join("bootstrap-token");
    let write_token = |t: &str| {
        std::fs::write(&token_file, format!("{t}\n")).expect("token");
        std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600))
            .expect("chmod");
    };
    let replace = || {
        flexnode::identity::bootstrap::replace_expired(
            "node-x",
            &kubeconfig,
            Some(&token_file),
            None,
            now(),
            WAIT,
        )
    };

    // Valid token: replaced, and the new one is the node's.
    expired_kubeconfig(&lab, &kubeconfig);
    write_token(&token(&lab, "3600", &bound_to("node-x")));
    let new = replace()
        .await
        .expect("replaced")
        .expect("a new certificate");
    assert!(new.not_after > now(), "{new:?}");
    let agent = client_from_kubeconfig(&kubeconfig).await.expect("client");
    assert_eq!(who(&agent).await.0, "system:flexnode:node-x");
    // Valid now: left alone.
    assert!(replace().await.expect("nothing to do").is_none());

    // Both expired: refused, the fault only an operator ends, the token not in its words.
    expired_kubeconfig(&lab, &kubeconfig);
    let expired = token(&lab, "1", &bound_to("node-x"));
    write_token(&expired);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let e = replace().await.expect_err("no way to replace it");
    let fault = flexnode::lifecycle::fault::Fault::new(
        flexnode::lifecycle::fault::FaultKind::CertificateExpired,
        &kubeconfig,
        e.to_string(),
    );
    assert!(fault.kind.needs_operator());
    let said = format!("{fault}; {}", fault.remedy());
    assert!(
        said.contains("bootstrap token") && !said.contains(&expired),
        "{said}"
    );
    approver.abort();
}
