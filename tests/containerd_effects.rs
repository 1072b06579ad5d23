//! The containerd effects against a real containerd and docker-registry on 127.0.0.1
//! (`e2e/containerd/run`: plain HTTP, and over TLS with basic or token auth), each test once with Debian's containerd 1.6 (`…::v1_6::`) and
//! once with containerd 2.x built from `e2e/containerd/v2/go.mod` (`…::v2::`, built into the
//! cache by `.ci/run`). A missing tier fails; skipped only with FLEXNODE_SKIP_CONTAINERD=1. Needs root.
//!
//! What the tests check is read back independently of the code under test: chainIDs are
//! computed here from the config in the registry's storage, and records, content and
//! snapshots are looked up with plain gRPC calls (or `ctr`).

use containerd_client::services::v1::containers_client::ContainersClient;
use containerd_client::services::v1::snapshots::StatSnapshotRequest;
use containerd_client::services::v1::snapshots::snapshots_client::SnapshotsClient;
use containerd_client::services::v1::tasks_client::TasksClient;
use containerd_client::services::v1::{GetContainerRequest, GetRequest};
use containerd_client::services::v1::{
    GetImageRequest, InfoRequest, ListImagesRequest, content_client::ContentClient,
    images_client::ImagesClient,
};
use containerd_client::tonic::{Code, Request, transport::Channel};
mod support;

use flexnode::effects::containerd::{
    BindMount, GrpcContainerd, MANAGED_LABEL, PROGRESS_EVERY, PULLED_BY_LABEL, PullProgress,
    RegistryConfig, StopOutcome, TaskIo,
};
use flexnode::effects::http::Trust;
use flexnode::effects::{Containerd, EffectError};
use flexnode::machine::agent::Sha256Hex;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::containerd::{Flavor, NS, Tier, both_versions, snapshotter};

both_versions!(
    pull_by_digest_unpacks_is_idempotent_and_removable,
    secure_registries_need_the_right_ca_and_credentials,
    index_digest_unpacks_the_host_platform,
    bad_pulls_fail_clearly_and_leave_nothing,
    images_not_pulled_by_the_agent_are_never_removed,
    pull_reports_progress,
    containers_run_stop_and_delete,
);

impl Tier {
    fn blob_path(&self, digest: &str) -> PathBuf {
        let hex = digest.trim_start_matches("sha256:");
        self.storage
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    fn blob_json(&self, digest: &str) -> serde_json::Value {
        let bytes = std::fs::read(self.blob_path(digest)).expect("registry blob");
        serde_json::from_slice(&bytes).expect("blob is JSON")
    }

    /// (manifest digest, layer digests, top chainID) computed from the registry's files.
    fn expected_layout(&self, digest: &Sha256Hex) -> (String, Vec<String>, String) {
        let mut manifest_digest = digest.oci();
        let mut manifest = self.blob_json(&manifest_digest);
        if let Some(list) = manifest.get("manifests").and_then(|m| m.as_array()) {
            let amd64 = list
                .iter()
                .find(|m| m["platform"]["architecture"] == "amd64")
                .expect("amd64 entry");
            manifest_digest = amd64["digest"].as_str().expect("digest").to_string();
            manifest = self.blob_json(&manifest_digest);
        }
        let layers = manifest["layers"]
            .as_array()
            .expect("layers")
            .iter()
            .map(|l| l["digest"].as_str().expect("digest").to_string())
            .collect();
        let config = self.blob_json(manifest["config"]["digest"].as_str().expect("config"));
        let mut chain = String::new();
        for diff_id in config["rootfs"]["diff_ids"].as_array().expect("diff_ids") {
            let diff_id = diff_id.as_str().expect("diff id");
            chain = if chain.is_empty() {
                diff_id.to_string()
            } else {
                format!(
                    "sha256:{}",
                    hex::encode(Sha256::digest(format!("{chain} {diff_id}").as_bytes()))
                )
            };
        }
        (manifest_digest, layers, chain)
    }

    fn ctr(&self, args: &[&str]) -> (bool, String) {
        let out = Command::new(&self.ctr)
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", NS])
            .args(args)
            .output()
            .expect("ctr");
        // stdout only when it worked: ctr 2.x warns on stderr about cgroup v1 every time.
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            text.push_str(&String::from_utf8_lossy(&out.stderr));
        }
        (out.status.success(), text)
    }

