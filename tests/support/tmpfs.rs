//! A small filesystem of its own (tmpfs, root only), mounted over a test's directory: a disk
//! the test fills up, or remounts read-only, without touching anything else. Unmounted
//! (lazily) when dropped.

use rustix::mount::{MountFlags, UnmountFlags};
use std::io::Write;
use std::path::{Path, PathBuf};

pub struct Tmpfs {
    pub path: PathBuf,
}

impl Tmpfs {
    /// A `size_kib` tmpfs at `path` (created), mode 0700 like the store's directory.
    pub fn mount(path: &Path, size_kib: u64) -> Self {
        assert!(
            rustix::process::geteuid().is_root(),
            "mounting a tmpfs needs root (CI runs the tests as root)"
        );
        std::fs::create_dir_all(path).expect("the mount point");
        let data = std::ffi::CString::new(format!("size={size_kib}k,mode=0700")).expect("options");
        rustix::mount::mount(
            "tmpfs",
            path,
            "tmpfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            Some(data.as_c_str()),
        )
        .expect("mount a tmpfs");
        Self {
            path: path.to_path_buf(),
        }
    }

    /// Writes `name` until the filesystem refuses (ENOSPC); its path.
    pub fn fill(&self, name: &str) -> PathBuf {
        let filler = self.path.join(name);
        let mut f = std::fs::File::create(&filler).expect("the filler");
        let block = vec![0x5a_u8; 4096];
        loop {
            match f.write_all(&block).and_then(|()| f.sync_data()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => {
                    break;
                }
                Err(e) => panic!("filling {}: {e}", filler.display()),
            }
        }
        filler
    }

    /// Remounts it read-only (`true`) or read-write.
    ///
    /// A read-only remount is refused (EBUSY) while any process holds a file on it open for
    /// writing, and a child another test thread has just forked holds a copy of every
    /// descriptor (and shared mapping, such as SQLite's `-shm`) until its exec: so EBUSY is
    /// retried for a while, then reported.
    pub fn read_only(&self, ro: bool) {
        let flags = MountFlags::NOSUID
            | MountFlags::NODEV
            | if ro {
                MountFlags::RDONLY
            } else {
                MountFlags::empty()
            };
        let mut tries = 0;
        loop {
            match rustix::mount::mount_remount(&self.path, flags, "") {
                Ok(()) => return,
                Err(rustix::io::Errno::BUSY) if tries < 100 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(e) => panic!("remount {} after {tries} tries: {e}", self.path.display()),
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = rustix::mount::unmount(&self.path, UnmountFlags::DETACH);
    }
}
