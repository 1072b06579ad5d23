//! `flexnode preflight --config FILE`: every check `join` makes before it changes anything,
//! each with its fix, as kubeadm's preflight has them; `join` runs the same ones. A failed
//! check stops a join unless named in `--ignore-preflight-errors` (`all`: every one); a
//! warning never does.

use super::{Failure, Output, impossible, json, wiring, yaml};
use crate::config::kubeconfig::client_from_kubeconfig;
use crate::config::{Config, TokenJoin};
use crate::effects::host::kernel::KERNEL_MODULES;
use crate::identity::credential::{read_token, token_client};
use crate::lifecycle::agent::InstallMode;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;

/// Every check's name, in the order they run (what `--ignore-preflight-errors` takes).
pub const CHECKS: [&str; 12] = [
    "Root",
    "Systemd",
    "SystemdNspawn",
    "Containerd",
    "CgroupV2",
    "KernelModules",
    "Swap",
    "DiskSpace",
    "KubeletPort",
    "ApiServer",
    "Credential",
    "ClockSkew",
];

/// The kubelet's port in the machines, which share the host's network.
const KUBELET_PORT: u16 = 10250;
/// Below this the machines' trees do not fit (a node image unpacks to about 700 MiB); below
/// `WARN_FREE`, two of them and the pods' images are tight.
const MIN_FREE: u64 = 1 << 30;
const WARN_FREE: u64 = 4 << 30;
/// A clock further off than this has certificates refused as not yet or no longer valid (a
/// signer backdates what it issues by 5 minutes); one off by more than `WARN_SKEW_SECS`
/// is worth a warning.
const MAX_SKEW_SECS: i64 = 300;
const WARN_SKEW_SECS: i64 = 30;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Warn,
    Fail,
    /// Failed, but named in `--ignore-preflight-errors`.
    Ignored,
    /// Not tried: what it needs failed before it.
    Skipped,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub message: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

fn check(name: &'static str, status: Status, message: impl Into<String>, fix: &str) -> Check {
    Check {
        name,
        status,
        message: message.into(),
        fix: if status == Status::Pass {
            String::new()
        } else {
            fix.to_string()
        },
    }
}

fn pass_or(ok: bool, fail: Status) -> Status {
    if ok { Status::Pass } else { fail }
}

/// A check of one condition: `ok` passes with `yes`, otherwise `fail` with `no`.
fn either(name: &'static str, ok: bool, fail: Status, (yes, no): (&str, &str), fix: &str) -> Check {
    check(name, pass_or(ok, fail), if ok { yes } else { no }, fix)
}

/// The names `--ignore-preflight-errors` takes: known check names, or `all`.
pub fn ignored(list: &[String]) -> Result<Vec<&'static str>, Failure> {
    let mut out = Vec::new();
    for name in list
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        if name.eq_ignore_ascii_case("all") {
            return Ok(CHECKS.to_vec());
        }
        match CHECKS.iter().find(|c| c.eq_ignore_ascii_case(name)) {
            Some(c) => out.push(*c),
            None => {
                return Err(Failure::config(format!(
                    "--ignore-preflight-errors: {name:?} is no check (the checks: {}, or all)",
                    CHECKS.join(", ")
                )));
            }
        }
    }
    Ok(out)
}