    async fn agent(&self) -> GrpcContainerd {
        GrpcContainerd::connect(&self.socket, NS)
            .await
            .expect("connect")
            .with_snapshotter(&snapshotter())
    }

    async fn channel(&self) -> Channel {
        containerd_client::connect(&self.socket)
            .await
            .expect("connect")
    }
}

fn ns<T>(msg: T) -> Request<T> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert("containerd-namespace", NS.parse().expect("ascii"));
    req
}

/// All image records in the namespace: (name, target digest, pulled-by label).
async fn records(ch: &Channel) -> Vec<(String, String, Option<String>)> {
    let mut list: Vec<_> = ImagesClient::new(ch.clone())
        .list(ns(ListImagesRequest { filters: vec![] }))
        .await
        .expect("list images")
        .into_inner()
        .images
        .into_iter()
        .map(|i| {
            (
                i.name,
                i.target.map(|t| t.digest).unwrap_or_default(),
                i.labels.get(PULLED_BY_LABEL).cloned(),
            )
        })
        .collect();
    list.sort();
    list
}

async fn snapshot_exists(ch: &Channel, key: &str) -> bool {
    match SnapshotsClient::new(ch.clone())
        .stat(ns(StatSnapshotRequest {
            snapshotter: snapshotter(),
            key: key.to_string(),
        }))
        .await
    {
        Ok(r) => {
            let info = r.into_inner().info.expect("info");
            assert_eq!(info.name, key);
            true
        }
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("stat snapshot: {s}"),
    }
}

async fn content_exists(ch: &Channel, digest: &str) -> bool {
    match ContentClient::new(ch.clone())
        .info(ns(InfoRequest {
            digest: digest.to_string(),
        }))
        .await
    {
        Ok(_) => true,
        Err(s) if s.code() == Code::NotFound => false,
        Err(s) => panic!("content info: {s}"),
    }
}

fn failed(r: Result<(), EffectError>) -> String {
    match r {
        Err(EffectError::Failed(m)) => m,
        other => panic!("expected a failure, got {other:?}"),
    }
}

async fn pull_by_digest_unpacks_is_idempotent_and_removable(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let digest = tier.image("e2e/agent:v1", 3, false);
    let reference = tier.reference("e2e/agent", &digest);
    let (manifest, layers, top_chain) = tier.expected_layout(&digest);
    assert_eq!(manifest, digest.oci());
    assert_eq!(layers.len(), 2);
    let agent = tier.agent().await;
    let ch = tier.channel().await;

    assert!(!agent.image_present(&digest).await.expect("present"));
    agent.pull(&reference, &digest).await.expect("pull");
    assert!(agent.image_present(&digest).await.expect("present"));

    // The record: named by the pinned reference, targeting the digest, labelled.
    let got = ImagesClient::new(ch.clone())
        .get(ns(GetImageRequest {
            name: reference.clone(),
        }))
        .await
        .expect("image record")
        .into_inner()
        .image
        .expect("image");
    let target = got.target.expect("target");
    assert_eq!(target.digest, digest.oci());
    assert_eq!(
        target.media_type,
        "application/vnd.oci.image.manifest.v1+json"
    );
    assert_eq!(
        got.labels.get(PULLED_BY_LABEL).map(String::as_str),
        Some("flexnode")
    );
    // Unpacked: the top chainID is a committed snapshot. The lease is gone and GC ran
    // (synchronous lease delete), so what is left is held by the image's references alone.
    assert!(
        snapshot_exists(&ch, &top_chain).await,
        "top chainID snapshot"
    );
    for layer in &layers {
        assert!(content_exists(&ch, layer).await, "layer {layer} in content");
    }
    let (ok, leases) = tier.ctr(&["leases", "ls", "-q"]);
    assert!(ok && leases.trim().is_empty(), "leases left: {leases}");
    // ctr agrees the image is complete and unpacked (REF TYPE DIGEST STATUS SIZE UNPACKED).
    let (ok, check) = tier.ctr(&["images", "check", "--snapshotter", &snapshotter()]);
    assert!(ok, "{check}");
    let line = check
        .lines()
        .find(|l| l.starts_with(&reference))
        .unwrap_or_else(|| panic!("{check}"));
    assert!(line.contains("complete"), "{check}");
    assert_eq!(line.split_whitespace().last(), Some("true"), "{check}");

    // Twice: same single record, nothing new, still present.
    let before = records(&ch).await;
    agent.pull(&reference, &digest).await.expect("second pull");
    assert_eq!(records(&ch).await, before);
    assert_eq!(before.len(), 1);
    assert!(agent.image_present(&digest).await.expect("present"));
    assert!(snapshot_exists(&ch, &top_chain).await);

    // Removed: record gone, and GC took the snapshots and content with it.
    agent.remove_agent_image(&digest).await.expect("remove");
    assert!(!agent.image_present(&digest).await.expect("present"));
    assert!(records(&ch).await.is_empty());
    assert!(
        !snapshot_exists(&ch, &top_chain).await,
        "snapshot left after remove"
    );
    for layer in &layers {
        assert!(
            !content_exists(&ch, layer).await,
            "layer {layer} left after remove"
        );
    }
    // Removing again is a no-op.
    agent
        .remove_agent_image(&digest)
        .await
        .expect("remove again");
}

