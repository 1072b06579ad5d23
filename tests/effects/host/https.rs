//! The host effects over https: the lab's artifact server over TLS (`e2e/artifacts/serve`,
//! the lab PKI), a trustedCAFile, and a host without system CA certificates.

use super::*;

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
    if !crate::support::in_own_process(
        "host::https::downloads_work_on_a_host_without_system_ca_certificates",
        &[
            ("SSL_CERT_FILE", "/nonexistent/ca-certificates.crt"),
            ("SSL_CERT_DIR", "/nonexistent"),
        ],
    ) {
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
