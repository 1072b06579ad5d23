//! A process's CPU time and resident memory, from `/proc` (the benchmarks read them).

use std::path::Path;

/// CPU seconds (user + system) a process has used.
pub fn cpu_secs(pid: u32) -> f64 {
    cpu_secs_in(Path::new(&format!("/proc/{pid}")))
}

/// The same from a process's `/proc/PID` directory, e.g. in a container's procfs.
pub fn cpu_secs_in(proc: &Path) -> f64 {
    let stat = std::fs::read_to_string(proc.join("stat")).expect("/proc/PID/stat");
    // The fields after the command, which is in parentheses and may hold spaces.
    let rest = &stat[stat.rfind(')').expect("stat's comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
    ticks / 100.0 // USER_HZ
}

/// Resident memory in MiB (`VmRSS`).
pub fn rss_mib(pid: u32) -> f64 {
    rss_mib_in(Path::new(&format!("/proc/{pid}")))
}

pub fn rss_mib_in(proc: &Path) -> f64 {
    let status = std::fs::read_to_string(proc.join("status")).expect("/proc/PID/status");
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS");
    kib / 1024.0
}