async fn index_digest_unpacks_the_host_platform(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let digest = tier.image("e2e/multi:v1", 1, true);
    let reference = tier.reference("e2e/multi", &digest);
    let (manifest, layers, top_chain) = tier.expected_layout(&digest);
    assert_ne!(manifest, digest.oci());
    let agent = tier.agent().await.with_platform("linux", "amd64");
    let ch = tier.channel().await;
    agent.pull(&reference, &digest).await.expect("pull index");
    assert!(agent.image_present(&digest).await.expect("present"));
    assert_eq!(
        records(&ch).await,
        vec![(reference.clone(), digest.oci(), Some("flexnode".into()))]
    );
    assert!(snapshot_exists(&ch, &top_chain).await);
    assert!(content_exists(&ch, &manifest).await);
    for layer in &layers {
        assert!(content_exists(&ch, layer).await);
    }
    // A platform the index does not have: a clear failure.
    let riscv = tier.agent().await.with_platform("linux", "riscv64");
    let m = failed(riscv.pull(&reference, &digest).await);
    assert!(m.contains("no linux/riscv64 manifest"), "{m}");
}

async fn bad_pulls_fail_clearly_and_leave_nothing(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let agent = tier.agent().await;
    let ch = tier.channel().await;
    let good = tier.image("e2e/agent:v1", 1, false);

    // A digest the registry does not have.
    let wrong = Sha256Hex::parse(&hex::encode(Sha256::digest(b"not an image"))).expect("hex");
    let m = failed(
        agent
            .pull(&tier.reference("e2e/agent", &wrong), &wrong)
            .await,
    );
    assert!(
        m.contains("not found") && m.contains(&wrong.oci()) && m.contains("e2e/agent"),
        "{m}"
    );
    assert!(!agent.image_present(&wrong).await.expect("present"));
    assert!(records(&ch).await.is_empty());

    // A reference pinned to another digest than the one requested.
    let m = failed(
        agent
            .pull(&tier.reference("e2e/agent", &good), &wrong)
            .await,
    );
    assert!(m.contains("pinned to") && m.contains("requested"), "{m}");
    assert!(records(&ch).await.is_empty());

    // A registry that serves a manifest under the wrong digest: the registry's blob store is
    // content-addressed, so serve a manifest file with other bytes under a digest's path.
    let tampered = tier.image("e2e/tampered:v1", 1, false);
    let path = tier.blob_path(&tampered.oci());
    let mut bytes = std::fs::read(&path).expect("manifest blob");
    bytes.push(b' ');
    std::fs::write(&path, &bytes).expect("tamper manifest");
    let m = failed(
        agent
            .pull(&tier.reference("e2e/tampered", &tampered), &tampered)
            .await,
    );
    assert!(m.contains("sha256 verification failed"), "{m}");
    assert!(records(&ch).await.is_empty());

    // A corrupted layer blob (same size, other bytes): refused before it is committed.
    let corrupt = tier.image("e2e/corrupt:v1", 2, false);
    let (_, layers, top_chain) = tier.expected_layout(&corrupt);
    let big = &layers[1];
    let path = tier.blob_path(big);
    let len = std::fs::metadata(&path).expect("layer blob").len() as usize;
    let mut junk = vec![0u8; len];
    getrandom::fill(&mut junk).expect("random");
    std::fs::write(&path, &junk).expect("corrupt layer");
    let m = failed(
        agent
            .pull(&tier.reference("e2e/corrupt", &corrupt), &corrupt)
            .await,
    );
    assert!(
        m.contains("sha256 verification failed") && m.contains(big.as_str()),
        "{m}"
    );
    assert!(!agent.image_present(&corrupt).await.expect("present"));
    assert!(records(&ch).await.is_empty());
    assert!(
        !content_exists(&ch, big).await,
        "corrupt layer was committed"
    );
    assert!(!snapshot_exists(&ch, &top_chain).await);
    let (ok, leases) = tier.ctr(&["leases", "ls", "-q"]);
    assert!(ok && leases.trim().is_empty(), "leases left: {leases}");

    // After all that, the good image still pulls.
    agent
        .pull(&tier.reference("e2e/agent", &good), &good)
        .await
        .expect("good pull");
    assert!(agent.image_present(&good).await.expect("present"));
}

