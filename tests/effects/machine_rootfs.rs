//! A machine's tree from an image (`GrpcContainerd::unpack_image_into`), against a real
//! containerd (1.6 and 2.x) and registry (`e2e/containerd/run`): images of hand-made layers,
//! pushed with `image/build push`, pulled by digest, unpacked into a directory. Whiteouts and
//! opaque directories apply to the lower layers only; owners, modes, set-id bits, hard links,
//! symlinks and xattrs come through; a layer that reaches outside the tree through a symlink
//! is refused and leaves the outside as it was.

use crate::support;

use flexnode::effects::Containerd;
use flexnode::effects::containerd::GrpcContainerd;
use flexnode::lifecycle::agent::Sha256Hex;
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use support::containerd::{Flavor, NS, Tier, both_versions, snapshotter};

both_versions!(
    layers_apply_in_order_with_whiteouts_and_metadata,
    a_layer_reaching_outside_through_a_symlink_is_refused,
    a_side_is_provisioned_from_a_node_image_with_its_kubelet_files,
    an_offline_node_provisions_from_its_image_archive,
);

/// One tar entry of a hand-made layer.
enum E<'a> {
    Dir(&'a str, u32),
    File(&'a str, &'a [u8], u32, u64),
    /// A file with an xattr (`user.flexnode`).
    Xattr(&'a str, &'a [u8], &'a str),
    Link(&'a str, &'a str),
    Hard(&'a str, &'a str),
}

fn layer(entries: &[E]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            E::Dir(path, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                b.append_data(&mut h, path, std::io::empty()).expect("dir");
            }
            E::File(path, data, mode, uid) => {
                h.set_mode(*mode);
                h.set_uid(*uid);
                h.set_gid(*uid);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, *data).expect("file");
            }
            E::Xattr(path, data, value) => {
                b.append_pax_extensions([("SCHILY.xattr.user.flexnode", value.as_bytes())])
                    .expect("pax");
                h.set_mode(0o644);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, path, *data).expect("file");
            }
            E::Link(path, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, path, target).expect("symlink");
            }
            E::Hard(path, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                b.append_link(&mut h, path, target).expect("hard link");
            }
        }
    }
    b.into_inner().expect("tar")
}

fn sha(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// An OCI image layout in `dir` of `layers` (tars), tagged `tag`: an index over one amd64
/// manifest. Returns the index's digest.
fn layout(dir: &Path, layers: &[Vec<u8>], tag: &str) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).expect("blobs");
    let put = |bytes: &[u8]| -> (String, usize) {
        let d = sha(bytes);
        std::fs::write(blobs.join(&d[7..]), bytes).expect("blob");
        (d, bytes.len())
    };
    let mut descs = Vec::new();
    let mut diff_ids = Vec::new();
    for raw in layers {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, raw).expect("gzip");
        let (d, size) = put(&gz.finish().expect("gzip"));
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": size}));
        diff_ids.push(sha(raw));
    }
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids}, "config": {}});
    let (cd, cs) = put(config.to_string().as_bytes());
    let manifest = serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cs},
        "layers": descs});
    let (md, ms) = put(manifest.to_string().as_bytes());
    let index = serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md,
            "size": ms, "platform": {"architecture": "amd64", "os": "linux"}}]});
    let (id, is) = put(index.to_string().as_bytes());
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": id, "size": is,
        "annotations": {"org.opencontainers.image.ref.name": tag}}]});
    std::fs::write(dir.join("index.json"), top.to_string()).expect("index.json");
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).expect("layout");
    id
}

/// An OCI layout at `dir` of one amd64 image of `layers` (gzip) pushed to the tier's registry
/// as `repo` and pulled by its index digest (into the content store only, as node images are,
/// when `content_only`); the agent's client, that digest, and how often the client's
/// heartbeat (a sign of life during a long pull or unpack) was called so far, which the pull
/// did at least once per layer.
async fn pushed_and_pulled(
    tier: &Tier,
    dir: &Path,
    repo: &str,
    layers: &[Vec<u8>],
    content_only: bool,
) -> (GrpcContainerd, Sha256Hex, Arc<AtomicUsize>) {
    layout(dir, layers, "t");
    let (pushed, _) = support::image::push(dir, &format!("{}/{repo}:t", tier.registry), None);
    let digest = Sha256Hex::parse(&pushed).expect("pushed digest");
    let beats = Arc::new(AtomicUsize::new(0));
    let counter = beats.clone();
    let agent = GrpcContainerd::connect(&tier.socket, NS)
        .await
        .expect("connect")
        .with_snapshotter(&snapshotter())
        .with_heartbeat(Arc::new(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        }));
    let reference = tier.reference(repo, &digest);
    if content_only {
        agent.pull_content(&reference, &digest, None).await
    } else {
        agent.pull(&reference, &digest).await
    }
    .expect("pull");
    assert!(
        beats.load(Ordering::Relaxed) >= layers.len(),
        "the pull's heartbeat: {beats:?} for {} layers",
        layers.len()
    );
    (agent, digest, beats)
}

