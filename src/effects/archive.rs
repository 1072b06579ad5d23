//! Agent archives for the host install: download over http(s) (`http.rs`, the one HTTP stack)
//! to a 0600 temporary file while hashing, with a size cap enforced as the bytes arrive; check
//! the SHA-256 in constant time; then take the single member `flexnode-linux-<arch>` out of the
//! tar.gz and install it as `<dir>/flexnode` (0755) with a rename.
//!
//! Every error message is a fixed string plus the redacted URL (`ArchiveUrl`'s `Display`):
//! never the query (it may hold a SAS token), never userinfo, never a redirect target.
//! Temporary files are removed on every path, including a cancelled future.

use super::fs::{TempFile, sync_dir};
use super::http::{self, MAX_REDIRECTS, Trust};
use super::{EffectError, EffectResult};
use crate::lifecycle::agent::{Arch, ArchiveUrl, Sha256Hex};
use futures::StreamExt;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Largest archive accepted (`256<<20`).
pub const MAX_ARCHIVE_BYTES: u64 = 256 << 20;
/// Largest member accepted.
pub const MAX_MEMBER_BYTES: u64 = 256 << 20;
/// Largest decompressed stream read from the archive.
pub const MAX_UNPACKED_BYTES: u64 = 2 * (256 << 20);
/// The name an installed agent binary has in its slot.
pub const BINARY_NAME: &str = "flexnode";

/// The one member an agent archive holds for `arch`: `flexnode-linux-<arch>`.
pub fn member_name(arch: Arch) -> Option<String> {
    match arch {
        Arch::Amd64 | Arch::Arm64 => Some(format!("flexnode-linux-{}", arch.as_str())),
        Arch::Unsupported => None,
    }
}

/// SHA-256 comparison that looks at every byte whatever the inputs (no early exit).
pub fn digest_matches(actual: &[u8; 32], expected: &Sha256Hex) -> bool {
    let mut want = [0u8; 32];
    let decoded = hex::decode_to_slice(expected.as_str(), &mut want).is_ok();
    let diff = actual
        .iter()
        .zip(want.iter())
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(diff) == 0 && decoded
}

/// Size caps of one archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchiveLimits {
    pub max_download: u64,
    pub max_member: u64,
    pub max_unpacked: u64,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        Self {
            max_download: MAX_ARCHIVE_BYTES,
            max_member: MAX_MEMBER_BYTES,
            max_unpacked: MAX_UNPACKED_BYTES,
        }
    }
}

/// Downloads, verifies and installs agent archives.
#[derive(Clone, Debug)]
pub struct ArchiveFetcher {
    limits: ArchiveLimits,
    connect_timeout: Duration,
    read_timeout: Duration,
    total_timeout: Duration,
    max_redirects: usize,
    trust: Trust,
}

impl Default for ArchiveFetcher {
    fn default() -> Self {
        Self::new()
    }
}

/// A downloaded archive in its temporary file (removed when this is dropped).
#[derive(Debug)]
pub struct Download {
    file: TempFile,
    size: u64,
    sha256: [u8; 32],
}

impl Download {
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn sha256(&self) -> &[u8; 32] {
        &self.sha256
    }
}

impl ArchiveFetcher {
    /// Production limits: 256 MiB, 10 redirects, connect 15 s, read 60 s, whole download 10 min.
    pub fn new() -> Self {
        Self {
            limits: ArchiveLimits::default(),
            connect_timeout: Duration::from_secs(15),
            read_timeout: Duration::from_secs(60),
            total_timeout: Duration::from_secs(600),
            max_redirects: MAX_REDIRECTS,
            trust: Trust::default(),
        }
    }

    /// What TLS trusts besides the system store.
    pub fn with_trust(mut self, trust: Trust) -> Self {
        self.trust = trust;
        self
    }