/// The TLS registries: the right CA and credentials pull (basic auth with blobs redirected to
/// another origin, and the Bearer token flow); no extra CA, the wrong CA, wrong or missing
/// credentials and a credentials file others can read are refused, clearly, before anything is
/// written, with no secret in the message.
async fn secure_registries_need_the_right_ca_and_credentials(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let ch = tier.channel().await;
    let secure = tier.secure();
    let wrong_password = std::fs::read_to_string(&secure.wrong_credentials)
        .expect("wrong credentials")
        .split('"')
        .skip_while(|s| *s != "password")
        .nth(2)
        .expect("wrong password")
        .to_string();
    let no_secret = |m: &str| {
        assert!(
            !m.contains(&secure.password) && !m.contains(&wrong_password),
            "a password in: {m}"
        );
    };

    // Basic auth; every blob is answered with a redirect to the blob store on another port,
    // which refuses a request carrying the credentials.
    let basic = tier.image("e2e/basic:v1", 1, false);
    let (manifest, layers, top_chain) = tier.expected_layout(&basic);
    assert_eq!(manifest, basic.oci());
    let reference = format!("{}/e2e/basic@{}", secure.basic, basic.oci());
    registry_agent(&tier, Some(&secure.lab_ca), Some(&secure.credentials))
        .await
        .pull(&reference, &basic)
        .await
        .expect("basic-auth pull");
    assert!(snapshot_exists(&ch, &top_chain).await);
    let log = std::fs::read_to_string(&secure.aux_log).expect("aux log");
    for layer in &layers {
        let hex = layer.trim_start_matches("sha256:");
        assert!(
            log.lines()
                .any(|l| l.contains(&format!("/{hex}/data 200 auth=no"))),
            "layer {layer} was not fetched from the blob store without credentials:\n{log}"
        );
    }
    assert!(!log.contains("auth=yes") || log.contains("/token"), "{log}");
    assert!(
        !log.contains(" 403 "),
        "credentials followed a redirect:\n{log}"
    );

    // The token flow: the registry's challenge names registry-aux as the realm.
    let token = tier.image("e2e/token:v1", 1, false);
    let reference = format!("{}/e2e/token@{}", secure.token, token.oci());
    registry_agent(&tier, Some(&secure.lab_ca), Some(&secure.credentials))
        .await
        .pull(&reference, &token)
        .await
        .expect("token pull");
    assert!(
        registry_agent(&tier, Some(&secure.lab_ca), Some(&secure.credentials))
            .await
            .image_present(&token)
            .await
            .expect("present")
    );
    let log = std::fs::read_to_string(&secure.aux_log).expect("aux log");
    assert!(log.contains("GET /token 200 auth=yes"), "{log}");

    // Refusals, each before anything is written.
    let refused = tier.image("e2e/refused:v1", 1, false);
    let records_before = records(&ch).await;
    // (what, registry, extra CA, credentials file, the message says)
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a Path>,
        Option<&'a Path>,
        &'a [&'a str],
    );
    let cases: [Case; 5] = [
        (
            "no extra CA",
            &secure.basic,
            None,
            Some(&secure.credentials),
            &["TLS", "not signed by a CA this node trusts"],
        ),
        (
            "the wrong CA",
            &secure.token,
            Some(&secure.other_ca),
            Some(&secure.credentials),
            &["TLS", "not signed by a CA this node trusts"],
        ),
        (
            "wrong basic credentials",
            &secure.basic,
            Some(&secure.lab_ca),
            Some(&secure.wrong_credentials),
            &["HTTP 401", "wrong credentials"],
        ),
        (
            "no basic credentials",
            &secure.basic,
            Some(&secure.lab_ca),
            None,
            &["HTTP 401"],
        ),
        (
            "wrong token credentials",
            &secure.token,
            Some(&secure.lab_ca),
            Some(&secure.wrong_credentials),
            &["token service refused the credentials"],
        ),
    ];
    for (what, registry, ca, credentials, expect) in cases {
        let reference = format!("{registry}/e2e/refused@{}", refused.oci());
        let m = failed(
            registry_agent(&tier, ca, credentials)
                .await
                .pull(&reference, &refused)
                .await,
        );
        eprintln!("{what}: {m}");
        for e in expect {
            assert!(m.contains(e), "{what}: {m}");
        }
        assert!(
            m.contains(registry),
            "{what}: the registry is not named: {m}"
        );
        no_secret(&m);
        assert_eq!(records(&ch).await, records_before, "{what}");
    }
    let (ok, leases) = tier.ctr(&["leases", "ls", "-q"]);
    assert!(ok && leases.trim().is_empty(), "leases left: {leases}");

    // A credentials file others can read is refused, naming the fix.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secure.credentials, std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let reference = format!("{}/e2e/refused@{}", secure.basic, refused.oci());
    let m = failed(
        registry_agent(&tier, Some(&secure.lab_ca), Some(&secure.credentials))
            .await
            .pull(&reference, &refused)
            .await,
    );
    assert!(m.contains("0600"), "{m}");
    no_secret(&m);
}

