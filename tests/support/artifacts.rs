//! Agent archives as an AgentUpgrade downloads them, served over loopback HTTP.

use flexnode::effects::archive::member_name;
use flexnode::machine::agent::Arch;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The release archive's shape: one executable member, gzip at its default level. Returns
/// the archive's SHA-256 (lowercase hex), what an AgentUpgrade's `sha256` carries.
pub fn write_archive(path: &Path, binary: &[u8]) -> String {
    let member = member_name(Arch::from_rust(std::env::consts::ARCH)).expect("a supported arch");
    let file = std::fs::File::create(path).expect("create the archive");
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mut header = tar::Header::new_gnu();
    header.set_size(binary.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    tar.append_data(&mut header, &member, binary)
        .expect("append");
    tar.into_inner().expect("tar").finish().expect("gzip");
    hex::encode(Sha256::digest(std::fs::read(path).expect("the archive")))
}

/// `python3 -m http.server` on 127.0.0.1 over `dir`, stopped (by its PID) when dropped.
pub struct Served {
    child: Child,
    pub port: u16,
    pub dir: PathBuf,
}

impl Served {
    pub fn dir(dir: &Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("python3")
            .args([
                "-m",
                "http.server",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .arg("--directory")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 -m http.server");
        let served = Self {
            child,
            port,
            dir: dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "the HTTP server did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        served
    }

    /// The URL of `file` in the served directory.
    pub fn url(&self, file: &str) -> String {
        format!("http://127.0.0.1:{}/{file}", self.port)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
