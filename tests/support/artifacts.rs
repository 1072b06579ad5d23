//! Agent archives as an AgentUpgrade downloads them, packed and served by the host lab's own
//! tools (`e2e/artifacts/pack`, `e2e/artifacts/serve`) on loopback.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("e2e/artifacts")
        .join(name)
}

/// `dir/flexnode-NAME.tar.gz` of `binary` (one member, as a release archive has it); returns
/// the file's name and its SHA-256 (what an AgentUpgrade's `sha256` carries).
pub fn pack(dir: &Path, name: &str, binary: &Path) -> (String, String) {
    let out = Command::new(tool("pack"))
        .arg(dir)
        .arg(format!("{name}={}", binary.display()))
        .output()
        .expect("run e2e/artifacts/pack");
    assert!(
        out.status.success(),
        "pack: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // `NAME SHA256 PATH SIZE`
    let line = String::from_utf8_lossy(&out.stdout).to_string();
    let sha = line.split_whitespace().nth(1).expect("pack's sha256");
    (format!("flexnode-{name}.tar.gz"), sha.to_string())
}

/// `e2e/artifacts/serve` over `dir` on 127.0.0.1, stopped (by its PID) when dropped.
pub struct Served {
    child: Child,
    pub port: u16,
    /// Where the server writes its port (private; removed with it).
    _state: tempfile::TempDir,
}

impl Served {
    pub fn dir(dir: &Path) -> Self {
        Self::with(dir, &[])
    }

    /// The same, `/slow/<file>` sending `chunk` bytes every `interval_s` seconds, and every
    /// request logged to `log` (the path only: `time GET /slow/<file> start <size>`, then the
    /// status line when it ends).
    pub fn throttled(dir: &Path, chunk: u64, interval_s: f64, log: &Path) -> Self {
        let args = [
            "--slow-chunk".to_string(),
            chunk.to_string(),
            "--slow-interval".to_string(),
            interval_s.to_string(),
            "--log".to_string(),
            log.display().to_string(),
        ];
        Self::with(dir, &args)
    }

    fn with(dir: &Path, args: &[String]) -> Self {
        let state = tempfile::tempdir().expect("a directory for the port file");
        let port_file = state.path().join("port");
        let child = Command::new(tool("serve"))
            .arg("--dir")
            .arg(dir)
            .args(args)
            .arg("--port-file")
            .arg(&port_file)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run e2e/artifacts/serve");
        let mut served = Self {
            child,
            port: 0,
            _state: state,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while served.port == 0 {
            assert!(
                Instant::now() < deadline,
                "the artifact server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
            served.port = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(0);
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
