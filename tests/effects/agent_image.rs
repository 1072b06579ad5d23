//! The agent's OCI image (`image/build`): an index over linux/amd64 and linux/arm64, each a
//! one-layer rootfs holding exactly the binary, its loader and libraries, the CA bundle and
//! nsswitch.conf (no shell); building twice gives the same digests and the same OCI archive;
//! the amd64 rootfs runs `flexnode version` (chroot) and the arm64 one under qemu-user, each
//! printing this build's version. Then the image goes the way an install takes it: pushed over
//! TLS with basic auth (`image/build push`), pulled by its index digest through the agent's
//! registry path from the token-auth registry, and run in a containerd container.

use crate::support;

use flate2::read::GzDecoder;
use flexnode::effects::Containerd;
use flexnode::lifecycle::agent::Sha256Hex;
use flexnode_test_tier::tier;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use support::containerd::{Flavor, Tier};
use support::image::{build, push};

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    std::fs::read(layout.join("blobs/sha256").join(hex)).expect("blob")
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("json")
}

/// Unpacks the layer of `arch` into `root`; returns its entries as (path, mode, uid, mtime).
fn unpack(layout: &Path, index: &Value, arch: &str, root: &Path) -> Vec<(String, u32, u64, u64)> {
    let desc = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .find(|m| m["platform"]["architecture"] == arch)
        .unwrap_or_else(|| panic!("no {arch} manifest in {index}"));
    assert_eq!(desc["platform"]["os"], "linux");
    let manifest = json(&blob(layout, desc["digest"].as_str().expect("digest")));
    let layers = manifest["layers"].as_array().expect("layers");
    assert_eq!(layers.len(), 1, "{manifest}");
    let config = json(&blob(
        layout,
        manifest["config"]["digest"].as_str().expect("config"),
    ));
    assert_eq!(config["architecture"], arch);
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/bin/flexnode");
    let gz = blob(layout, layers[0]["digest"].as_str().expect("layer"));
    let mut entries = Vec::new();
    let mut tar = tar::Archive::new(GzDecoder::new(&gz[..]));
    for e in tar.entries().expect("entries") {
        let e = e.expect("entry");
        let h = e.header();
        entries.push((
            e.path()
                .expect("path")
                .to_string_lossy()
                .trim_end_matches('/')
                .to_string(),
            h.mode().expect("mode"),
            h.uid().expect("uid"),
            h.mtime().expect("mtime"),
        ));
    }
    let mut tar = tar::Archive::new(GzDecoder::new(&gz[..]));
    tar.set_preserve_permissions(true);
    tar.unpack(root).expect("unpack");
    entries
}

fn version_line(out: std::process::Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The image built once for this test binary: (its directory, the index digest).
fn built() -> &'static (tempfile::TempDir, String) {
    static BUILT: OnceLock<(tempfile::TempDir, String)> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tmp");
        let archive = dir.path().join("a.tar");
        let digest = build(
            &dir.path().join("a"),
            &["--archive", archive.to_str().expect("path")],
        );
        assert!(
            digest.starts_with("sha256:") && digest.len() == 71,
            "{digest}"
        );
        (dir, digest)
    })
}