async fn layers_apply_in_order_with_whiteouts_and_metadata(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let work = tempfile::tempdir().expect("tmp");
    let lower = layer(&[
        E::Dir("etc", 0o755),
        E::File("etc/keep", b"kept\n", 0o644, 0),
        E::File("etc/gone", b"whited out\n", 0o644, 0),
        E::Dir("opaque", 0o755),
        E::File("opaque/old", b"lower\n", 0o644, 0),
        E::Dir("usr/bin", 0o755),
        E::File("usr/bin/tool", b"#!tool\n", 0o4755, 1000),
        E::Hard("usr/bin/tool-again", "usr/bin/tool"),
        E::Link("etc/os-release", "../usr/lib/os-release"),
        E::Xattr("etc/tagged", b"x\n", "yes"),
    ]);
    let upper = layer(&[
        E::File("etc/.wh.gone", b"", 0o644, 0),
        E::Dir("opaque", 0o755),
        E::File("opaque/.wh..wh..opq", b"", 0o644, 0),
        E::File("opaque/new", b"upper\n", 0o600, 0),
        E::File("etc/keep", b"replaced\n", 0o640, 0),
    ]);
    let (agent, digest, beats) = pushed_and_pulled(
        &tier,
        &work.path().join("layout"),
        "e2e/rootfs",
        &[lower, upper],
        false,
    )
    .await;
    let tree = work.path().join("tree");
    let pulled = beats.load(Ordering::Relaxed);
    agent
        .unpack_image_into(&digest, &tree)
        .await
        .expect("unpack");
    // The daemon's sign of life during a long unpack (src/reconcile/notify.rs): per chunk
    // of each layer streamed out of the content store.
    assert!(
        beats.load(Ordering::Relaxed) >= pulled + 2,
        "the unpack's heartbeat: {} after the pull's {pulled}, for 2 layers",
        beats.load(Ordering::Relaxed)
    );

    let read = |p: &str| std::fs::read_to_string(tree.join(p)).expect(p);
    let meta = |p: &str| std::fs::symlink_metadata(tree.join(p)).expect(p);
    assert_eq!(read("etc/keep"), "replaced\n");
    assert_eq!(meta("etc/keep").permissions().mode() & 0o7777, 0o640);
    assert!(
        !tree.join("etc/gone").exists(),
        "the whiteout removed etc/gone"
    );
    assert!(
        !tree.join("opaque/old").exists(),
        "the opaque marker emptied opaque/"
    );
    assert_eq!(read("opaque/new"), "upper\n");
    assert!(!tree.join("opaque/.wh..wh..opq").exists() && !tree.join("etc/.wh.gone").exists());
    let tool = meta("usr/bin/tool");
    assert_eq!(tool.permissions().mode() & 0o7777, 0o4755);
    assert_eq!((tool.uid(), tool.gid()), (1000, 1000));
    assert_eq!(tool.mtime(), 1_700_000_000);
    assert_eq!(meta("usr/bin/tool-again").ino(), tool.ino(), "a hard link");
    assert_eq!(
        std::fs::read_link(tree.join("etc/os-release")).expect("link"),
        Path::new("../usr/lib/os-release")
    );
    // getfattr: Debian's attr (e2e/prereqs).
    let xattr = std::process::Command::new("getfattr")
        .args(["--only-values", "-n", "user.flexnode"])
        .arg(tree.join("etc/tagged"))
        .output()
        .expect("run getfattr");
    assert_eq!(String::from_utf8_lossy(&xattr.stdout), "yes", "{xattr:?}");

    // Again onto the finished tree: the same result.
    agent
        .unpack_image_into(&digest, &tree)
        .await
        .expect("unpack again");
    assert_eq!(read("etc/keep"), "replaced\n");
    assert!(!tree.join("opaque/old").exists());
}