    pub fn with_limits(mut self, limits: ArchiveLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Connect timeout, read timeout (per wait for headers or the next body chunk) and the
    /// limit on the whole download.
    pub fn with_timeouts(mut self, connect: Duration, read: Duration, total: Duration) -> Self {
        self.connect_timeout = connect;
        self.read_timeout = read;
        self.total_timeout = total;
        self
    }

    pub fn limits(&self) -> ArchiveLimits {
        self.limits
    }

    /// Download, digest check and install of `flexnode-linux-<arch>` as `<dir>/flexnode`.
    /// `dir` must exist; only temporary files in it and the final rename touch it.
    pub async fn install(
        &self,
        url: &ArchiveUrl,
        sha256: &Sha256Hex,
        arch: Arch,
        dir: &Path,
    ) -> EffectResult {
        let member = member_name(arch).ok_or_else(|| {
            EffectError::Failed("this node's CPU architecture has no agent build".into())
        })?;
        let download = self.download(url, dir).await?;
        if !digest_matches(download.sha256(), sha256) {
            return Err(EffectError::Failed(format!(
                "archive downloaded from {url} does not match sha256 {}",
                sha256.short()
            )));
        }
        let limits = self.limits;
        let dir = dir.to_path_buf();
        let shown = url.to_string();
        tokio::task::spawn_blocking(move || {
            let result = install_member(download.path(), &member, &dir, BINARY_NAME, limits);
            drop(download);
            result.map_err(|e| EffectError::Failed(format!("archive from {shown}: {e}")))
        })
        .await
        .map_err(|e| EffectError::Failed(format!("archive install task: {e}")))?
    }

    /// Downloads `url` into a 0600 temporary file in `dir`, hashing as it goes.
    pub async fn download(&self, url: &ArchiveUrl, dir: &Path) -> EffectResult<Download> {
        let shown = url.to_string();
        match tokio::time::timeout(self.total_timeout, self.download_inner(url, dir, &shown)).await
        {
            Ok(result) => result,
            Err(_) => Err(EffectError::Failed(format!(
                "download of {shown} failed: timed out"
            ))),
        }
    }

    async fn download_inner(
        &self,
        url: &ArchiveUrl,
        dir: &Path,
        shown: &str,
    ) -> EffectResult<Download> {
        let failed =
            |what: &str| EffectError::Failed(format!("download of {shown} failed: {what}"));
        let mut current = url::Url::parse(url.expose()).map_err(|_| failed("invalid URL"))?;
        if !matches!(current.scheme(), "http" | "https") {
            return Err(failed("URL must use http or https"));
        }
        if !current.username().is_empty() || current.password().is_some() {
            return Err(failed("URL must not contain credentials"));
        }
        current.set_fragment(None);
        let client = http::client(
            &self.trust,
            self.connect_timeout,
            self.read_timeout,
            self.max_redirects,
        )?;
        let response = client
            .get(current.as_str())
            .send()
            .await
            .map_err(|e| failed(&http::describe(&e)))?;
        let status = response.status();
        if status.as_u16() != 200 {
            return Err(failed(&format!("HTTP {}", status.as_u16())));
        }
        let cap = self.limits.max_download;
        let declared = response.content_length();
        if declared.is_some_and(|n| n > cap) {
            return Err(failed(&too_large(cap)));
        }

        let file = TempFile::name_in(dir, "flexnode-download")?;
        let mut out = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(file.path())
            .await
            .map_err(|e| {
                EffectError::Failed(format!(
                    "download of {shown} failed: create temporary file in {}: {}",
                    dir.display(),
                    e.kind()
                ))
            })?;
        let write_failed = |e: std::io::Error| {
            EffectError::Failed(format!(
                "download of {shown} failed: write temporary file in {}: {}",
                dir.display(),
                e.kind()
            ))
        };
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut body = response.bytes_stream();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| failed(&http::describe(&e)))?;
            size = size.saturating_add(chunk.len() as u64);
            if size > cap {
                return Err(failed(&too_large(cap)));
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(write_failed)?;
        }
        if declared.is_some_and(|n| n != size) {
            return Err(failed("body shorter than its Content-Length"));
        }
        out.flush().await.map_err(write_failed)?;
        drop(out);
        let mut sha256 = [0u8; 32];
        sha256.copy_from_slice(&hasher.finalize());
        Ok(Download { file, size, sha256 })
    }
}

fn too_large(cap: u64) -> String {
    format!("archive is larger than {} MiB", cap >> 20)
}