/// The host's side: what a join needs of this machine.
fn host_checks(config: &Config, joined: bool) -> Vec<Check> {
    let mut out = Vec::new();
    out.push(either(
        "Root",
        crate::config::process_uid() == Some(0),
        Status::Fail,
        ("running as root", "not running as root"),
        "run it as root",
    ));
    out.push(either(
        "Systemd",
        wiring::on_host("/run/systemd/system").exists(),
        Status::Fail,
        (
            "systemd is the init system",
            "systemd is not the init system (/run/systemd/system is missing)",
        ),
        "boot the host with systemd: it runs the agent and the machines",
    ));
    out.push(either(
        "SystemdNspawn",
        wiring::on_host("/usr/bin/systemd-nspawn").exists(),
        Status::Fail,
        (
            "systemd-nspawn is installed",
            "/usr/bin/systemd-nspawn is missing: it runs the node's machines",
        ),
        "install systemd-container (Debian, Ubuntu) or systemd-container (Fedora)",
    ));
    let needs_containerd = config.install_mode == InstallMode::Container || config.node.is_some();
    let containerd = wiring::on_host(wiring::CONTAINERD_SOCKET).exists();
    out.push(check(
        "Containerd",
        match (needs_containerd, containerd) {
            (false, _) | (true, true) => Status::Pass,
            (true, false) => Status::Fail,
        },
        match (needs_containerd, containerd) {
            (false, _) => "not needed (host install without nodeImages)".to_string(),
            (true, true) => format!("{} answers", wiring::CONTAINERD_SOCKET),
            (true, false) => format!(
                "{} is missing: containerd runs the agent's containers (container install) \
                 and pulls the node images",
                wiring::CONTAINERD_SOCKET
            ),
        },
        "install and start containerd 1.7 or later",
    ));
    out.push(either(
        "CgroupV2",
        Path::new("/sys/fs/cgroup/cgroup.controllers").exists(),
        Status::Warn,
        (
            "cgroup v2 (unified)",
            "cgroup v1: the kubelet runs, but Kubernetes keeps v1 in maintenance only",
        ),
        "boot with systemd.unified_cgroup_hierarchy=1 (the default of current distributions)",
    ));
    let missing: Vec<&str> = KERNEL_MODULES
        .iter()
        .filter(|(name, probe)| !probe.present().unwrap_or(false) && !loadable(name))
        .map(|(name, _)| *name)
        .collect();
    out.push(check(
        "KernelModules",
        pass_or(missing.is_empty(), Status::Fail),
        if missing.is_empty() {
            "overlay and br_netfilter are in the kernel or can be loaded".to_string()
        } else {
            format!("neither in the kernel nor loadable: {}", missing.join(", "))
        },
        "install the kernel's modules package (linux-modules-extra on Ubuntu)",
    ));
    let swaps = std::fs::read_to_string("/proc/swaps")
        .map(|t| t.lines().skip(1).filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);
    out.push(check(
        "Swap",
        pass_or(swaps == 0, Status::Warn),
        if swaps == 0 {
            "no swap is on".to_string()
        } else {
            format!("{swaps} swap area(s) on: join turns swap off for good (docs/config.md)")
        },
        "nothing to do: join turns it off and masks its units",
    ));
    let machines = wiring::on_host("/var/lib");
    let free = rustix::fs::statvfs(&machines)
        .map(|st| st.f_bavail.saturating_mul(st.f_frsize))
        .unwrap_or(u64::MAX);
    out.push(check(
        "DiskSpace",
        match free {
            f if f >= WARN_FREE => Status::Pass,
            f if f >= MIN_FREE => Status::Warn,
            _ => Status::Fail,
        },
        format!(
            "{} MiB free under {} (the machines need at least {} MiB; {} GiB is comfortable)",
            free >> 20,
            machines.display(),
            MIN_FREE >> 20,
            WARN_FREE >> 30
        ),
        "free space on the filesystem of /var/lib",
    ));
    out.push(kubelet_port(config, joined));
    out
}

/// A module file the running kernel's `modprobe` would find.
fn loadable(name: &str) -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let dir = wiring::on_host("/lib/modules").join(release.trim());
    let wanted = format!("/{name}.ko");
    ["modules.dep", "modules.builtin"].iter().any(|f| {
        std::fs::read_to_string(dir.join(f)).is_ok_and(|t| {
            t.lines()
                .any(|l| l.split(':').next().is_some_and(|m| m.contains(&wanted)))
        })
    })
}

fn kubelet_port(config: &Config, joined: bool) -> Check {
    let fix = "stop what listens on port 10250 (another kubelet?)";
    if config.node.is_none() {
        return check(
            "KubeletPort",
            Status::Pass,
            "not needed (no nodeImages)",
            fix,
        );
    }
    if joined {
        return check(
            "KubeletPort",
            Status::Pass,
            "the node is joined: its own kubelet holds the port",
            fix,
        );
    }
    match std::net::TcpListener::bind(("0.0.0.0", KUBELET_PORT)) {
        Ok(_) => check("KubeletPort", Status::Pass, "port 10250 is free", fix),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => check(
            "KubeletPort",
            Status::Fail,
            "port 10250 is in use: the machine's kubelet could not listen",
            fix,
        ),
        Err(e) => check(
            "KubeletPort",
            Status::Warn,
            format!("port 10250 could not be tried: {e}"),
            fix,
        ),
    }
}

/// The cluster's side: the API server reached and verified, the credential accepted, the
/// clocks agreeing.
async fn api_checks(config: &Config) -> Vec<Check> {
    let reached = match api_client(config).await {
        Ok(client) => version_and_date(&client)
            .await
            .map(|answer| (client, answer)),
        Err(e) => Err(e),
    };
    let (client, (version, skew)) = match reached {
        Ok(reached) => reached,
        Err(why) => {
            let skipped = |name| check(name, Status::Skipped, "the API server was not reached", "");
            return vec![
                check(
                    "ApiServer",
                    Status::Fail,
                    format!("the API server was not reached: {why}"),
                    "check the server's URL, the network to it, and that the CA named is the \
                     cluster's",
                ),
                skipped("Credential"),
                skipped("ClockSkew"),
            ];
        }
    };
    vec![
        check(
            "ApiServer",
            pass_or(
                version.is_success() || version.as_u16() == 401,
                Status::Fail,
            ),
            format!("the API server answered /version ({version}), its certificate verified"),
            "check the server's URL and CA",
        ),
        credential_check(client).await,
        skew_check(skew),
    ]
}

