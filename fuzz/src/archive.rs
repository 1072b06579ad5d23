//! Target `archive`: a downloaded agent archive (tar.gz) unpacked into its slot
//! (`src/effects/archive.rs:install_member`, the real extraction, into a directory on tmpfs).
//! Accepted: the slot holds exactly the one binary, 0755, the member's bytes, within the cap.
//! Refused: the slot is left empty, and the message is one short line. Either way nothing
//! else changes.
//!
//! Input: the archive's bytes.

use crate::common::{Outcome, assert_short_line, fresh_dir, snapshot};
use flexnode::effects::archive::{ArchiveLimits, install_member};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

pub const MEMBER: &str = "flexnode-linux-amd64";
/// Small caps: the same code paths as the real ones (256 MiB), at fuzzing speed.
pub const LIMITS: ArchiveLimits = ArchiveLimits {
    max_download: 1 << 20,
    max_member: 64 << 10,
    max_unpacked: 256 << 10,
};

pub fn check(data: &[u8], scratch: &Path) -> Outcome {
    let root = scratch.join("archive");
    fresh_dir(&root);
    let archive = root.join("download.tgz");
    std::fs::write(&archive, data).expect("write the archive");
    std::fs::write(root.join("sentinel"), b"outside the slot").expect("write");
    let slot = root.join("slot");
    std::fs::create_dir(&slot).expect("create the slot");
    let before = snapshot(&root);

    let result = install_member(&archive, MEMBER, &slot, "flexnode", LIMITS);
    let mut after = snapshot(&root);
    let installed = after.remove(Path::new("slot/flexnode"));
    let slot_entry = (
        after.remove(Path::new("slot")),
        before.get(Path::new("slot")).cloned(),
    );
    let mut before = before;
    before.remove(Path::new("slot"));
    assert_eq!(
        before, after,
        "the unpack changed something outside the slot"
    );
    assert!(slot_entry.0.is_some(), "the slot is gone");
    match &result {
        Ok(()) => {
            let file = installed.expect("an accepted archive installs the binary");
            assert_eq!(file.kind, "file");
            assert_eq!(file.mode & 0o7777, 0o755);
            assert!(
                file.len >= 1 && file.len <= LIMITS.max_member,
                "{} bytes",
                file.len
            );
            assert_eq!(Some(file.data), member_bytes(data), "the installed bytes");
            let mode = std::fs::metadata(&slot).expect("slot").permissions().mode();
            assert!(mode & 0o777 != 0);
        }
        Err(message) => {
            assert!(
                installed.is_none(),
                "a refused archive left a binary ({message})"
            );
            let left: Vec<_> = std::fs::read_dir(&slot)
                .expect("slot")
                .flatten()
                .map(|e| e.path())
                .collect();
            assert!(
                left.is_empty(),
                "a refused archive left {left:?} ({message})"
            );
            assert_short_line(message, 200, "install_member");
        }
    }
    Outcome::from(&result)
}

/// The first member's bytes as another reading of the same tar.gz gives them.
fn member_bytes(data: &[u8]) -> Option<Vec<u8>> {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(data));
    let mut entry = tar.entries().ok()?.next()?.ok()?;
    let mut out = Vec::new();
    entry.read_to_end(&mut out).ok()?;
    Some(out)
}
