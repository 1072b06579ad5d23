//! The seed corpora: valid and near-valid inputs for every target, made here rather than
//! committed (each target writes its own before it starts, `write_seeds` in `lib.rs`;
//! `tests/core/fuzz_findings.rs` checks that each one still takes the path it was made for).
//! Secrets are planted as [`MARKER`].

use crate::common::MARKER;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::sim::{Build, SimNode, upgrade};
use std::io::Write;

const HEX: &str = "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592";

/// One seed: its target, a name, its bytes, and whether the agent's code accepts it.
pub struct Seed {
    pub target: &'static str,
    pub name: String,
    pub data: Vec<u8>,
    pub accepted: bool,
}

fn seed(target: &'static str, name: &str, data: impl Into<Vec<u8>>, accepted: bool) -> Seed {
    Seed {
        target,
        name: name.to_string(),
        data: data.into(),
        accepted,
    }
}

/// Every target's seeds.
pub fn all() -> Vec<Seed> {
    let mut out = Vec::new();
    out.extend(upgrade_params());
    out.extend(oci_ref());
    out.extend(archive_url());
    out.extend(config());
    out.extend(store());
    out.extend(archive());
    out.extend(manifest());
    out.extend(layer());
    out
}

fn upgrade_params() -> Vec<Seed> {
    let t = "upgrade_params";
    vec![
        seed(
            t,
            "archive-sas",
            format!("h\nhttps://a.example/f.tgz?sig={MARKER}&se=1\n{HEX}\n"),
            true,
        ),
        seed(
            t,
            "archive-prefixed-digest",
            format!(
                "h\nhttp://127.0.0.1:8080/a.tgz\nsha256:{}\n",
                HEX.to_uppercase()
            ),
            true,
        ),
        seed(
            t,
            "archive-userinfo",
            format!("h\nhttps://u:{MARKER}@a.example/f.tgz\n{HEX}\n"),
            false,
        ),
        seed(
            t,
            "archive-fragment",
            format!("h\nhttps://a.example/f.tgz#{MARKER}\n{HEX}\n"),
            false,
        ),
        seed(
            t,
            "image",
            format!("c\noci://registry.example:5000/flexnode/agent:v2\n{HEX}\n"),
            true,
        ),
        seed(
            t,
            "image-query",
            format!("c\noci://registry.example/flexnode?token={MARKER}\n{HEX}\n"),
            false,
        ),
        seed(
            t,
            "image-on-host",
            format!("h\noci://registry.example/flexnode\n{HEX}\n"),
            false,
        ),
        seed(
            t,
            "no-digest",
            format!("hS\nhttps://a.example/f.tgz?sig={MARKER}\n\n"),
            false,
        ),
        seed(
            t,
            "arm64",
            format!("ca\noci://localhost/a/b-c/d__e:latest\n{HEX}\nextra=1\n"),
            true,
        ),
        seed(
            t,
            "unsupported-cpu",
            format!("u\nhttps://a.example/f.tgz\n{HEX}\n"),
            false,
        ),
    ]
}

fn oci_ref() -> Vec<Seed> {
    let t = "oci_ref";
    vec![
        seed(
            t,
            "tagged",
            "oci://ghcr.io/azure/aks-flex-node-agent:v0.2.1",
            true,
        ),
        seed(t, "port", "oci://127.0.0.1:5000/flexnode", true),
        seed(t, "unprefixed", "localhost:5000/a/b-c/d__e:latest", true),
        seed(
            t,
            "query",
            format!("oci://r.example/a?token={MARKER}"),
            false,
        ),
        seed(
            t,
            "userinfo",
            format!("oci://user:{MARKER}@r.example/a"),
            false,
        ),
        seed(
            t,
            "digest",
            format!("oci://r.example/a@sha256:{HEX}"),
            false,
        ),
        seed(t, "no-registry", "oci://library/flexnode", false),
    ]
}