/// An agent trusting `ca` besides the system store, with `credentials`.
async fn registry_agent(
    tier: &Tier,
    ca: Option<&Path>,
    credentials: Option<&Path>,
) -> GrpcContainerd {
    tier.agent().await.with_registry(RegistryConfig {
        trust: Trust {
            extra_ca_file: ca.map(Path::to_path_buf),
        },
        credentials: credentials.map(Path::to_path_buf),
    })
}

async fn images_not_pulled_by_the_agent_are_never_removed(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let agent = tier.agent().await;
    let ch = tier.channel().await;
    let digest = tier.image("e2e/other:v1", 1, false);
    let (_, _, top_chain) = tier.expected_layout(&digest);
    // Someone else (an operator with ctr) pulls it, by tag.
    let theirs = format!("{}/e2e/other:v1", tier.registry);
    let (ok, out) = tier.ctr(&[
        "images",
        "pull",
        "--plain-http",
        "--snapshotter",
        &snapshotter(),
        &theirs,
    ]);
    assert!(ok, "ctr pull: {out}");
    assert!(!agent.image_present(&digest).await.expect("present"));
    let m = failed(agent.remove_agent_image(&digest).await);
    assert!(
        m.contains("not pulled by flexnode") && m.contains(&theirs) && m.contains("refusing"),
        "{m}"
    );
    assert_eq!(
        records(&ch).await,
        vec![(theirs.clone(), digest.oci(), None)]
    );

    // The agent pulls the same digest: its own record beside theirs; removing it takes only
    // the agent's record, and their image stays whole.
    let ours = tier.reference("e2e/other", &digest);
    agent.pull(&ours, &digest).await.expect("pull");
    assert!(agent.image_present(&digest).await.expect("present"));
    assert_eq!(records(&ch).await.len(), 2);
    agent
        .remove_agent_image(&digest)
        .await
        .expect("remove ours");
    assert_eq!(
        records(&ch).await,
        vec![(theirs.clone(), digest.oci(), None)]
    );
    assert!(
        snapshot_exists(&ch, &top_chain).await,
        "their snapshot was removed"
    );
    let m = failed(agent.remove_agent_image(&digest).await);
    assert!(m.contains("refusing"), "{m}");
}

