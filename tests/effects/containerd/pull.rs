//! Pulls (`src/effects/containerd/pull.rs`, `registry.rs`, `unpack.rs`): by digest and by
//! index, refused and failing ones leaving nothing, secure registries, images not the
//! agent's, progress.

use super::*;

both_versions!(
    pull_by_digest_unpacks_is_idempotent_and_removable,
    secure_registries_need_the_right_ca_and_credentials,
    index_digest_unpacks_the_host_platform,
    bad_pulls_fail_clearly_and_leave_nothing,
    images_not_pulled_by_the_agent_are_never_removed,
    pull_reports_progress,
);

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

    // A node image pattern's tag resolved to its digest through the same token flow; a tag
    // the registry does not have is named, without a credential.
    let tagged = registry_agent(&tier, Some(&secure.lab_ca), Some(&secure.credentials)).await;
    let image = |tag: &str| flexnode::lifecycle::agent::ImageRef {
        registry: secure.token.clone(),
        repository: "e2e/token".into(),
        tag: Some(tag.into()),
    };
    assert_eq!(
        Containerd::resolve_tag(&tagged, &image("v1"), None)
            .await
            .expect("resolve"),
        token
    );
    let missing = format!("{}/e2e/token:v9", secure.token);
    let m = match Containerd::resolve_tag(&tagged, &image("v9"), None).await {
        Err(EffectError::Failed(m)) => m,
        other => panic!("a missing tag: {other:?}"),
    };
    assert!(m.contains(&missing) && m.contains("not found"), "{m}");
    no_secret(&m);

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