fn archive_url() -> Vec<Seed> {
    let t = "archive_url";
    vec![
        seed(
            t,
            "sas",
            format!("https://a.example/f.tgz?sig={MARKER}&se=1\n/next.tgz?sig=2"),
            true,
        ),
        seed(
            t,
            "port-path",
            "http://127.0.0.1:8080/dir/f.tar.gz\nhttps://b.example/x",
            true,
        ),
        seed(
            t,
            "userinfo",
            format!("https://u:{MARKER}@a.example/f.tgz\nhttp://a.example/down"),
            false,
        ),
        seed(
            t,
            "user",
            format!("https://{MARKER}@a.example/f.tgz\n"),
            false,
        ),
        seed(
            t,
            "fragment",
            format!("https://a.example/f.tgz#{MARKER}\nftp://x/y"),
            false,
        ),
        seed(
            t,
            "one-slash",
            format!("https:/u:{MARKER}@a.example/f.tgz\n"),
            false,
        ),
        seed(
            t,
            "backslashes",
            format!("https:\\\\u:{MARKER}@a.example\\f.tgz\n"),
            false,
        ),
        seed(
            t,
            "redirect-credentials",
            "https://a.example/f.tgz\nhttps://u:p@b.example/",
            true,
        ),
        seed(t, "not-a-url", format!("not a url?{MARKER}\n"), false),
    ]
}

fn config() -> Vec<Seed> {
    let t = "config";
    let base = "kubeconfig: @FILES@/kubeconfig\nkubernetesVersion: v1.34.12\n";
    vec![
        seed(t, "minimal", base, true),
        seed(
            t,
            "json",
            r#"{"nodeName": "n1", "kubeconfig": "@FILES@/kubeconfig", "kubernetesVersion": "v1.33.0", "installMode": "host"}"#,
            true,
        ),
        seed(
            t,
            "container",
            format!(
                "{base}installMode: container\nagentImage: oci://127.0.0.1:5000/flexnode:v1\nagentImageDigest: sha256:{HEX}\nagentImageArchive: @FILES@/agent.tar\nregistryCredentialsFile: @FILES@/registry.json\ntrustedCAFile: @FILES@/ca.pem\n"
            ),
            true,
        ),
        seed(
            t,
            "node-images",
            format!(
                "{base}nodeName: edge-07\nnodeImages:\n  v1.34.12: oci://registry.example/node:v1.34.12@sha256:{HEX}\n  v1.33.13: oci://registry.example/node@sha256:{HEX}\nbootstrapTokenFile: @FILES@/token\nsandboxImage: registry.example/pause:3.10@sha256:{HEX}\npodCIDR: 10.88.0.0/16\n"
            ),
            true,
        ),
        seed(
            t,
            "image-query",
            format!(
                "{base}installMode: container\nagentImage: oci://r.example/a?token={MARKER}\nagentImageDigest: sha256:{HEX}\n"
            ),
            false,
        ),
        seed(
            t,
            "node-image-userinfo",
            format!(
                "{base}nodeImages:\n  v1.34.12: oci://u:{MARKER}@r.example/node@sha256:{HEX}\nbootstrapTokenFile: @FILES@/token\n"
            ),
            false,
        ),
        seed(
            t,
            "node-images-not-a-map",
            format!("{base}nodeImages: oci://r.example/node?token={MARKER}\n"),
            false,
        ),
        seed(t, "unknown-key", format!("{base}agentImag: x\n"), false),
        seed(
            t,
            "bad-yaml",
            format!("{base}agentImage: [oci://r.example/a?t={MARKER}\n"),
            false,
        ),
    ]
}