/// A reader that fails once more than `left` bytes come through it.
pub(crate) struct Capped<R> {
    pub(crate) inner: R,
    pub(crate) left: u64,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        let n64 = n as u64;
        if n64 > self.left {
            return Err(std::io::Error::other(UNPACKED_TOO_LARGE));
        }
        self.left -= n64;
        Ok(n)
    }
}

const UNPACKED_TOO_LARGE: &str = "decompressed archive is too large";

/// The error (possibly wrapped by the tar reader) is the [`Capped`] limit.
pub(crate) fn hit_unpacked_cap(e: &std::io::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if err.to_string() == UNPACKED_TOO_LARGE {
            return true;
        }
        if let Some(inner) = err
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            if inner.to_string() == UNPACKED_TOO_LARGE {
                return true;
            }
            source = inner.source();
            continue;
        }
        source = err.source();
    }
    false
}

/// Takes the single regular member `member` out of the tar.gz at `archive` and installs it as
/// `<dir>/<name>` (0755) with a rename. Anything but exactly that one member is refused. The
/// message of an error is a fixed string (plus the directory).
pub fn install_member(
    archive: &Path,
    member: &str,
    dir: &Path,
    name: &str,
    limits: ArchiveLimits,
) -> Result<(), String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let file = std::fs::File::open(archive).map_err(|e| format!("open: {}", e.kind()))?;
    let gz = flate2::read::GzDecoder::new(std::io::BufReader::new(file));
    let mut tar = tar::Archive::new(Capped {
        inner: gz,
        left: limits.max_unpacked,
    });
    let unreadable = |e: std::io::Error| {
        if hit_unpacked_cap(&e) {
            UNPACKED_TOO_LARGE.to_string()
        } else {
            "not a readable tar.gz archive".to_string()
        }
    };
    let mut installed: Option<TempFile> = None;
    for entry in tar.entries().map_err(unreadable)? {
        let mut entry = entry.map_err(unreadable)?;
        if installed.is_some() {
            return Err("archive must contain exactly one member".into());
        }
        if entry.path_bytes().as_ref() != member.as_bytes() {
            return Err(format!("archive member must be named exactly {member}"));
        }
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(format!("archive member {member} must be a regular file"));
        }
        let size = entry.size();
        if size == 0 || size > limits.max_member {
            return Err(format!(
                "archive member {member} must hold 1 byte to {} MiB",
                limits.max_member >> 20
            ));
        }
        let temp = TempFile::name_in(dir, name).map_err(|e| e.to_string())?;
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(temp.path())
            .map_err(|e| format!("create temporary file in {}: {}", dir.display(), e.kind()))?;
        let copied = std::io::copy(&mut (&mut entry).take(size), &mut out).map_err(unreadable)?;
        if copied != size {
            return Err("archive is truncated".into());
        }
        let write_failed =
            |e: std::io::Error| format!("write {name} in {}: {}", dir.display(), e.kind());
        out.flush().map_err(write_failed)?;
        out.set_permissions(std::fs::Permissions::from_mode(0o755))
            .map_err(write_failed)?;
        out.sync_all().map_err(write_failed)?;
        installed = Some(temp);
    }
    let temp = installed.ok_or_else(|| "archive must contain exactly one member".to_string())?;
    let target = dir.join(name);
    std::fs::rename(temp.path(), &target)
        .map_err(|e| format!("install {}: {}", target.display(), e.kind()))?;
    temp.keep();
    sync_dir(dir).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_compare() {
        let hex = "00".repeat(31) + "ff";
        let expected = Sha256Hex::parse(&hex).expect("hex");
        let mut actual = [0u8; 32];
        actual[31] = 0xff;
        assert!(digest_matches(&actual, &expected));
        actual[0] = 1;
        assert!(!digest_matches(&actual, &expected));
        actual[0] = 0;
        actual[31] = 0xfe;
        assert!(!digest_matches(&actual, &expected));
    }

    #[test]
    fn member_names() {
        assert_eq!(
            member_name(Arch::Amd64).as_deref(),
            Some("flexnode-linux-amd64")
        );
        assert_eq!(
            member_name(Arch::Arm64).as_deref(),
            Some("flexnode-linux-arm64")
        );
        assert_eq!(member_name(Arch::Unsupported), None);
    }
}
