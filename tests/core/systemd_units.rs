//! `systemd-analyze verify` on every unit file in `units/host/` and `units/container/`, with the
//! systemd of Debian 12 (the target). Each mode's units are verified together in a throwaway root
//! (`--root`): the units in its `/etc/systemd/system`, the host's stock units (targets such as
//! `network-online.target`) in its `/usr/lib/systemd/system`, and the agent's own binaries
//! (`/opt/flexnode/...`, not installed here) as empty executable stubs; system binaries the
//! units run (`/usr/bin/ctr`) are this host's, copied in. Nothing else is stubbed: a missing
//! system binary, an unknown key or a bad value is a finding. `verify` accepts references
//! to units that do not exist, so references to `flexnode-*` units are checked here: each must
//! name a unit of the same mode.

use crate::support::sandbox;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the agent installs itself; the only executables stubbed.
const AGENT_PREFIX: &str = "/opt/flexnode/";

fn systemd_analyze() -> PathBuf {
    let found = || {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join("systemd-analyze"))
                .find(|p| p.is_file())
        })
    };
    if let Some(p) = found() {
        return p;
    }
    // Debian ships it in the `systemd` package (installing it does not start anything).
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q", "systemd"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "systemd-analyze missing and `apt-get install systemd` failed"
    );
    found().expect("systemd-analyze after installing systemd")
}

fn systemd_version(analyze: &Path) -> u32 {
    let out = Command::new(analyze)
        .arg("--version")
        .output()
        .expect("systemd-analyze --version");
    let text = String::from_utf8_lossy(&out.stdout);
    // "systemd 252 (252.39-1~deb12u2)"
    text.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("cannot parse systemd version from {text:?}"))
}

fn copy_dir(from: &Path, to: &Path) {
    let ok = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp")
        .success();
    assert!(ok, "cp -a {} {}", from.display(), to.display());
}

/// Absolute executables named by `Exec*=` lines (after the `-@:+!` prefixes).
fn executables(unit: &str) -> Vec<String> {
    unit.lines()
        .filter_map(|l| {
            let (key, value) = l.split_once('=')?;
            key.trim().starts_with("Exec").then_some(value)
        })
        .filter_map(|v| {
            let cmd = v.trim().trim_start_matches(['-', '@', ':', '+', '!']);
            cmd.split_whitespace().next().map(str::to_string)
        })
        .filter(|c| c.starts_with('/'))
        .collect()
}

/// Units named by dependency and ordering keys.
fn references(unit: &str) -> Vec<String> {
    const KEYS: &[&str] = &[
        "Wants",
        "Requires",
        "Requisite",
        "BindsTo",
        "PartOf",
        "Upholds",
        "Conflicts",
        "Before",
        "After",
        "OnFailure",
        "OnSuccess",
        "PropagatesReloadTo",
        "ReloadPropagatedFrom",
        "WantedBy",
        "RequiredBy",
        "Also",
    ];
    unit.lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| KEYS.contains(&k.trim()))
        .flat_map(|(_, v)| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

/// Findings of `systemd-analyze verify` for the unit files in `dir` (empty: clean).
fn verify(analyze: &Path, dir: &Path) -> Vec<String> {
    let root = tempfile::tempdir().expect("tempdir");
    let r = root.path();
    let etc = r.join("etc/systemd/system");
    std::fs::create_dir_all(&etc).expect("mkdir etc");
    std::fs::create_dir_all(r.join("usr/lib/systemd")).expect("mkdir usr/lib");
    copy_dir(
        Path::new("/usr/lib/systemd/system"),
        &r.join("usr/lib/systemd"),
    );
    std::os::unix::fs::symlink("usr/lib", r.join("lib")).expect("lib link");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read units dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .to_string();
        let text = std::fs::read_to_string(&path).expect("read unit");
        std::fs::write(etc.join(&name), &text).expect("copy unit");
        for exe in executables(&text) {
            if let Some(rel) = exe.strip_prefix('/')
                && exe.starts_with(AGENT_PREFIX)
            {
                let stub = r.join(rel);
                std::fs::create_dir_all(stub.parent().expect("parent")).expect("mkdir stub");
                std::fs::write(&stub, "#!/bin/sh\nexit 0\n").expect("stub");
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755))
                    .expect("chmod stub");
            } else if let Some(rel) = exe.strip_prefix('/')
                && Path::new(&exe).is_file()
            {
                // A system binary (the container install's `ctr`): this host's own copy, so
                // one that is missing here stays a finding.
                let copy = r.join(rel);
                std::fs::create_dir_all(copy.parent().expect("parent")).expect("mkdir");
                if !copy.exists() {
                    std::fs::copy(&exe, &copy).expect("copy system binary");
                }
            }
        }
        names.push(name);
    }
    names.sort();
    let mut findings = Vec::new();
    for name in &names {
        let text = std::fs::read_to_string(etc.join(name)).expect("read unit");
        for referenced in references(&text) {
            if referenced.starts_with("flexnode-") && !names.contains(&referenced) {
                findings.push(format!(
                    "{name}: references {referenced}, which is not a unit of this mode"
                ));
            }
        }
    }
    assert!(!names.is_empty(), "no units in {}", dir.display());
    let out = Command::new(analyze)
        .arg("verify")
        .arg(format!("--root={}", r.display()))
        .arg("--man=no")
        .args(names.iter().map(|n| etc.join(n)))
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("systemd-analyze verify");
    let root_str = r.display().to_string();
    findings.extend(
        String::from_utf8_lossy(&out.stderr)
            .lines()
            .chain(String::from_utf8_lossy(&out.stdout).lines())
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.replace(&root_str, "")),
    );
    findings.dedup();
    if !out.status.success() && findings.is_empty() {
        findings.push(format!("systemd-analyze verify exited with {}", out.status));
    }
    findings
}

