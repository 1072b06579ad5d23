//! `FsHost` on the real filesystem (a temporary root) and the archive downloader against a real
//! HTTP server on 127.0.0.1: slots and links, staging and its refusals, the candidate check,
//! machine trees and runtime files.

use flexnode::effects::archive::{self, ArchiveFetcher, ArchiveLimits, digest_matches};
use flexnode::effects::host::{
    BIN_LINK_TARGET, CHECK_PATH, FsHost, HostLayout, NSPAWN_SETTINGS, running_build,
};
use flexnode::effects::{EffectError, EffectResult, Host};
use flexnode::machine::agent::{AgentBuild, InstallMode, Slot};
use flexnode::machine::agent::{Arch, ArchiveUrl, Sha256Hex};
use flexnode::machine::state::Side;
use sha2::{Digest, Sha256};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const MEMBER: &str = "flexnode-linux-amd64";
const BLUE: AgentBuild = AgentBuild::Slot { slot: Slot::Blue };
const GREEN: AgentBuild = AgentBuild::Slot { slot: Slot::Green };

// ---- helpers ------------------------------------------------------------------------------

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    layout: HostLayout,
    host: FsHost,
}

/// A root with a fake running executable (outside the layout) and an os-release.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("usr/lib")).expect("usr/lib");
    std::fs::write(
        root.join("usr/lib/os-release"),
        "ID=test\nNAME=\"Test OS\"\n",
    )
    .expect("os-release");
    let exe = dir.path().join("running-flexnode");
    std::fs::write(&exe, b"\x7fELF the running agent").expect("exe");
    let layout = HostLayout::at(&root);
    let host = FsHost::new(layout.clone())
        .with_executable(&exe)
        .with_arch(Arch::Amd64);
    Fixture {
        _dir: dir,
        root,
        layout,
        host,
    }
}

fn failed<T: std::fmt::Debug>(r: EffectResult<T>) -> String {
    match r {
        Err(EffectError::Failed(m)) => m,
        other => panic!("expected Failed, got {other:?}"),
    }
}

fn url(s: &str) -> ArchiveUrl {
    serde_json::from_value(serde_json::Value::String(s.to_string())).expect("archive url")
}

fn sha(bytes: &[u8]) -> Sha256Hex {
    Sha256Hex::parse(&hex::encode(Sha256::digest(bytes))).expect("sha256")
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o7777
}

fn link(path: &Path) -> String {
    std::fs::read_link(path)
        .expect("readlink")
        .to_string_lossy()
        .into_owned()
}

/// Dot entries (temporary files) left in `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Err(_) => vec![],
        Ok(entries) => entries
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect(),
    }
}

fn write_exec(path: &Path, contents: &str) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
    let mut f = std::fs::File::create(path).expect("create");
    f.write_all(contents.as_bytes()).expect("write");
    f.sync_all().expect("sync");
    drop(f);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

struct Member {
    name: Vec<u8>,
    kind: tar::EntryType,
    data: Vec<u8>,
}

fn regular(name: &str, data: &[u8]) -> Member {
    Member {
        name: name.as_bytes().to_vec(),
        kind: tar::EntryType::Regular,
        data: data.to_vec(),
    }
}

/// A tar.gz with exactly these headers (names written raw, never normalised).
fn targz(members: &[Member]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for m in members {
        let mut h = tar::Header::new_gnu();
        h.as_old_mut().name[..m.name.len()].copy_from_slice(&m.name);
        h.set_entry_type(m.kind);
        h.set_mode(0o755);
        h.set_size(m.data.len() as u64);
        if m.kind == tar::EntryType::Symlink {
            h.set_link_name("/bin/sh").expect("link name");
        }
        h.set_cksum();
        b.append(&h, m.data.as_slice()).expect("append");
    }
    b.into_inner().expect("tar").finish().expect("gzip")
}

fn agent_archive(data: &[u8]) -> Vec<u8> {
    targz(&[regular(MEMBER, data)])
}

// ---- an HTTP server ----------------------------------------------------------------------

#[derive(Clone)]
enum Reply {
    Body(Vec<u8>),
    Chunked(Vec<u8>, usize),
    /// Headers announcing this Content-Length, then nothing.
    Declared(u64),
    Redirect(String),
    Status(u16),
    Hang,
}

type Route = Arc<dyn Fn(&str) -> Reply + Send + Sync>;

struct Server {
    base: String,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(route: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let route: Route = Arc::new(route);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                tokio::spawn(handle(sock, route.clone(), log.clone()));
            }
        });
        Self {
            base: format!("http://{addr}"),
            seen,
        }
    }

    fn url(&self, path: &str) -> ArchiveUrl {
        url(&format!("{}{path}", self.base))
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().expect("log").clone()
    }
}

async fn handle(mut sock: tokio::net::TcpStream, route: Route, seen: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match sock.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let target = text.split_whitespace().nth(1).unwrap_or("/").to_string();
    seen.lock().expect("log").push(target.clone());
    let reply = route(&target);
    let _ = respond(&mut sock, reply).await;
    let _ = sock.shutdown().await;
}