/// Stores as the agent leaves them: fresh, joined (host and container install), after an
/// upgrade with a SAS URL, a reboot and a reset.
fn store() -> Vec<Seed> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = std::env::temp_dir().join(format!("flexnode-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut out = Vec::new();
    for (name, mode, steps) in [
        ("fresh", InstallMode::Host, 0),
        ("joined-container", InstallMode::Container, 1),
        ("upgraded-host", InstallMode::Host, 2),
        ("rebooted-and-reset", InstallMode::Host, 3),
    ] {
        // The store makes its directory itself (0700).
        let path = dir.join(name).join("state.db");
        rt.block_on(async {
            let mut node = SimNode::new(&path, flexnode::lifecycle::table::BASE);
            if steps == 0 {
                node.runner().expect("open");
            }
            if steps >= 1 {
                node.join(mode, "edge-07").await.expect("join");
                node.boot().await.expect("boot");
            }
            if steps >= 2 {
                let url = format!("https://a.example/f.tgz?sig={MARKER}");
                node.host.serve_artifact(
                    &url,
                    HEX,
                    Build {
                        version: "0.2.0".into(),
                        crashes: false,
                    },
                );
                node.claim("u1", upgrade(&url, HEX)).await.expect("claim");
                node.settle().await.expect("settle");
            }
            if steps >= 3 {
                node.claim("u2", flexnode::lifecycle::input::ClaimKind::node_reboot())
                    .await
                    .expect("reboot");
                node.claim("u3", flexnode::lifecycle::input::ClaimKind::agent_reset())
                    .await
                    .expect("reset");
            }
            node.stop_process();
        });
        let data = std::fs::read(&path).expect("read the store");
        out.push(seed("store", name, data, true));
    }
    let _ = std::fs::remove_dir_all(&dir);
    // `create` writes a store whole, so an empty file is damage (`src/store/mod.rs`).
    out.push(seed("store", "empty", Vec::new(), false));
    out.push(seed(
        "store",
        "not-sqlite",
        b"SQLite format 2\0not a database".to_vec(),
        false,
    ));
    out
}

/// A tar entry with any name (the tar crate's builder refuses `..`), as raw bytes.
fn entry(name: &[u8], kind: tar::EntryType, link: &[u8], data: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_size(data.len() as u64);
    h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn tar(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("gzip");
    gz.finish().expect("gzip")
}

fn archive() -> Vec<Seed> {
    use tar::EntryType::{Regular, Symlink};
    let t = "archive";
    let member = crate::archive::MEMBER.as_bytes();
    vec![
        seed(
            t,
            "valid",
            gzip(&tar(&[entry(
                member,
                Regular,
                b"",
                b"#!/bin/sh\necho flexnode\n",
            )])),
            true,
        ),
        seed(
            t,
            "two-members",
            gzip(&tar(&[
                entry(member, Regular, b"", b"a"),
                entry(b"extra", Regular, b"", b"b"),
            ])),
            false,
        ),
        seed(
            t,
            "wrong-name",
            gzip(&tar(&[entry(
                b"../flexnode-linux-amd64",
                Regular,
                b"",
                b"a",
            )])),
            false,
        ),
        seed(
            t,
            "symlink",
            gzip(&tar(&[entry(member, Symlink, b"/etc/passwd", b"")])),
            false,
        ),
        seed(
            t,
            "empty-member",
            gzip(&tar(&[entry(member, Regular, b"", b"")])),
            false,
        ),
        seed(
            t,
            "too-large",
            gzip(&tar(&[entry(member, Regular, b"", &vec![7u8; 70 << 10])])),
            false,
        ),
        seed(
            t,
            "no-gzip",
            tar(&[entry(member, Regular, b"", b"x")]),
            false,
        ),
    ]
}

fn manifest() -> Vec<Seed> {
    let t = "manifest";
    let d = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    let layer = |c: char| {
        format!(
            r#"{{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "{}", "size": 32}}"#,
            d(c)
        )
    };
    let manifest = format!(
        r#"{{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": {{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": "{}", "size": 7}}, "layers": [{}, {}]}}"#,
        d('1'),
        layer('2'),
        layer('3')
    );
    let index = format!(
        r#"{{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "{}", "size": 400, "platform": {{"os": "linux", "architecture": "arm64"}}}}, {{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": "{}", "size": 400, "platform": {{"os": "linux", "architecture": "amd64"}}}}]}}"#,
        d('4'),
        d('5')
    );
    let config = format!(
        r#"{{"architecture": "amd64", "os": "linux", "rootfs": {{"type": "layers", "diff_ids": ["{}", "{}"]}}}}"#,
        d('6'),
        d('7')
    );
    let creds = r#"{"auths": {"r.example": {"auth": "dXNlcjpwYXNz"}, "s.example": {"username": "u", "password": "p"}}}"#;
    let with = |choice: u8, doc: &str| [&[choice][..], doc.as_bytes()].concat();
    vec![
        seed(t, "manifest", with(0, &manifest), true),
        seed(t, "index", with(1, &index), true),
        seed(
            t,
            "docker-list",
            with(
                3,
                &index.replace(
                    r#""mediaType": "application/vnd.oci.image.index.v1+json", "#,
                    "",
                ),
            ),
            true,
        ),
        seed(t, "config", with(0, &config), false),
        seed(t, "credentials", with(5, creds), false),
        seed(
            t,
            "foreign-layer",
            with(
                2,
                &manifest.replace(r#""size": 32}"#, r#""size": 32, "urls": ["https://x"]}"#),
            ),
            false,
        ),
    ]
}

fn layer() -> Vec<Seed> {
    use tar::EntryType::{Directory, Link, Regular, Symlink};
    let t = "layer";
    let plain = |entries: &[Vec<u8>]| [&[0u8][..], &tar(entries)].concat();
    let gz = |entries: &[Vec<u8>]| [&[1u8][..], &gzip(&tar(entries))].concat();
    let files = [
        entry(b"etc/", Directory, b"", b""),
        entry(b"etc/os-release", Regular, b"", b"ID=debian\n"),
        entry(b"usr/bin/kubelet", Regular, b"", b"\x7fELF"),
        entry(b"lib/libnew.so", Regular, b"", b"so"),
        entry(b"usr/bin/.wh.sh", Regular, b"", b""),
        entry(b"var/.wh..wh..opq", Regular, b"", b""),
    ];
    vec![
        seed(t, "files-and-whiteouts", plain(&files), true),
        seed(t, "gzip", gz(&files), true),
        seed(
            t,
            "whiteout-of-a-link",
            plain(&[entry(b".wh.lib", Regular, b"", b"")]),
            true,
        ),
        seed(
            t,
            "whiteout-through-a-link",
            plain(&[entry(b"abs/lib/.wh.libx.so", Regular, b"", b"")]),
            true,
        ),
        seed(
            t,
            "whiteout-dotdot",
            plain(&[entry(b"etc/.wh...", Regular, b"", b"")]),
            false,
        ),
        seed(
            t,
            "whiteout-empty",
            plain(&[entry(b"etc/.wh.", Regular, b"", b"")]),
            false,
        ),
        seed(
            t,
            "climbs",
            plain(&[entry(b"../outside/secret", Regular, b"", b"gotcha")]),
            false,
        ),
        seed(
            t,
            "link-out",
            plain(&[
                entry(b"up", Symlink, b"../outside", b""),
                entry(b"up/secret", Regular, b"", b"gotcha"),
            ]),
            false,
        ),
        seed(
            t,
            "absolute-link-out",
            plain(&[
                entry(b"up", Symlink, b"/dev/shm/flexnode-fuzz/layer/outside", b""),
                entry(b"up/secret", Regular, b"", b"gotcha"),
            ]),
            false,
        ),
        seed(
            t,
            "hardlink-out",
            plain(&[entry(b"h", Link, b"../outside/secret", b"")]),
            false,
        ),
        seed(
            t,
            "hardlink-in",
            plain(&[entry(b"h", Link, b"etc/hostname", b"")]),
            true,
        ),
        seed(
            t,
            "whiteout-link-escape",
            plain(&[
                entry(b"up", Symlink, b"../outside", b""),
                entry(b"up/.wh.secret", Regular, b"", b""),
            ]),
            true,
        ),
    ]
}