async fn a_layer_reaching_outside_through_a_symlink_is_refused(flavor: Flavor) {
    let tier = Tier::up(flavor);
    let work = tempfile::tempdir().expect("tmp");
    let outside = work.path().join("outside");
    std::fs::create_dir(&outside).expect("outside");
    std::fs::write(outside.join("sentinel"), "untouched\n").expect("sentinel");
    let out = outside.display().to_string();
    let lower = layer(&[E::Link("escape", &out)]);
    // A whiteout through the link names a path inside the tree (nothing there), a file
    // through it would land outside: refused.
    let upper = layer(&[
        E::File("escape/.wh.sentinel", b"", 0o644, 0),
        E::File("escape/planted", b"planted\n", 0o644, 0),
    ]);
    let (agent, digest, _) = pushed_and_pulled(
        &tier,
        &work.path().join("layout"),
        "e2e/escape",
        &[lower, upper],
        false,
    )
    .await;
    let tree = work.path().join("tree");
    let err = agent
        .unpack_image_into(&digest, &tree)
        .await
        .expect_err("a file through a link to outside the tree");
    assert!(err.to_string().contains("outside of destination"), "{err}");
    assert_eq!(
        std::fs::read_to_string(outside.join("sentinel")).expect("sentinel"),
        "untouched\n"
    );
    assert!(
        !outside.join("planted").exists(),
        "nothing was planted outside"
    );
}