fn check_mode(mode: &str) {
    let analyze = systemd_analyze();
    let version = systemd_version(&analyze);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("units")
        .join(mode);
    let all = verify(&analyze, &dir);
    for f in &all {
        eprintln!("units/{mode} (systemd {version}): {f}");
    }
    // No tolerance: not even a key newer systemd knows (the bootstrap back-off is the
    // agent's, `join --backoff`, so no unit needs one).
    assert!(
        all.is_empty(),
        "systemd-analyze verify (systemd {version}) on units/{mode}:\n{}",
        all.join("\n")
    );
}

#[test]
fn host_units_verify() {
    check_mode("host");
}

#[test]
fn container_units_verify() {
    check_mode("container");
}

/// The harness reports real errors: a broken unit is not waved through.
#[test]
fn verify_reports_broken_units() {
    let analyze = systemd_analyze();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("broken.service"),
        "[Unit]\nDescription=broken\nOnFailure=flexnode-does-not-exist.service\n\n[Service]\n\
         Type=notfy\nExecStart=/opt/flexnode/bin/flexnode run\nExecStartPost=/usr/bin/no-such-tool\n\
         RestartSteps=3\n",
    )
    .expect("write");
    let text = verify(&analyze, dir.path()).join("\n");
    assert!(text.contains("notfy"), "bad Type= not reported:\n{text}");
    assert!(
        text.contains("does-not-exist.service"),
        "dangling OnFailure= not reported:\n{text}"
    );
    assert!(
        text.contains("/usr/bin/no-such-tool"),
        "missing system binary not reported:\n{text}"
    );
    assert!(
        text.contains("Unknown key 'RestartSteps'"),
        "a key this systemd does not know not reported:\n{text}"
    );
    assert!(
        !text.contains("/opt/flexnode/bin/flexnode"),
        "agent binary not stubbed:\n{text}"
    );
}

/// `systemd-analyze security --offline` of the unit file at `path`: its overall exposure.
fn exposure(analyze: &Path, path: &Path) -> f64 {
    let out = Command::new(analyze)
        .args(["security", "--offline=true", "--no-pager"])
        .arg(path)
        .env("SYSTEMD_LOG_COLOR", "0")
        .output()
        .expect("systemd-analyze security");
    sandbox::overall(&String::from_utf8_lossy(&out.stdout))
}

/// Every unit's sandbox (docs/reliability.md, "Security review"): no unit is more exposed than
/// recorded, and every unit file has a recorded exposure. The booted check is
/// `tests/node/host_security.rs` (the host units as systemd loaded them).
#[test]
fn no_unit_is_more_exposed_than_recorded() {
    let analyze = systemd_analyze();
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("units");
    let mut seen = Vec::new();
    for mode in ["host", "container"] {
        for entry in std::fs::read_dir(units.join(mode)).expect("read units dir") {
            let path = entry.expect("entry").path();
            let unit = path
                .file_name()
                .expect("name")
                .to_string_lossy()
                .to_string();
            let recorded = sandbox::recorded(mode, &unit);
            let now = exposure(&analyze, &path);
            eprintln!("units/{mode}/{unit}: exposure {now} (recorded {recorded})");
            assert!(
                now <= recorded,
                "units/{mode}/{unit} is more exposed ({now}) than recorded ({recorded}): \
                 see `systemd-analyze security --offline=true {}`",
                path.display()
            );
            seen.push((mode.to_string(), unit));
        }
    }
    assert_eq!(seen.len(), sandbox::EXPOSURE.len(), "{seen:?}");
}

/// The measurement has teeth: a unit without a sandbox is far above every sandboxed unit's
/// recorded exposure.
#[test]
fn an_unsandboxed_unit_is_measured_as_exposed() {
    let analyze = systemd_analyze();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bare.service");
    std::fs::write(&path, "[Service]\nExecStart=/bin/true\n").expect("write");
    let bare = exposure(&analyze, &path);
    let worst = sandbox::EXPOSURE
        .iter()
        .map(|(_, _, e)| *e)
        .fold(0.0, f64::max);
    assert!(bare > 9.0 && bare > worst, "bare unit: {bare}");
}

/// Every unit keeps exactly its install mode's capabilities (`tests/support/sandbox.rs`): on
/// the container install that bound is also the agent's container's (ctr's `--privileged`),
/// which the container suite checks in the guest.
#[test]
fn every_unit_keeps_exactly_its_modes_capabilities() {
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("units");
    for mode in ["host", "container"] {
        let want: BTreeSet<&str> = sandbox::capabilities(mode)
            .iter()
            .map(|(n, _)| *n)
            .collect();
        for entry in std::fs::read_dir(units.join(mode)).expect("read units dir") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path)
                .expect("read unit")
                .replace("\\\n", " ");
            let bound: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("CapabilityBoundingSet="))
                .collect();
            assert_eq!(bound.len(), 1, "{}: {bound:?}", path.display());
            let have: BTreeSet<&str> = bound[0].split_whitespace().collect();
            assert_eq!(have, want, "{}", path.display());
        }
    }
}