async fn respond(sock: &mut tokio::net::TcpStream, reply: Reply) -> std::io::Result<()> {
    match reply {
        Reply::Body(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            sock.write_all(head.as_bytes()).await?;
            sock.write_all(&body).await
        }
        Reply::Chunked(body, size) => {
            sock.write_all(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
            )
            .await?;
            for chunk in body.chunks(size) {
                sock.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                sock.write_all(chunk).await?;
                sock.write_all(b"\r\n").await?;
            }
            sock.write_all(b"0\r\n\r\n").await
        }
        Reply::Declared(n) => {
            let head =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
            sock.write_all(head.as_bytes()).await?;
            tokio::time::sleep(Duration::from_secs(10)).await;
            Ok(())
        }
        Reply::Redirect(location) => {
            let head = format!(
                "HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            sock.write_all(head.as_bytes()).await
        }
        Reply::Status(code) => {
            let head =
                format!("HTTP/1.1 {code} Nope\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
            sock.write_all(head.as_bytes()).await
        }
        Reply::Hang => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        }
    }
}

/// Serves `archive` at `/a.tgz` (any query) and redirect chains `/r/<n>` → … → `/a.tgz`.
async fn archive_server(archive: Vec<u8>) -> Server {
    Server::start(move |target| {
        let path = target.split('?').next().unwrap_or_default();
        if path == "/a.tgz" {
            return Reply::Body(archive.clone());
        }
        if let Some(n) = path.strip_prefix("/r/").and_then(|n| n.parse::<u32>().ok()) {
            return Reply::Redirect(if n <= 1 {
                "/a.tgz?sig=REDIRECTSECRET".to_string()
            } else {
                format!("/r/{}?sig=REDIRECTSECRET", n - 1)
            });
        }
        Reply::Status(404)
    })
    .await
}

/// Joined on blue, so staging goes to green.
async fn joined() -> Fixture {
    let fx = fixture();
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install");
    fx
}

async fn stage(fx: &Fixture, u: &ArchiveUrl, digest: &Sha256Hex) -> EffectResult {
    fx.host.stage_archive(u, digest, &GREEN).await
}

fn assert_nothing_staged(fx: &Fixture) {
    let green = fx.layout.slot_dir(Slot::Green);
    assert!(!fx.layout.slot_binary(Slot::Green).exists());
    assert_eq!(leftovers(&green), Vec::<String>::new());
}

// ---- join install -------------------------------------------------------------------------

#[tokio::test]
async fn join_installs_the_running_build_replacing_a_seed_idempotently() {
    let fx = fixture();
    let l = &fx.layout;
    // An image builder placed a seed binary at bin/flexnode.
    write_exec(&l.bin_link(), "#!/bin/sh\necho seed\n");

    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install");

    let binary = l.slot_binary(Slot::Blue);
    assert_eq!(
        std::fs::read(&binary).expect("slot binary"),
        b"\x7fELF the running agent"
    );
    assert_eq!(mode(&binary), 0o755);
    assert_eq!(mode(&l.slot_dir(Slot::Blue)), 0o755);
    assert_eq!(mode(&l.agent_dir()), 0o755);
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    assert_eq!(link(&l.bin_link()), BIN_LINK_TARGET);
    assert_eq!(
        std::fs::read(l.bin_link()).expect("through the links"),
        b"\x7fELF the running agent"
    );
    assert!(!l.last_good_link().exists());
    assert_eq!(
        fx.host.selected_agent(InstallMode::Host).await,
        Ok(Some(BLUE))
    );
    let inode = std::fs::metadata(&binary).expect("meta").ino();

    // Again: nothing changes.
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install again");
    assert_eq!(std::fs::metadata(&binary).expect("meta").ino(), inode);
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    for dir in [
        l.agent_dir(),
        l.slot_dir(Slot::Blue),
        l.bin_dir(),
        l.lib_dir(),
    ] {
        assert_eq!(leftovers(&dir), Vec::<String>::new(), "{}", dir.display());
    }

    // What the daemon learns about itself.
    assert_eq!(running_build(l, &l.bin_link()), Some(BLUE));
    assert_eq!(running_build(l, &binary), Some(BLUE));
    assert_eq!(running_build(l, &fx.root.join("usr/lib/os-release")), None);
}

#[tokio::test]
async fn install_replaces_different_bytes() {
    let fx = joined().await;
    let binary = fx.layout.slot_binary(Slot::Blue);
    std::fs::write(&binary, b"stale").expect("write");
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install");
    assert_eq!(
        std::fs::read(&binary).expect("read"),
        b"\x7fELF the running agent"
    );
    assert_eq!(mode(&binary), 0o755);
}

#[tokio::test]
async fn container_install_selects_images() {
    let fx = fixture();
    let d1 = sha(b"one");
    let d2 = sha(b"two");
    let image = |d: &Sha256Hex| AgentBuild::Image { digest: d.clone() };
    // The runtime directory holds the credential: private, also when it was not.
    std::fs::create_dir_all(fx.layout.runtime_dir()).expect("runtime dir");
    std::fs::set_permissions(
        fx.layout.runtime_dir(),
        std::fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    assert_eq!(
        fx.host.selected_agent(InstallMode::Container).await,
        Ok(None)
    );
    fx.host
        .install_agent(InstallMode::Container, &image(&d1))
        .await
        .expect("install");
    assert_eq!(
        std::fs::read_to_string(fx.layout.agent_image_env()).expect("env"),
        format!(
            "FLEXNODE_AGENT_IMAGE=flexnode.invalid/agent@sha256:{}\n",
            d1.as_str()
        )
    );
    assert_eq!(
        fx.host.selected_agent(InstallMode::Container).await,
        Ok(Some(image(&d1)))
    );
    assert_eq!(mode(&fx.layout.runtime_dir()), 0o700);
    fx.host
        .select_agent(InstallMode::Container, &image(&d2), &image(&d1))
        .await
        .expect("select");
    assert_eq!(
        fx.host.selected_agent(InstallMode::Container).await,
        Ok(Some(image(&d2)))
    );
    assert_eq!(
        std::fs::read_to_string(fx.layout.agent_image_last_good_env()).expect("env"),
        format!(
            "FLEXNODE_AGENT_IMAGE=flexnode.invalid/agent@sha256:{}\n",
            d1.as_str()
        )
    );
    // Modes and builds must agree.
    failed(fx.host.install_agent(InstallMode::Host, &image(&d1)).await);
    failed(fx.host.install_agent(InstallMode::Container, &BLUE).await);
    failed(
        fx.host
            .select_agent(InstallMode::Host, &image(&d1), &image(&d1))
            .await,
    );
}

/// A layout directory another user owns could have its contents replaced under the agent (a
/// build root runs): it is refused, not used, and left as it is.
#[tokio::test]
async fn layout_directories_of_another_user_are_refused() {
    let fx = fixture();
    let l = &fx.layout;
    std::fs::create_dir_all(l.agent_dir()).expect("agent dir");
    std::os::unix::fs::chown(l.agent_dir(), Some(1000), Some(1000)).expect("chown");
    let m = failed(fx.host.install_agent(InstallMode::Host, &BLUE).await);
    assert!(m.contains("owned by uid 1000"), "{m}");
    assert!(!l.slot_binary(Slot::Blue).exists());
    assert_eq!(
        std::fs::metadata(l.agent_dir()).expect("meta").uid(),
        1000,
        "left as it was"
    );

    std::fs::create_dir_all(l.machines_dir()).expect("machines dir");
    std::os::unix::fs::chown(l.machines_dir(), Some(1000), None).expect("chown");
    let m = failed(fx.host.provision_machine(Side::Kube1, "1.33.2").await);
    assert!(m.contains("owned by uid 1000"), "{m}");
    assert!(!l.machine_dir(Side::Kube1).exists());
}

// ---- staging ------------------------------------------------------------------------------

#[tokio::test]
async fn stage_installs_the_single_member() {
    let fx = joined().await;
    let data = b"\x7fELF candidate".to_vec();
    let archive = agent_archive(&data);
    let server = archive_server(archive.clone()).await;

    stage(
        &fx,
        &server.url("/a.tgz?se=2030&sig=SECRET"),
        &sha(&archive),
    )
    .await
    .expect("stage");

    let binary = fx.layout.slot_binary(Slot::Green);
    assert_eq!(std::fs::read(&binary).expect("candidate"), data);
    assert_eq!(mode(&binary), 0o755);
    assert_eq!(mode(&fx.layout.slot_dir(Slot::Green)), 0o755);
    assert_eq!(
        leftovers(&fx.layout.slot_dir(Slot::Green)),
        Vec::<String>::new()
    );
    // The whole URL went to the server; the selection did not change.
    assert_eq!(server.seen(), vec!["/a.tgz?se=2030&sig=SECRET".to_string()]);
    assert_eq!(link(&fx.layout.current_link()), "lib/flexnode-blue");

    // Again (a resumed step): same result.
    stage(&fx, &server.url("/a.tgz?sig=SECRET"), &sha(&archive))
        .await
        .expect("stage again");
    assert_eq!(std::fs::read(&binary).expect("candidate"), data);
}

#[tokio::test]
async fn stage_refuses_the_selected_slot_and_moves_last_good_off_the_target() {
    let fx = joined().await;
    let archive = agent_archive(b"new");
    let server = archive_server(archive.clone()).await;
    let m = failed(
        fx.host
            .stage_archive(&server.url("/a.tgz"), &sha(&archive), &BLUE)
            .await,
    );
    assert!(m.contains("selected agent"), "{m}");
    assert!(server.seen().is_empty());

    // After an upgrade to green, blue is last-good; staging into blue moves last-good to green.
    write_exec(&fx.layout.slot_binary(Slot::Green), "#!/bin/sh\n");
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("select");
    fx.host
        .stage_archive(&server.url("/a.tgz"), &sha(&archive), &BLUE)
        .await
        .expect("stage");
    assert_eq!(link(&fx.layout.last_good_link()), "lib/flexnode-green");
    assert_eq!(link(&fx.layout.current_link()), "lib/flexnode-green");
    assert_eq!(
        std::fs::read(fx.layout.slot_binary(Slot::Blue)).expect("blue"),
        b"new"
    );
}

#[tokio::test]
async fn wrong_digest_is_refused_and_leaves_nothing() {
    let fx = joined().await;
    let archive = agent_archive(b"candidate");
    let server = archive_server(archive).await;
    let m = failed(stage(&fx, &server.url("/a.tgz?sig=SECRET"), &sha(b"other")).await);
    assert!(m.contains("does not match sha256"), "{m}");
    assert!(m.contains("/a.tgz?<redacted>"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");
    assert_nothing_staged(&fx);
}

#[test]
fn digest_compare_checks_every_byte() {
    let bytes = b"abc";
    let digest: [u8; 32] = Sha256::digest(bytes).into();
    assert!(digest_matches(&digest, &sha(bytes)));
    for i in [0, 15, 31] {
        let mut other = digest;
        other[i] ^= 0x01;
        assert!(!digest_matches(&other, &sha(bytes)), "byte {i}");
    }
    assert!(!digest_matches(&[0u8; 32], &sha(bytes)));
}

#[tokio::test]
async fn oversize_by_content_length_is_refused_before_the_body() {
    let fx = joined().await;
    let server = Server::start(|_| Reply::Declared((256 << 20) + 1)).await;
    let started = Instant::now();
    let m = failed(stage(&fx, &server.url("/a.tgz?sig=SECRET"), &sha(b"x")).await);
    assert!(m.contains("larger than 256 MiB"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_nothing_staged(&fx);
}

#[tokio::test]
async fn oversize_chunked_stream_is_cut_off() {
    let fx = fixture();
    let fx = Fixture {
        host: fx
            .host
            .clone()
            .with_fetcher(ArchiveFetcher::new().with_limits(ArchiveLimits {
                max_download: 1 << 20,
                ..ArchiveLimits::default()
            })),
        ..fx
    };
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("install");
    let body = vec![7u8; 3 << 20];
    let server = Server::start(move |_| Reply::Chunked(body.clone(), 64 << 10)).await;
    let m = failed(stage(&fx, &server.url("/a.tgz"), &sha(b"x")).await);
    assert!(m.contains("larger than 1 MiB"), "{m}");
    assert_nothing_staged(&fx);

    // Exactly at the cap is fine for the download (the archive is then refused).
    let body = vec![7u8; 1 << 20];
    let server = Server::start(move |_| Reply::Chunked(body.clone(), 64 << 10)).await;
    let m = failed(stage(&fx, &server.url("/a.tgz"), &sha(&vec![7u8; 1 << 20])).await);
    assert!(m.contains("not a readable tar.gz"), "{m}");
    assert_nothing_staged(&fx);
}

#[tokio::test]
async fn redirects_are_followed_up_to_ten() {
    let fx = joined().await;
    let archive = agent_archive(b"candidate");
    let server = archive_server(archive.clone()).await;
    stage(&fx, &server.url("/r/10?sig=SECRET"), &sha(&archive))
        .await
        .expect("10 redirects");
    assert_eq!(server.seen().len(), 11);
    assert_eq!(
        server.seen().last().map(String::as_str),
        Some("/a.tgz?sig=REDIRECTSECRET")
    );

    let fx = joined().await;
    let m = failed(stage(&fx, &server.url("/r/11?sig=SECRET"), &sha(&archive)).await);
    assert!(m.contains("too many redirects"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");
    assert_nothing_staged(&fx);
}

#[tokio::test]
async fn transport_failures_are_described_without_secrets() {
    let fx = joined().await;
    let server = Server::start(|target| {
        if target.starts_with("/hang") {
            Reply::Hang
        } else {
            Reply::Status(404)
        }
    })
    .await;
    let m = failed(stage(&fx, &server.url("/missing.tgz?sig=SECRET"), &sha(b"x")).await);
    assert!(m.contains("HTTP 404"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");

    // Nobody listens on this port (found free, then released: if something took it in
    // between and answered, another port is tried).
    let mut port = 0;
    let mut m = String::new();
    for _ in 0..5 {
        port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("bind")
            .port();
        let u = url(&format!("http://127.0.0.1:{port}/a.tgz?sig=SECRET"));
        m = failed(stage(&fx, &u, &sha(b"x")).await);
        if m.contains("connect") {
            break;
        }
    }
    assert!(m.contains("connect"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");

    // Userinfo never reaches a message (validation refuses it; the downloader too).
    let u = url(&format!(
        "http://admin:hunter2@127.0.0.1:{port}/a.tgz?sig=SECRET"
    ));
    let m = failed(stage(&fx, &u, &sha(b"x")).await);
    assert!(m.contains("credentials"), "{m}");
    for secret in ["SECRET", "hunter2", "admin"] {
        assert!(!m.contains(secret), "{m}");
    }

    // https to a server that answers in plain http: the handshake fails.
    let plain = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = plain.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = plain.accept().await {
            let _ = sock
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                .await;
            let _ = sock.shutdown().await;
        }
    });
    let u = url(&format!("https://{addr}/a.tgz?sig=SECRET"));
    let m = failed(stage(&fx, &u, &sha(b"x")).await);
    assert!(m.contains("TLS"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");

    // A server that never answers: the read timeout.
    let quick = fx
        .host
        .clone()
        .with_fetcher(ArchiveFetcher::new().with_timeouts(
            Duration::from_secs(2),
            Duration::from_millis(300),
            Duration::from_secs(10),
        ));
    let started = Instant::now();
    let m = failed(
        quick
            .stage_archive(&server.url("/hang?sig=SECRET"), &sha(b"x"), &GREEN)
            .await,
    );
    assert!(m.contains("timed out"), "{m}");
    assert!(!m.contains("SECRET"), "{m}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_nothing_staged(&fx);
}

#[tokio::test]
async fn archives_other_than_one_regular_member_are_refused() {
    let data = b"\x7fELF candidate".to_vec();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "two members",
            targz(&[regular(MEMBER, &data), regular("README", b"hi")]),
            "exactly one member",
        ),
        (
            "duplicate member",
            targz(&[regular(MEMBER, &data), regular(MEMBER, &data)]),
            "exactly one member",
        ),
        (
            "./ prefix",
            targz(&[regular(&format!("./{MEMBER}"), &data)]),
            "named exactly",
        ),
        (
            "path",
            targz(&[regular(&format!("bin/{MEMBER}"), &data)]),
            "named exactly",
        ),
        (
            "wrong arch",
            targz(&[regular("flexnode-linux-arm64", &data)]),
            "named exactly",
        ),
        (
            "symlink member",
            targz(&[Member {
                name: MEMBER.as_bytes().to_vec(),
                kind: tar::EntryType::Symlink,
                data: vec![],
            }]),
            "regular file",
        ),
        (
            "directory member",
            targz(&[Member {
                name: MEMBER.as_bytes().to_vec(),
                kind: tar::EntryType::Directory,
                data: vec![],
            }]),
            "regular file",
        ),
        (
            "hard link member",
            targz(&[Member {
                name: MEMBER.as_bytes().to_vec(),
                kind: tar::EntryType::Link,
                data: vec![],
            }]),
            "regular file",
        ),
        (
            "empty member",
            targz(&[regular(MEMBER, b"")]),
            "1 byte to 256 MiB",
        ),
        ("no member", targz(&[]), "exactly one member"),
        (
            "not gzip",
            b"plain text, not an archive".to_vec(),
            "not a readable tar.gz",
        ),
    ];
    for (what, archive, expected) in cases {
        let fx = joined().await;
        let server = archive_server(archive.clone()).await;
        let m = failed(stage(&fx, &server.url("/a.tgz?sig=SECRET"), &sha(&archive)).await);
        assert!(m.contains(expected), "{what}: {m}");
        assert!(!m.contains("SECRET"), "{what}: {m}");
        assert_nothing_staged(&fx);
    }
}

#[test]
fn member_and_decompression_caps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("a.tgz");
    std::fs::write(&path, agent_archive(&vec![1u8; 2 << 20])).expect("archive");
    let install = |member: u64, unpacked: u64| {
        let limits = ArchiveLimits {
            max_download: 256 << 20,
            max_member: member,
            max_unpacked: unpacked,
        };
        archive::install_member(&path, MEMBER, dir.path(), "flexnode", limits)
    };
    let m = install(1 << 20, 8 << 20).expect_err("member cap");
    assert!(m.contains("1 byte to 1 MiB"), "{m}");
    let m = install(8 << 20, 1 << 20).expect_err("stream cap");
    assert!(m.contains("decompressed archive is too large"), "{m}");
    assert!(!dir.path().join("flexnode").exists());
    install(8 << 20, 8 << 20).expect("within caps");
    assert_eq!(
        std::fs::read(dir.path().join("flexnode"))
            .expect("read")
            .len(),
        2 << 20
    );
    assert_eq!(mode(&dir.path().join("flexnode")), 0o755);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .expect("list")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

// ---- candidate check ----------------------------------------------------------------------

#[tokio::test]
async fn check_candidate_runs_version_without_a_shell_or_environment() {
    let fx = joined().await;
    write_exec(
        &fx.layout.slot_binary(Slot::Green),
        "#!/bin/sh\nread line\necho \"flexnode 9.9.9 args=$* PATH=$PATH HOME=${HOME-unset} stdin=${line:-none}\"\necho second line\n",
    );
    let out = fx.host.check_candidate(Slot::Green).await.expect("check");
    assert_eq!(
        out,
        format!("flexnode 9.9.9 args=version PATH={CHECK_PATH} HOME=unset stdin=none")
    );
}

#[tokio::test]
async fn check_candidate_refuses_bad_candidates() {
    let fx = joined().await;
    let green = fx.layout.slot_binary(Slot::Green);

    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("not installed"), "{m}");

    write_exec(&green, "#!/bin/sh\necho 'flexnode 1.0.0'\nexit 3\n");
    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("failed") && m.contains('3'), "{m}");

    write_exec(&green, "#!/bin/sh\necho 'something else 1.0'\n");
    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("flexnode <version>"), "{m}");

    std::fs::write(&green, b"not executable").expect("write");
    std::fs::set_permissions(&green, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let m = failed(fx.host.check_candidate(Slot::Green).await);
    assert!(m.contains("cannot run"), "{m}");

    // Chatty: only the first 4 KiB are kept, the rest is drained.
    write_exec(
        &green,
        "#!/bin/sh\necho 'flexnode 1.2.3'\nhead -c 1000000 /dev/zero\n",
    );
    assert_eq!(
        fx.host.check_candidate(Slot::Green).await,
        Ok("flexnode 1.2.3".to_string())
    );
}

#[tokio::test]
async fn check_candidate_kills_a_hanging_candidate() {
    let fx = joined().await;
    let host = fx
        .host
        .clone()
        .with_check_timeout(Duration::from_millis(500));
    write_exec(
        &fx.layout.slot_binary(Slot::Green),
        "#!/bin/sh\nexec sleep 30\n",
    );
    let started = Instant::now();
    let m = failed(host.check_candidate(Slot::Green).await);
    assert!(m.contains("did not finish"), "{m}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

// ---- selection ----------------------------------------------------------------------------

#[tokio::test]
async fn select_and_roll_back_move_the_links() {
    let fx = joined().await;
    let l = &fx.layout;
    let m = failed(fx.host.select_agent(InstallMode::Host, &GREEN, &BLUE).await);
    assert!(m.contains("not installed"), "{m}");
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    assert!(!l.last_good_link().exists());

    write_exec(
        &l.slot_binary(Slot::Green),
        "#!/bin/sh\necho 'flexnode 2.0.0'\n",
    );
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("switch");
    assert_eq!(link(&l.current_link()), "lib/flexnode-green");
    assert_eq!(link(&l.last_good_link()), "lib/flexnode-blue");
    assert_eq!(link(&l.bin_link()), BIN_LINK_TARGET);
    assert_eq!(
        fx.host.selected_agent(InstallMode::Host).await,
        Ok(Some(GREEN))
    );
    assert_eq!(running_build(l, &l.bin_link()), Some(GREEN));

    // Roll back (the executor's switch_back: both links at the old build).
    fx.host
        .select_agent(InstallMode::Host, &BLUE, &BLUE)
        .await
        .expect("roll back");
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
    assert_eq!(link(&l.last_good_link()), "lib/flexnode-blue");
    assert_eq!(leftovers(&l.agent_dir()), Vec::<String>::new());
    assert_eq!(leftovers(&l.bin_dir()), Vec::<String>::new());
}

#[tokio::test]
async fn selected_agent_reads_only_slot_links() {
    let fx = fixture();
    let l = &fx.layout;
    assert_eq!(fx.host.selected_agent(InstallMode::Host).await, Ok(None));
    std::fs::create_dir_all(l.agent_dir()).expect("dir");
    std::os::unix::fs::symlink("/usr/bin", l.current_link()).expect("link");
    failed(fx.host.selected_agent(InstallMode::Host).await);
    std::fs::remove_file(l.current_link()).expect("rm");
    std::fs::write(l.current_link(), b"file").expect("file");
    failed(fx.host.selected_agent(InstallMode::Host).await);
}

#[tokio::test]
async fn discard_never_removes_current_or_last_good() {
    let fx = joined().await;
    let l = &fx.layout;
    write_exec(&l.slot_binary(Slot::Green), "#!/bin/sh\n");
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("select");
    fx.host.discard_candidate(&GREEN).await.expect("discard");
    fx.host.discard_candidate(&BLUE).await.expect("discard");
    assert!(l.slot_binary(Slot::Green).exists());
    assert!(l.slot_binary(Slot::Blue).exists());

    fx.host
        .select_agent(InstallMode::Host, &BLUE, &BLUE)
        .await
        .expect("roll back");
    fx.host.discard_candidate(&GREEN).await.expect("discard");
    assert!(!l.slot_dir(Slot::Green).exists());
    assert!(l.slot_binary(Slot::Blue).exists());
    // Absent is fine; images are containerd's.
    fx.host.discard_candidate(&GREEN).await.expect("again");
    fx.host
        .discard_candidate(&AgentBuild::Image {
            digest: sha(b"img"),
        })
        .await
        .expect("image");
}

#[tokio::test]
async fn remove_agent_links_keeps_the_slots() {
    let fx = joined().await;
    let l = &fx.layout;
    write_exec(&l.slot_binary(Slot::Green), "#!/bin/sh\n");
    fx.host
        .select_agent(InstallMode::Host, &GREEN, &BLUE)
        .await
        .expect("select");
    fx.host.remove_agent_links().await.expect("remove");
    for p in [l.current_link(), l.last_good_link(), l.bin_link()] {
        assert!(std::fs::symlink_metadata(&p).is_err(), "{}", p.display());
    }
    assert!(l.slot_binary(Slot::Blue).exists());
    assert!(l.slot_binary(Slot::Green).exists());
    assert_eq!(fx.host.selected_agent(InstallMode::Host).await, Ok(None));
    fx.host.remove_agent_links().await.expect("again");

    // Re-join reuses the slot.
    fx.host
        .install_agent(InstallMode::Host, &BLUE)
        .await
        .expect("re-join");
    assert_eq!(link(&l.current_link()), "lib/flexnode-blue");
}

// ---- machines and runtime files -----------------------------------------------------------

#[tokio::test]
async fn provision_and_remove_machines() {
    let fx = fixture();
    let l = &fx.layout;
    assert_eq!(fx.host.machine_rootfs(Side::Kube1).await, Ok(None));
    fx.host
        .provision_machine(Side::Kube1, "1.33.2")
        .await
        .expect("provision");

    let m = l.machine_dir(Side::Kube1);
    assert_eq!(m, fx.root.join("var/lib/machines/kube1"));
    for (name, target) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        assert_eq!(link(&m.join(name)), target, "{name}");
    }
    for dir in [
        "usr", "etc", "var", "tmp", "proc", "sys", "dev", "run", "root",
    ] {
        let meta = std::fs::symlink_metadata(m.join(dir)).expect(dir);
        assert!(meta.is_dir(), "{dir}");
    }
    assert_eq!(mode(&m.join("tmp")), 0o1777);
    assert_eq!(mode(&m.join("root")), 0o700);
    // The trees hold set-id programs: no other user reaches into them.
    assert_eq!(mode(&l.machines_dir()), 0o700);
    assert_eq!(
        std::fs::read_to_string(m.join("etc/os-release")).expect("os-release"),
        "ID=test\nNAME=\"Test OS\"\n"
    );
    assert_eq!(
        std::fs::read(m.join("etc/machine-id")).expect("machine-id"),
        b""
    );
    let nspawn = std::fs::read_to_string(fx.root.join("etc/systemd/nspawn/kube1.nspawn"))
        .expect("nspawn file");
    assert_eq!(nspawn, NSPAWN_SETTINGS);
    assert!(nspawn.contains("[Exec]\nPrivateUsers=no\n"));
    assert!(nspawn.contains("[Files]\nBindReadOnly=/usr\n"));
    assert!(nspawn.contains("[Network]\nVirtualEthernet=no\n"));
    let marker: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(m.join("etc/flexnode-machine.json")).expect("marker"),
    )
    .expect("json");
    assert_eq!(marker, serde_json::json!({"kubernetesVersion": "1.33.2"}));
    assert_eq!(
        fx.host.machine_rootfs(Side::Kube1).await,
        Ok(Some(bare_tree("1.33.2")))
    );
    assert_eq!(fx.host.machine_rootfs(Side::Kube2).await, Ok(None));

    // Again, then for another version.
    fx.host
        .provision_machine(Side::Kube1, "1.33.2")
        .await
        .expect("again");
    fx.host
        .provision_machine(Side::Kube1, "1.34.0")
        .await
        .expect("new version");
    assert_eq!(
        fx.host.machine_rootfs(Side::Kube1).await,
        Ok(Some(bare_tree("1.34.0")))
    );
    assert_eq!(leftovers(&m.join("etc")), Vec::<String>::new());

    // Removal never follows a symlink out of the tree.
    let outside = fx.root.join("precious");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("keep"), b"keep").expect("keep");
    std::os::unix::fs::symlink(&outside, m.join("var/escape")).expect("escape link");
    fx.host
        .provision_machine(Side::Kube2, "1.33.2")
        .await
        .expect("kube2");
    fx.host.remove_machine(Side::Kube1).await.expect("remove");
    assert!(std::fs::symlink_metadata(&m).is_err());
    assert!(!l.nspawn_file(Side::Kube1).exists());
    assert!(outside.join("keep").exists());
    assert_eq!(fx.host.machine_rootfs(Side::Kube1).await, Ok(None));
    assert_eq!(leftovers(&l.machines_dir()), Vec::<String>::new());
    // The other side is untouched; absent is fine.
    assert_eq!(
        fx.host.machine_rootfs(Side::Kube2).await,
        Ok(Some(bare_tree("1.33.2")))
    );
    assert!(l.nspawn_file(Side::Kube2).exists());
    fx.host.remove_machine(Side::Kube1).await.expect("again");
}

#[tokio::test]
async fn provision_needs_an_os_release() {
    let fx = fixture();
    std::fs::remove_file(fx.root.join("usr/lib/os-release")).expect("rm");
    let m = failed(fx.host.provision_machine(Side::Kube2, "1.33.2").await);
    assert!(m.contains("os-release"), "{m}");
    assert_eq!(fx.host.machine_rootfs(Side::Kube2).await, Ok(None));

    let source = fx.root.join("elsewhere-os-release");
    std::fs::write(&source, "ID=other\n").expect("write");
    let host = fx.host.clone().with_os_release(&source);
    host.provision_machine(Side::Kube2, "1.33.2")
        .await
        .expect("provision");
    assert_eq!(
        std::fs::read_to_string(fx.layout.machine_dir(Side::Kube2).join("etc/os-release"))
            .expect("read"),
        "ID=other\n"
    );
}

#[tokio::test]
async fn runtime_files_are_found_and_wiped() {
    let fx = fixture();
    assert_eq!(fx.host.runtime_present().await, Ok(false));
    fx.host.wipe_runtime().await.expect("absent is fine");
    let dir = fx.root.join("etc/flexnode");
    std::fs::create_dir_all(dir.join("credentials")).expect("dir");
    std::fs::write(dir.join("config.yaml"), b"node: x").expect("config");
    std::fs::write(dir.join("credentials/key"), b"secret").expect("key");
    assert_eq!(fx.host.runtime_present().await, Ok(true));
    fx.host.wipe_runtime().await.expect("wipe");
    assert_eq!(fx.host.runtime_present().await, Ok(false));
    assert!(fx.root.join("etc").exists());
}

/// The module list for boots is written (once) and counts as a runtime file: a reset removes
/// it. This kernel has both modules (built in or loaded), so nothing runs `modprobe` here; the
/// suites' guests load them (e2e/host/lab.py, `kernel_modules`).
#[tokio::test]
async fn kernel_modules_are_listed_for_boots_and_wiped() {
    let fx = fixture();
    for (name, probe) in flexnode::effects::host::KERNEL_MODULES {
        let present = probe.present().expect("probe");
        assert!(present, "this test needs {name} in the kernel already");
    }
    fx.host.load_kernel_modules().await.expect("load");
    let list = fx.root.join("etc/modules-load.d/flexnode.conf");
    let text = std::fs::read_to_string(&list).expect("listed");
    assert!(text.ends_with("overlay\nbr_netfilter\n"), "{text}");
    let written = std::fs::metadata(&list)
        .expect("meta")
        .modified()
        .expect("mtime");
    fx.host.load_kernel_modules().await.expect("again");
    assert_eq!(
        std::fs::metadata(&list)
            .expect("meta")
            .modified()
            .expect("mtime"),
        written,
        "an unchanged list is not rewritten"
    );
    assert_eq!(fx.host.runtime_present().await, Ok(true));
    fx.host.wipe_runtime().await.expect("wipe");
    assert!(!list.exists());
    assert_eq!(fx.host.runtime_present().await, Ok(false));
}

// ---- https: the lab's artifact server over TLS ------------------------------------------

/// `e2e/artifacts/serve` over https with the lab PKI's certificate (`e2e/pki`), stopped when
/// dropped.
struct TlsArtifactServer {
    dir: tempfile::TempDir,
    child: std::process::Child,
    port: u16,
}

impl TlsArtifactServer {
    fn start(archive: &[u8]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let pki = dir.path().join("pki");
        let out = std::process::Command::new(repo.join("e2e/pki"))
            .arg("make")
            .arg(&pki)
            .output()
            .expect("run e2e/pki");
        assert!(
            out.status.success(),
            "e2e/pki make failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let files = dir.path().join("files");
        std::fs::create_dir(&files).expect("files");
        std::fs::write(files.join("a.tgz"), archive).expect("archive");
        let port_file = dir.path().join("port");
        let child = std::process::Command::new(repo.join("e2e/artifacts/serve"))
            .arg("--dir")
            .arg(&files)
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log")
            .arg(dir.path().join("log"))
            .arg("--tls-cert")
            .arg(pki.join("server.pem"))
            .arg("--tls-key")
            .arg(pki.join("server.key"))
            .spawn()
            .expect("start e2e/artifacts/serve");
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                break port;
            }
            assert!(
                Instant::now() < deadline,
                "the artifact server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Self { dir, child, port }
    }

    fn url(&self, path: &str) -> ArchiveUrl {
        url(&format!("https://127.0.0.1:{}{path}", self.port))
    }

    fn ca(&self, name: &str) -> PathBuf {
        self.dir.path().join("pki").join(name)
    }

    fn served(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }
}

impl Drop for TlsArtifactServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fetching_with(fx: Fixture, ca: Option<PathBuf>) -> Fixture {
    let trust = flexnode::effects::http::Trust { extra_ca_file: ca };
    Fixture {
        host: fx
            .host
            .with_fetcher(ArchiveFetcher::new().with_trust(trust)),
        ..fx
    }
}

#[tokio::test]
async fn https_downloads_need_a_trusted_certificate() {
    let archive = agent_archive(b"candidate over https");
    let server = TlsArtifactServer::start(&archive);

    // Trusted through the configured CA: staged, the query went to the server.
    let fx = fetching_with(joined().await, Some(server.ca("ca.pem")));
    stage(&fx, &server.url("/a.tgz?sig=SECRET"), &sha(&archive))
        .await
        .expect("https download from a trusted server");
    assert!(fx.layout.slot_binary(Slot::Green).exists());
    assert!(
        server.served().contains("GET /a.tgz 200"),
        "{}",
        server.served()
    );

    // The system store alone, and another CA: the certificate is refused, nothing staged,
    // nothing requested.
    let before = server.served().matches("GET /a.tgz").count();
    for ca in [None, Some(server.ca("other-ca.pem"))] {
        let fx = fetching_with(joined().await, ca.clone());
        let m = failed(stage(&fx, &server.url("/a.tgz?sig=SECRET"), &sha(&archive)).await);
        assert!(
            m.contains("TLS") && m.contains("not signed by a CA this node trusts"),
            "{ca:?}: {m}"
        );
        assert!(!m.contains("SECRET"), "{m}");
        assert_nothing_staged(&fx);
    }
    assert_eq!(server.served().matches("GET /a.tgz").count(), before);
}

/// On a host with no CA certificates at all (a minimal image: the QEMU guest of the host
/// suite has none), http downloads still work and https trusts only trustedCAFile. The
/// system store is emptied for a child run of this test (`SSL_CERT_FILE`/`SSL_CERT_DIR`
/// pointing nowhere), so the rest of this binary keeps the machine's store.
#[tokio::test]
async fn downloads_work_on_a_host_without_system_ca_certificates() {
    const INNER: &str = "FLEXNODE_TEST_NO_SYSTEM_CA";
    if std::env::var_os(INNER).is_none() {
        let name = "downloads_work_on_a_host_without_system_ca_certificates";
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args(["--exact", name, "--test-threads=1"])
            .env(INNER, "1")
            .env("SSL_CERT_FILE", "/nonexistent/ca-certificates.crt")
            .env("SSL_CERT_DIR", "/nonexistent")
            .output()
            .expect("run the child");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    let archive = agent_archive(b"candidate with no system trust");
    let plain = archive_server(archive.clone()).await;
    let fx = joined().await;
    stage(&fx, &plain.url("/a.tgz"), &sha(&archive))
        .await
        .expect("http works with no system CA certificates");

    let tls = TlsArtifactServer::start(&archive);
    let fx = fetching_with(joined().await, Some(tls.ca("ca.pem")));
    stage(&fx, &tls.url("/a.tgz"), &sha(&archive))
        .await
        .expect("https through trustedCAFile");
    let fx = fetching_with(joined().await, None);
    let m = failed(stage(&fx, &tls.url("/a.tgz"), &sha(&archive)).await);
    assert!(m.contains("not signed by a CA this node trusts"), "{m}");
}

/// A minimal tree's marker as `machine_rootfs` reads it.
fn bare_tree(version: &str) -> flexnode::effects::MachineTree {
    flexnode::effects::MachineTree {
        kubernetes_version: version.to_string(),
        image: None,
    }
}