/// A client with the credential `join` would use: the kubeconfig's, or the bootstrap token's.
async fn api_client(config: &Config) -> Result<kube::Client, String> {
    let Some(TokenJoin { server, ca_file }) = &config.token_join else {
        return client_from_kubeconfig(&config.kubeconfig)
            .await
            .map_err(|e| e.to_string());
    };
    let ca = std::fs::read(ca_file).map_err(|e| format!("{}: {e}", ca_file.display()))?;
    let token_file = config
        .bootstrap_token_file
        .as_deref()
        .ok_or("no bootstrapTokenFile")?;
    let token = read_token(token_file).map_err(|e| format!("{}: {e}", token_file.display()))?;
    token_client(server, &ca, token)
        .await
        .map_err(|e| e.to_string())
}

/// `GET /version`: its status, and how far this clock is from the API server's `Date`.
async fn version_and_date(
    client: &kube::Client,
) -> Result<(hyper::StatusCode, Option<i64>), String> {
    let request = hyper::Request::get("/version")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let asked = crate::identity::unix_now();
    let response = client
        .send(request.map(Into::into))
        .await
        .map_err(|e| crate::text::one_line(&e.to_string()))?;
    let date = response
        .headers()
        .get(hyper::header::DATE)
        .and_then(|d| d.to_str().ok())
        .and_then(httpdate);
    Ok((response.status(), date.map(|d| asked - d)))
}

async fn credential_check(client: kube::Client) -> Check {
    let review: Api<SelfSubjectReview> = Api::all(client);
    match review
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
    {
        Ok(r) => {
            let user = r
                .status
                .and_then(|s| s.user_info)
                .and_then(|u| u.username)
                .unwrap_or_default();
            check(
                "Credential",
                Status::Pass,
                format!("the API server knows the credential as {user}"),
                "",
            )
        }
        Err(e) => check(
            "Credential",
            Status::Fail,
            format!(
                "the credential was refused: {}",
                crate::text::one_line(&crate::config::kubeconfig::api_message(&e))
            ),
            "a kubeconfig for system:flexnode:<nodeName> in flexnode:agents (a certificate, or \
             an exec plugin the API server maps to it), or a bootstrap token that is valid and \
             bound to this node (docs/config.md)",
        ),
    }
}

fn skew_check(skew: Option<i64>) -> Check {
    let Some(s) = skew else {
        return check(
            "ClockSkew",
            Status::Warn,
            "the API server sent no Date to compare with",
            "",
        );
    };
    check(
        "ClockSkew",
        match s.abs() {
            a if a <= WARN_SKEW_SECS => Status::Pass,
            a if a <= MAX_SKEW_SECS => Status::Warn,
            _ => Status::Fail,
        },
        format!("this clock is {s:+} s from the API server's"),
        "synchronize the clock (chrony, systemd-timesyncd): certificates are refused as not yet \
         or no longer valid",
    )
}

/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`) as Unix seconds.
fn httpdate(text: &str) -> Option<i64> {
    let t: k8s_openapi::jiff::Timestamp = k8s_openapi::jiff::fmt::rfc2822::parse(text)
        .ok()?
        .timestamp();
    Some(t.as_second())
}

/// Every check, the failures named in `ignore` made `Ignored`.
pub async fn run_checks(config: &Config, joined: bool, ignore: &[&str]) -> Vec<Check> {
    let mut all = host_checks(config, joined);
    all.extend(api_checks(config).await);
    for c in &mut all {
        if c.status == Status::Fail && ignore.contains(&c.name) {
            c.status = Status::Ignored;
        }
    }
    all
}

/// What `join` says and stops on: the checks that failed.
pub fn failures(checks: &[Check]) -> Option<String> {
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| format!("preflight: {}: {}; {}", c.name, c.message, c.fix))
        .collect();
    (!failed.is_empty()).then(|| {
        format!(
            "{}\n(`flexnode preflight --config FILE` lists every check; \
             --ignore-preflight-errors=NAME,… passes one)",
            failed.join("\n")
        )
    })
}

/// The API server refused the credential (a `join` then exits 78: no retry mends it).
pub fn credential_refused(checks: &[Check]) -> bool {
    checks
        .iter()
        .any(|c| c.name == "Credential" && c.status == Status::Fail)
}

fn human(checks: &[Check]) -> String {
    let mut out = String::new();
    for c in checks {
        let tag = match c.status {
            Status::Pass => "ok",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
            Status::Ignored => "ignored",
            Status::Skipped => "skipped",
        };
        out.push_str(&format!("[{tag:>7}] {:<14} {}\n", c.name, c.message));
        if !c.fix.is_empty() {
            out.push_str(&format!("{:>25}fix: {}\n", "", c.fix));
        }
    }
    out
}

pub fn run(state: &Path, config: &Path, output: Output, ignore: &[String]) -> ExitCode {
    super::block_on("preflight", async move {
        let config = Config::load(config, &wiring::hostname()).map_err(impossible)?;
        let ignore = ignored(ignore)?;
        let joined = wiring::current_state(state)
            .ok()
            .flatten()
            .is_some_and(|s| s.node().is_some());
        let checks = run_checks(&config, joined, &ignore).await;
        print!(
            "{}",
            match output {
                Output::Human => human(&checks),
                Output::Json => json(&checks),
                Output::Yaml => yaml(&checks),
            }
        );
        Ok(if checks.iter().any(|c| c.status == Status::Fail) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        })
    })
}
