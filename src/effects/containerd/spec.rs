//! The OCI runtime spec of an agent container, built by hand: containerd's Go `oci` package
//! has no Rust counterpart, and the spec needed is small. Privileged follows containerd's
//! `WithPrivileged` + `WithHostDevices`; unprivileged its defaults.

use crate::effects::{EffectError, EffectResult};
use std::path::Path;

/// A host path bound into a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BindMount {
    /// Absolute path on the host.
    pub source: std::path::PathBuf,
    /// Absolute path in the container.
    pub destination: String,
    pub read_only: bool,
}

/// What a container's rootfs is made from: the image's top chainID and its config.
pub(super) struct ImageForContainer {
    pub(super) name: String,
    pub(super) top_chain_id: String,
    pub(super) env: Vec<String>,
    pub(super) cwd: String,
}

/// The label on every container (and its snapshot) the agent creates; the only ones it deletes.
pub const MANAGED_LABEL: &str = "flexnode.io/managed";
pub const MANAGED_VALUE: &str = "true";
/// The runtime shim containers run under.
pub const RUNC_RUNTIME: &str = "io.containerd.runc.v2";
/// `Any.type_url` containerd expects for an OCI runtime spec (JSON).
pub const SPEC_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/Spec";
pub(super) const DEFAULT_PATH: &str =
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Every Linux capability, in kernel order (index = capability number); privileged containers
/// get those of them in this process's bounding set.
const ALL_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// containerd's (and Docker's) default set for unprivileged containers.
const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

const MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
];

const READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// The OCI runtime spec (JSON) of a container.
pub(super) fn runtime_spec(
    namespace: &str,
    id: &str,
    args: &[String],
    privileged: bool,
    mounts: &[BindMount],
    image: &ImageForContainer,
) -> EffectResult<Vec<u8>> {
    use serde_json::json;
    let caps: Vec<&str> = if privileged {
        // As containerd's WithPrivileged: every capability this process may hand on (its
        // bounding set; a sandboxed host may lack some), since runc fails on any other.
        let bounding = bounding_caps();
        ALL_CAPS
            .iter()
            .enumerate()
            .filter(|(i, _)| bounding & (1u64 << i) != 0)
            .map(|(_, c)| *c)
            .collect()
    } else {
        DEFAULT_CAPS.to_vec()
    };
    let sys_options = if privileged {
        json!(["nosuid", "noexec", "nodev", "rw"])
    } else {
        json!(["nosuid", "noexec", "nodev", "ro"])
    };
    let mut spec_mounts = vec![
        json!({"destination": "/proc", "type": "proc", "source": "proc",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts",
               "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/shm", "type": "tmpfs", "source": "shm",
               "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue",
               "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs",
               "options": sys_options}),
        json!({"destination": "/run", "type": "tmpfs", "source": "tmpfs",
               "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
    ];
    for m in mounts {
        spec_mounts.push(json!({
            "destination": m.destination,
            "type": "bind",
            "source": m.source,
            "options": ["rbind", "rprivate", if m.read_only { "ro" } else { "rw" }],
        }));
    }
    let mut linux = json!({
        "namespaces": [
            {"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"},
            {"type": "network"}
        ],
        "cgroupsPath": format!("/{}/{id}", namespace),
    });
    if privileged {
        linux["resources"] = json!({"devices": [{"allow": true, "access": "rwm"}]});
        linux["devices"] = serde_json::Value::Array(host_devices());
    } else {
        linux["resources"] = json!({"devices": [{"allow": false, "access": "rwm"}]});
        linux["maskedPaths"] = json!(MASKED_PATHS);
        linux["readonlyPaths"] = json!(READONLY_PATHS);
    }
    let spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": 0, "gid": 0},
            "args": args,
            "env": image.env,
            "cwd": image.cwd,
            "capabilities": {
                "bounding": caps, "effective": caps, "permitted": caps,
            },
            "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
            "noNewPrivileges": !privileged,
        },
        "root": {"path": "rootfs", "readonly": false},
        "hostname": id,
        "mounts": spec_mounts,
        "linux": linux,
    });
    serde_json::to_vec(&spec)
        .map_err(|e| EffectError::Failed(format!("container {id}: runtime spec: {e}")))
}

/// This process's capability bounding set (`CapBnd` in /proc/self/status); every known
/// capability when it cannot be read.
fn bounding_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapBnd:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(u64::MAX)
}

/// The host's device nodes under /dev (not pts, shm, mqueue: the container mounts its own),
/// as `linux.devices` entries, as containerd's `WithHostDevices` does for privileged ones.
fn host_devices() -> Vec<serde_json::Value> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("/dev")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let ft = meta.file_type();
            if ft.is_dir() {
                let skip = [
                    "/dev/pts",
                    "/dev/shm",
                    "/dev/mqueue",
                    "/dev/.lxc",
                    "/dev/.udev",
                ];
                if !skip.iter().any(|s| path == Path::new(s)) {
                    dirs.push(path);
                }
                continue;
            }
            let kind = if ft.is_char_device() {
                "c"
            } else if ft.is_block_device() {
                "b"
            } else {
                continue;
            };
            // /dev/console belongs to the container's terminal setup.
            if path == Path::new("/dev/console") || path == Path::new("/dev/ptmx") {
                continue;
            }
            let rdev = meta.rdev();
            let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
            let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
            out.push(serde_json::json!({
                "path": path,
                "type": kind,
                "major": major,
                "minor": minor,
                "fileMode": meta.mode() & 0o7777,
                "uid": meta.uid(),
                "gid": meta.gid(),
            }));
        }
    }
    out
}
