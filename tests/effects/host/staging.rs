//! Staging an agent archive (`src/effects/archive.rs`, `src/effects/http.rs`): the download,
//! its digest and size caps, redirects, transport failures without secrets, the archive's
//! one member.

use super::*;

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