/// Pull progress of a two-layer image (a tiny layer, then 3 MiB of random data): reported
/// per ~1 MiB and per layer, never decreasing, ending at the manifest's totals, without the
/// registry address; a second pull (all content there) reports each layer once.
async fn pull_reports_progress(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let digest = tier.image("e2e/progress:v1", 3, false);
    let reference = tier.reference("e2e/progress", &digest);
    let manifest = tier.blob_json(&digest.oci());
    let layers: Vec<(String, u64)> = manifest["layers"]
        .as_array()
        .expect("layers")
        .iter()
        .map(|l| {
            (
                l["digest"].as_str().expect("digest").to_string(),
                l["size"].as_u64().expect("size"),
            )
        })
        .collect();
    assert_eq!(layers.len(), 2);
    let total: u64 = layers.iter().map(|l| l.1).sum();
    assert!(layers[1].1 > 3 << 20, "random data does not compress");
    let seen: Arc<Mutex<Vec<PullProgress>>> = Arc::default();
    let sink = seen.clone();
    let agent = tier
        .agent()
        .await
        .with_progress(Arc::new(move |p| sink.lock().expect("lock").push(p)));

    let started = Instant::now();
    agent.pull(&reference, &digest).await.expect("pull");
    let pull_ms = started.elapsed().as_millis();
    let events = std::mem::take(&mut *seen.lock().expect("lock"));
    let check = |events: &[PullProgress], streamed: bool| {
        let last = events.last().expect("progress reported");
        assert_eq!(
            (last.bytes_done, last.layers_done),
            (total, 2),
            "{events:#?}"
        );
        let mut prev: Option<&PullProgress> = None;
        for e in events {
            assert_eq!((e.bytes_total, e.layers_total), (total, 2), "{e:?}");
            assert!(e.bytes_done <= total, "{e:?}");
            let text = format!("{e:?}");
            assert!(
                !text.contains(&tier.registry) && !text.contains("e2e/progress"),
                "{text}"
            );
            // Layers in manifest order: reports of layer i come while i layers are done.
            let i = layers
                .iter()
                .position(|l| l.0 == e.layer_digest)
                .unwrap_or_else(|| panic!("not a layer of the image: {e:?}"));
            assert!(e.layers_done == i || e.layers_done == i + 1, "{e:?}");
            if let Some(p) = prev {
                assert!(
                    (e.bytes_done, e.layers_done) > (p.bytes_done, p.layers_done)
                        && e.bytes_done >= p.bytes_done
                        && e.layers_done >= p.layers_done,
                    "not increasing: {p:?} then {e:?}"
                );
                // ~1 MiB apart: a report per PROGRESS_EVERY, chunks are at most 1 MiB.
                assert!(
                    !streamed || e.bytes_done - p.bytes_done <= PROGRESS_EVERY + (1 << 20),
                    "{events:#?}"
                );
            }
            prev = Some(e);
        }
        // One report as each layer is complete.
        for (i, (layer, size)) in layers.iter().enumerate() {
            let before: u64 = layers[..i].iter().map(|l| l.1).sum();
            assert!(
                events.iter().any(|e| e.layer_digest == *layer
                    && e.layers_done == i + 1
                    && e.bytes_done == before + size),
                "no completion report for layer {i}: {events:#?}"
            );
        }
    };
    check(&events, true);
    // The 3 MiB layer was reported on the way, at least every MiB.
    let during = events
        .iter()
        .filter(|e| e.layer_digest == layers[1].0 && e.layers_done == 1)
        .count();
    assert!(during >= 3, "{events:#?}");

    // Everything is there: one report per layer, same end.
    agent.pull(&reference, &digest).await.expect("second pull");
    let again = std::mem::take(&mut *seen.lock().expect("lock"));
    check(&again, false);
    assert_eq!(again.len(), 2, "{again:#?}");

    // Without a callback: tracing events only (nothing to observe here but success).
    tier.agent()
        .await
        .pull(&reference, &digest)
        .await
        .expect("pull with the default progress");
    eprintln!(
        "progress ({flavor:?}): {} reports for {total} bytes in 2 layers, pull {pull_ms} ms",
        events.len()
    );
}

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