#[test]
fn the_image_is_reproducible_minimal_and_runs_on_both_architectures() {
    let (first, digest) = built();
    let digest = digest.clone();
    let dir = tempfile::tempdir().expect("tmp");
    let (a, b) = (first.path().join("a"), dir.path().join("b"));
    let (archive_a, archive_b) = (first.path().join("a.tar"), dir.path().join("b.tar"));
    // Again, from scratch (cargo finds the binaries built): the same bytes.
    let again = build(&b, &["--archive", archive_b.to_str().expect("path")]);
    assert_eq!(again, digest, "building twice gave another digest");
    assert_eq!(
        std::fs::read(&archive_a).expect("a"),
        std::fs::read(&archive_b).expect("b"),
        "the OCI archives differ"
    );

    let top = json(&std::fs::read(a.join("index.json")).expect("index.json"));
    assert_eq!(top["manifests"][0]["digest"], digest.as_str());
    let index = json(&blob(&a, &digest));
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let arches: BTreeSet<&str> = index["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .map(|m| m["platform"]["architecture"].as_str().expect("arch"))
        .collect();
    assert_eq!(arches, BTreeSet::from(["amd64", "arm64"]));

    let want = format!("flexnode {}", flexnode::VERSION);
    for (arch, multiarch, loader) in [
        ("amd64", "x86_64-linux-gnu", "lib64/ld-linux-x86-64.so.2"),
        ("arm64", "aarch64-linux-gnu", "lib/ld-linux-aarch64.so.1"),
    ] {
        let root: PathBuf = dir.path().join(format!("root-{arch}"));
        std::fs::create_dir(&root).expect("root");
        let entries = unpack(&a, &index, arch, &root);
        let paths: BTreeSet<String> = entries.iter().map(|e| e.0.clone()).collect();
        let libs = format!("lib/{multiarch}");
        let allowed = |p: &str| {
            matches!(
                p,
                "usr"
                    | "usr/bin"
                    | "usr/bin/flexnode"
                    | "etc"
                    | "etc/ssl"
                    | "etc/ssl/certs"
                    | "etc/ssl/certs/ca-certificates.crt"
                    | "etc/nsswitch.conf"
                    | "host"
                    | "tmp"
                    | "lib"
                    | "lib64"
            ) || p == loader
                || p == libs
                || p.strip_prefix(&format!("{libs}/"))
                    .is_some_and(|so| so.contains(".so"))
        };
        for p in &paths {
            assert!(allowed(p), "{arch}: {p} is more than the agent needs");
        }
        for p in [
            "usr/bin/flexnode",
            loader,
            "etc/ssl/certs/ca-certificates.crt",
        ] {
            assert!(paths.contains(p), "{arch}: no {p} in {paths:?}");
        }
        assert!(!paths.iter().any(|p| p.ends_with("/sh")), "{arch}: a shell");
        let epoch = entries[0].3;
        for (p, _, uid, mtime) in &entries {
            assert_eq!((*uid, *mtime), (0, epoch), "{arch}: {p}");
        }
        let size: u64 = walk(&root);
        eprintln!("{arch}: unpacked {size} bytes in {} entries", entries.len());

        let out = if arch == "amd64" {
            Command::new("/usr/sbin/chroot")
                .arg(&root)
                .args(["/usr/bin/flexnode", "version"])
                .env_clear()
                .output()
                .expect("chroot")
        } else {
            Command::new("qemu-aarch64")
                .arg("-L")
                .arg(&root)
                .arg(root.join("usr/bin/flexnode"))
                .arg("version")
                .env_clear()
                .output()
                .expect("qemu-aarch64 (package qemu-user; e2e/prereqs installs it)")
        };
        assert_eq!(version_line(out, arch), want, "{arch}");
    }
}

fn walk(p: &Path) -> u64 {
    let meta = std::fs::symlink_metadata(p).expect("stat");
    if meta.is_dir() {
        std::fs::read_dir(p)
            .expect("read_dir")
            .map(|e| walk(&e.expect("entry").path()))
            .sum()
    } else {
        meta.len()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(containerd)]
async fn the_image_is_pushed_with_auth_pulled_by_digest_and_runs_in_containerd() {
    let (dir, digest) = built();
    let tier = Tier::up(Flavor::V1_6);
    let secure = tier.secure();
    let (pushed, stderr) = push(
        &dir.path().join("a"),
        &format!("{}/flexnode/agent:test", secure.basic),
        Some(&secure),
    );
    assert_eq!(&pushed, digest);
    assert!(!stderr.contains(&secure.password), "{stderr}");

    let index = Sha256Hex::parse(digest).expect("digest");
    let agent = tier.grpc(secure.registry_config()).await;
    let reference = format!("{}/flexnode/agent@{}", secure.token, index.oci());
    agent
        .pull(&reference, &index)
        .await
        .expect("pull the agent image");

    // Its local name, which the container units run: beside the pulled record, labelled as
    // the agent's like it (and so removed with it); naming twice changes nothing.
    agent.name_agent_image(&index).await.expect("name");
    agent.name_agent_image(&index).await.expect("name again");
    let mut records = agent.image_records(&index).await.expect("records");
    records.sort_by(|a, b| a.name.cmp(&b.name));
    let names: Vec<(&str, bool)> = records
        .iter()
        .map(|r| (r.name.as_str(), r.agent_pulled))
        .collect();
    let local = format!("flexnode.invalid/agent@{}", index.oci());
    assert_eq!(names, [(reference.as_str(), true), (local.as_str(), true)]);

    // The candidate check an AgentUpgrade runs: `flexnode version` in a short-lived container.
    let checks = tier.dir.join("checks");
    let agent = agent.with_check(&checks, Duration::from_secs(30));
    let want = format!("flexnode {}", flexnode::VERSION);
    assert_eq!(agent.check_image(&index).await.expect("check"), want);
    assert_eq!(
        std::fs::read_dir(&checks).expect("checks dir").count(),
        0,
        "the check left its output behind"
    );
    assert!(
        agent
            .managed_containers()
            .await
            .expect("containers")
            .is_empty(),
        "the check left its container behind"
    );

    // An image without the agent fails the check, with the reason.
    let busybox = tier.busybox_image("e2e/busybox:v1");
    agent
        .pull(&tier.reference("e2e/busybox", &busybox), &busybox)
        .await
        .expect("pull busybox");
    let e = agent
        .check_image(&busybox)
        .await
        .expect_err("no agent in busybox");
    // runc cannot exec the agent: the message says which candidate and why.
    let m = e.to_string();
    assert!(
        m.contains(&format!("candidate image {}", busybox.short()))
            && m.contains("/usr/bin/flexnode")
            && m.contains("no such file"),
        "{m}"
    );
    assert!(
        agent
            .managed_containers()
            .await
            .expect("containers")
            .is_empty()
    );

    // Removing the agent's image removes its local name too; naming an image containerd
    // does not hold fails, saying so.
    agent.remove_agent_image(&index).await.expect("remove");
    assert!(
        agent
            .image_records(&index)
            .await
            .expect("records")
            .is_empty()
    );
    let e = agent.name_agent_image(&index).await.expect_err("not there");
    assert!(e.to_string().contains("is not in containerd"), "{e}");
}

/// The check's time limit: a candidate whose `version` never returns fails within it, and
/// leaves no container behind. The candidate is an image `image/build` makes of a C program
/// that only waits (built here with the host's C compiler).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[tier(containerd)]
async fn a_candidate_that_hangs_fails_the_check_within_its_limit() {
    let dir = tempfile::tempdir().expect("tmp");
    let source = dir.path().join("hang.c");
    std::fs::write(
        &source,
        "#include <unistd.h>\nint main(void) { for (;;) pause(); }\n",
    )
    .expect("write");
    let binary = dir.path().join("hang");
    let cc = Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&binary)
        .arg(&source)
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "{}",
        String::from_utf8_lossy(&cc.stderr)
    );
    let layout = dir.path().join("layout");
    let digest = build(
        &layout,
        &[
            "--arch",
            "amd64",
            "--tag",
            "hang",
            "--binary",
            &format!("amd64={}", binary.display()),
        ],
    );
    let tier = Tier::up(Flavor::V1_6);
    let (pushed, _) = push(
        &layout,
        &format!("{}/flexnode/hang:test", tier.registry),
        None,
    );
    assert_eq!(pushed, digest);
    let index = Sha256Hex::parse(&digest).expect("digest");
    let agent = tier
        .grpc(Default::default())
        .await
        .with_check(tier.dir.join("checks"), Duration::from_secs(2));
    agent
        .pull(&format!("{}/flexnode/hang@{digest}", tier.registry), &index)
        .await
        .expect("pull");
    let started = std::time::Instant::now();
    let e = agent
        .check_image(&index)
        .await
        .expect_err("it never answers");
    assert!(e.to_string().contains("did not finish within 2 s"), "{e}");
    eprintln!("the check gave up after {:?}", started.elapsed());
    assert!(
        agent
            .managed_containers()
            .await
            .expect("containers")
            .is_empty()
    );
}