/// The host's half of `ProvisionMachine` from a node image around the real unpack: the side's
/// tree cleared, the image unpacked into it, the kubelet's files and the nspawn settings
/// written, the marker last. The image's own absolute link (`etc/kubernetes ->
/// /etc/kubernetes-image`) is followed inside the tree, never onto this host. The other side
/// then gets the first side's kubelet identity (a repave without the bootstrap token).
async fn a_side_is_provisioned_from_a_node_image_with_its_kubelet_files(flavor: Flavor) {
    use flexnode::effects::host::{FsHost, HostLayout, KubeletInputs, NSPAWN_KUBELET_SETTINGS};
    use flexnode::effects::{Host, MachineTree};
    use flexnode::lifecycle::state::Side;
    let tier = Tier::up(flavor);
    let work = tempfile::tempdir().expect("tmp");
    let image = layer(&[
        E::Dir("etc", 0o755),
        E::Dir("etc/kubernetes-image", 0o755),
        E::Link("etc/kubernetes", "/etc/kubernetes-image"),
        E::File("etc/os-release", b"ID=debian\n", 0o644, 0),
        E::Dir("usr/local/bin", 0o755),
        E::File("usr/local/bin/kubelet", b"#!kubelet\n", 0o755, 0),
    ]);
    let (agent, digest, _) = pushed_and_pulled(
        &tier,
        &work.path().join("layout"),
        "e2e/node",
        &[image],
        true,
    )
    .await;
    let root = work.path().join("host");
    std::fs::create_dir(&root).expect("root");
    let token = work.path().join("token");
    std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
    let host = FsHost::new(HostLayout::at(&root)).with_kubelet(KubeletInputs {
        node_name: "edge-07".into(),
        server: "https://10.0.2.100:6443".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n".to_vec(),
        credential: flexnode::effects::host::KubeletSource::BootstrapTokenFile(token),
        trusted_ca_file: None,
        registry_credentials_file: None,
        sandbox_image: flexnode::config::DEFAULT_SANDBOX_IMAGE.into(),
        sandbox_image_archive: None,
        pod_cidr: "10.88.0.0/16".into(),
        tuning: flexnode::config::KubeletTuning {
            max_pods: Some(42),
            cluster_dns: vec![std::net::IpAddr::from([10, 96, 0, 10])],
            ..Default::default()
        },
    });
    // The Machine's settings for its Node.
    let goal = flexnode::lifecycle::state::Goal {
        node: flexnode::lifecycle::state::NodeSettings {
            labels: [("team".to_string(), "blue".to_string())].into(),
            taints: vec!["dedicated=edge:NoSchedule".into()],
        },
        ..flexnode::lifecycle::state::Goal::new(3, "v1.34.12")
    };
    // Something half unpacked before: cleared first.
    let tree = root.join("var/lib/machines/kube1");
    std::fs::create_dir_all(tree.join("stale")).expect("stale");
    let dir = host.clear_machine_tree(Side::Kube1).await.expect("clear");
    assert_eq!(dir, tree);
    assert!(!tree.join("stale").exists());
    assert_eq!(host.machine_rootfs(Side::Kube1).await, Ok(None));
    Containerd::unpack_image_into(&agent, &digest, &dir)
        .await
        .expect("unpack");
    assert_eq!(
        host.machine_rootfs(Side::Kube1).await,
        Ok(None),
        "no marker before complete"
    );
    host.complete_machine(Side::Kube1, &goal, &digest)
        .await
        .expect("complete");
    assert_eq!(
        host.machine_rootfs(Side::Kube1).await,
        Ok(Some(MachineTree {
            kubernetes_version: "v1.34.12".into(),
            image: Some(digest.clone()),
            generation: Some(3),
        }))
    );
    // The goal's labels and taints and the configuration's settings, in the kubelet's files
    // (through the image's own link for etc/kubernetes).
    let env = std::fs::read_to_string(tree.join("etc/kubernetes-image/kubelet.env")).expect("env");
    assert!(env.contains(" --node-labels=team=blue\n"), "{env}");
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(tree.join("etc/kubernetes-image/kubelet.yaml")).expect("config"),
    )
    .expect("json");
    assert_eq!(config["maxPods"], 42);
    assert_eq!(config["clusterDNS"], serde_json::json!(["10.96.0.10"]));
    assert_eq!(
        config["registerWithTaints"],
        serde_json::json!([{"key": "dedicated", "value": "edge", "effect": "NoSchedule"}])
    );
    let kubeconfig = tree.join("etc/kubernetes-image/bootstrap.kubeconfig");
    let meta = std::fs::metadata(&kubeconfig).expect("the kubeconfig through the image's link");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert!(
        std::fs::read_to_string(&kubeconfig)
            .expect("read")
            .contains("abcdef.0123456789abcdef")
    );
    assert!(
        !Path::new("/etc/kubernetes-image").exists(),
        "a write left the tree"
    );
    assert_eq!(
        std::fs::read_to_string(tree.join("usr/local/bin/kubelet")).expect("kubelet"),
        "#!kubelet\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/systemd/nspawn/kube1.nspawn")).expect("nspawn"),
        NSPAWN_KUBELET_SETTINGS
    );
    // The kubelet on kube1 bootstrapped: its rotated certificate (a link with an absolute
    // target, as the kubelet makes it) and kubeconfig go to kube2 when kube2 is provisioned.
    let pki = tree.join("var/lib/kubelet/pki");
    std::fs::create_dir_all(&pki).expect("pki");
    std::fs::write(pki.join("kubelet-client-2026-12-02.pem"), "CERT AND KEY\n").expect("cert");
    std::os::unix::fs::symlink(
        "/var/lib/kubelet/pki/kubelet-client-2026-12-02.pem",
        pki.join("kubelet-client-current.pem"),
    )
    .expect("link");
    std::fs::write(tree.join("var/lib/kubelet/kubeconfig"), "KUBECONFIG\n").expect("kubeconfig");
    let kube2 = host
        .clear_machine_tree(Side::Kube2)
        .await
        .expect("clear kube2");
    Containerd::unpack_image_into(&agent, &digest, &kube2)
        .await
        .expect("unpack kube2");
    host.complete_machine(Side::Kube2, &goal, &digest)
        .await
        .expect("complete kube2");
    for (rel, want) in [
        (
            "var/lib/kubelet/pki/kubelet-client-current.pem",
            "CERT AND KEY\n",
        ),
        ("var/lib/kubelet/kubeconfig", "KUBECONFIG\n"),
    ] {
        let p = kube2.join(rel);
        assert_eq!(std::fs::read_to_string(&p).expect(rel), want);
        let meta = std::fs::symlink_metadata(&p).expect(rel);
        assert!(meta.is_file(), "{rel} is a copy, not a link");
        assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{rel}");
    }
    host.remove_machine(Side::Kube2)
        .await
        .expect("remove kube2");

    // Removal takes the tree and its settings.
    host.remove_machine(Side::Kube1).await.expect("remove");
    assert!(!tree.exists());
    assert!(!root.join("etc/systemd/nspawn/kube1.nspawn").exists());
    assert!(!host.machine_tree_exists(Side::Kube1).await.expect("probe"));
}

