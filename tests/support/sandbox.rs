//! The agent's units' sandbox as recorded in docs/reliability.md ("Security review"): the
//! exposure `systemd-analyze security` gives each unit (systemd 252), which no change may
//! raise, and what the host units' processes run with.

/// `(mode, unit, exposure)`: the recorded overall exposure of each unit in `units/<mode>/`
/// (before the sandbox: 9.6 each, the container install's agent 9.8).
pub const EXPOSURE: &[(&str, &str, f64)] = &[
    ("host", "flexnode-agent.service", 3.1),
    ("host", "flexnode-agent-recovery.service", 3.1),
    ("host", "flexnode-reset.service", 3.1),
    ("host", "flexnode-bootstrap.service", 3.2),
    ("container", "flexnode-agent.service", 2.8),
    ("container", "flexnode-agent-recovery.service", 2.6),
    ("container", "flexnode-reset.service", 2.6),
    ("container", "flexnode-bootstrap.service", 3.4),
];

/// The recorded exposure of `unit` in `mode`.
pub fn recorded(mode: &str, unit: &str) -> f64 {
    EXPOSURE
        .iter()
        .find(|(m, u, _)| *m == mode && *u == unit)
        .map(|(_, _, e)| *e)
        .unwrap_or_else(|| panic!("no recorded exposure for units/{mode}/{unit}"))
}

/// The overall exposure in `systemd-analyze security UNIT`'s output (its last line, `→
/// Overall exposure level for UNIT: 3.1 OK 🙂`).
pub fn overall(output: &str) -> f64 {
    output
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for "))
        .and_then(|(_, rest)| rest.rsplit_once(": "))
        .and_then(|(_, level)| level.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in:\n{output}"))
}

/// The capabilities the host units keep (`CapabilityBoundingSet=`), by number: D-Bus calls
/// to systemd (CAP_SYS_ADMIN), machined (CAP_KILL) and logind (CAP_SYS_BOOT), the host's
/// modprobe (CAP_SYS_MODULE), and unpacking and removing machine trees (the rest).
pub const HOST_CAPABILITIES: &[(&str, u32)] = &[
    ("CAP_CHOWN", 0),
    ("CAP_DAC_OVERRIDE", 1),
    ("CAP_DAC_READ_SEARCH", 2),
    ("CAP_FOWNER", 3),
    ("CAP_FSETID", 4),
    ("CAP_KILL", 5),
    ("CAP_SYS_MODULE", 16),
    ("CAP_SYS_ADMIN", 21),
    ("CAP_SYS_BOOT", 22),
    ("CAP_SETFCAP", 31),
];

/// What the container install's units keep beyond [`HOST_CAPABILITIES`]: host programs run
/// chrooted at /host (`src/effects/host/exec.rs`). ctr's `--privileged` hands its own
/// capabilities to the container, so this bound is also the agent's
/// (`units/container/flexnode-agent.service`).
pub const CONTAINER_EXTRA_CAPABILITIES: &[(&str, u32)] = &[("CAP_SYS_CHROOT", 18)];

/// The capabilities the units of `mode` keep.
pub fn capabilities(mode: &str) -> Vec<(&'static str, u32)> {
    let extra = match mode {
        "host" => &[][..],
        "container" => CONTAINER_EXTRA_CAPABILITIES,
        other => panic!("no install mode {other}"),
    };
    HOST_CAPABILITIES.iter().chain(extra).copied().collect()
}

/// [`HOST_CAPABILITIES`] as `/proc/PID/status` shows a set (`CapBnd:`).
pub fn host_capability_mask() -> u64 {
    capabilities("host").iter().map(|(_, n)| 1u64 << n).sum()
}

/// A field of `/proc/PID/status` (`NoNewPrivs`, `Seccomp`, `CapBnd`, …).
pub fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|r| r.strip_prefix(':'))
            .map(str::trim)
    })
}
