//! `FsHost` on the real filesystem (a temporary root) and the archive downloader against a real
//! HTTP server on 127.0.0.1: slots and links, staging and its refusals, the candidate check,
//! machine trees and runtime files. One file per part of `src/effects/host/` and the
//! downloader; here what they share (the fixture, archives, an HTTP server).

mod candidate;
mod https;
mod install;
mod machines;
mod slots;
mod staging;

use flexnode::effects::archive::{self, ArchiveFetcher, ArchiveLimits, digest_matches};
use flexnode::effects::host::{
    BIN_LINK_TARGET, CHECK_PATH, FsHost, HostLayout, NSPAWN_SETTINGS, running_build,
};
use flexnode::effects::{EffectError, EffectResult, Host};
use flexnode::lifecycle::agent::{AgentBuild, InstallMode, Slot};
use flexnode::lifecycle::agent::{Arch, ArchiveUrl, Sha256Hex};
use flexnode::lifecycle::state::Side;
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