/// An offline node's node image (`nodeImageArchive`): an OCI layout, as a directory and as a
/// tar of it, resolved and pulled with its registry unreachable (port 1 refuses), then
/// unpacked; a blob the archive lacks is asked of the registry (and fails naming it); a
/// tampered blob is refused and nothing of it is committed.
async fn an_offline_node_provisions_from_its_image_archive(flavor: Flavor) {
    use flexnode::lifecycle::agent::ImageRef;
    let tier = Tier::up(flavor);
    let work = tempfile::tempdir().expect("tmp");
    let w = work.path();
    let unreachable = "127.0.0.1:1";
    let image = ImageRef {
        registry: unreachable.into(),
        repository: "e2e/offline".into(),
        tag: Some("v1.34.12".into()),
    };
    let tar_of = |dir: &Path, to: &Path| {
        let mut b = tar::Builder::new(std::fs::File::create(to).expect("archive"));
        b.append_dir_all(".", dir).expect("tar");
        b.finish().expect("tar");
    };
    for (i, form) in ["directory", "tar"].into_iter().enumerate() {
        let dir = w.join(format!("layout-{i}"));
        let top = layout(
            &dir,
            &[layer(&[
                E::Dir("etc", 0o755),
                E::File("etc/offline", format!("{form}\n").as_bytes(), 0o644, 0),
            ])],
            "v1.34.12",
        );
        let archive = if form == "tar" {
            let file = w.join("node.oci.tar");
            tar_of(&dir, &file);
            file
        } else {
            dir
        };
        let agent = tier.grpc(Default::default()).await;
        let digest = Containerd::resolve_tag(&agent, &image, Some(&archive))
            .await
            .expect("resolved from the archive");
        assert_eq!(digest.oci(), top, "{form}");
        let reference = format!("{unreachable}/e2e/offline@{top}");
        Containerd::pull_content(&agent, &reference, &digest, Some(&archive))
            .await
            .unwrap_or_else(|e| panic!("{form}: {e}"));
        let tree = w.join(format!("tree-{i}"));
        Containerd::unpack_image_into(&agent, &digest, &tree)
            .await
            .expect("unpack");
        assert_eq!(
            std::fs::read_to_string(tree.join("etc/offline")).expect("file"),
            format!("{form}\n")
        );
    }

    // Without the archive there, the registry is asked: unreachable, and named.
    let agent = tier.grpc(Default::default()).await;
    let m = match Containerd::resolve_tag(&agent, &image, Some(&w.join("absent.tar"))).await {
        Err(e) => e.to_string(),
        Ok(d) => panic!("resolved without archive or registry: {d:?}"),
    };
    assert!(m.contains(unreachable), "{m}");

    // A layer the archive lacks, and a layer whose bytes were changed.
    for case in ["missing", "tampered"] {
        let dir = w.join(case);
        let top = layout(
            &dir,
            &[layer(&[E::File(case, case.as_bytes(), 0o644, 0)])],
            "v1.34.12",
        );
        let layer_blob = std::fs::read_dir(dir.join("blobs/sha256"))
            .expect("blobs")
            .map(|e| e.expect("entry").path())
            .max_by_key(|p| std::fs::metadata(p).expect("stat").len())
            .expect("the layer, the largest blob");
        let layer_digest = format!(
            "sha256:{}",
            layer_blob
                .file_name()
                .and_then(|n| n.to_str())
                .expect("name")
        );
        if case == "missing" {
            std::fs::remove_file(&layer_blob).expect("rm");
        } else {
            let mut bytes = std::fs::read(&layer_blob).expect("read");
            let last = bytes.len() - 1;
            bytes[last] ^= 0xff;
            std::fs::write(&layer_blob, bytes).expect("write");
        }
        let digest = Sha256Hex::parse(&top).expect("digest");
        let reference = format!("{unreachable}/e2e/offline@{top}");
        let m = match Containerd::pull_content(&agent, &reference, &digest, Some(&dir)).await {
            Err(e) => e.to_string(),
            Ok(()) => panic!("{case}: pulled"),
        };
        let expected = if case == "missing" {
            unreachable
        } else {
            "sha256 verification failed"
        };
        assert!(m.contains(expected), "{case}: {m}");
        let content = std::process::Command::new(&tier.ctr)
            .arg("-a")
            .arg(&tier.socket)
            .args(["-n", NS, "content", "ls", "-q"])
            .output()
            .expect("ctr");
        assert!(content.status.success(), "{content:?}");
        let content = String::from_utf8_lossy(&content.stdout);
        assert!(!content.contains(&layer_digest), "{case}: {content}");
    }
}
