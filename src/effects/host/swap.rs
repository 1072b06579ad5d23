//! Swap off for good on the host: the swap lines of its `/etc/fstab` commented out, so no
//! boot turns swap on again from there (the swap units are systemd's: `src/exec/apply.rs`
//! stops and masks them). The anchor edits its image's fstab instead, and swap comes back.

use super::FsHost;
use crate::effects::EffectResult;
use crate::effects::fs::{io_failed, read_small, write_file_atomic};
use std::os::unix::fs::PermissionsExt;

/// What a commented-out line starts with.
const MARK: &str = "# flexnode: swap off (the kubelet needs it): ";

impl FsHost {
    pub(super) fn comment_out_fstab_swap(&self) -> EffectResult {
        let path = self.layout.fstab();
        let Some(text) = read_small(&path, 1 << 20, false)? else {
            return Ok(());
        };
        let Some(out) = without_swap(&text) else {
            return Ok(());
        };
        let mode = std::fs::metadata(&path)
            .map_err(|e| io_failed("inspect", &path, &e))?
            .permissions()
            .mode()
            & 0o7777;
        write_file_atomic(&path, out.as_bytes(), mode)?;
        tracing::info!(fstab = %path.display(), "swap lines commented out");
        Ok(())
    }
}

/// `fstab` with every swap entry (third field `swap`) commented out; `None` when it has none.
pub(super) fn without_swap(fstab: &str) -> Option<String> {
    let mut changed = false;
    let out: String = fstab
        .split_inclusive('\n')
        .map(|line| {
            let entry = line.trim_start();
            let is_swap =
                !entry.starts_with('#') && entry.split_whitespace().nth(2) == Some("swap");
            if is_swap {
                changed = true;
                format!("{MARK}{line}")
            } else {
                line.to_string()
            }
        })
        .collect();
    changed.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_swap_entries_are_commented_out_once() {
        let fstab = "/dev/vda / ext4 defaults 0 1\n\
                     # /dev/vdb none swap sw 0 0\n\
                     /swapfile none swap sw 0 0\n\
                     \tUUID=1234  none  swap  defaults  0  0\n\
                     /dev/vdc /srv/swap ext4 defaults 0 2";
        let out = without_swap(fstab).expect("changed");
        assert_eq!(
            out,
            format!(
                "/dev/vda / ext4 defaults 0 1\n\
                 # /dev/vdb none swap sw 0 0\n\
                 {MARK}/swapfile none swap sw 0 0\n\
                 {MARK}\tUUID=1234  none  swap  defaults  0  0\n\
                 /dev/vdc /srv/swap ext4 defaults 0 2"
            )
        );
        assert_eq!(without_swap(&out), None, "a second run changes nothing");
        assert_eq!(without_swap(""), None);
    }
}
