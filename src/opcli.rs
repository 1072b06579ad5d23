//! `flexnode op`: create and inspect MachineOperations, for operators and controllers.
//!
//! Upgrade parameters go through the agent's own [`validate_upgrade`] before anything is
//! created, and a download URL is never printed whole: it may carry a SAS token in its query or
//! credentials in its userinfo.

use crate::api::MachineOperation;
use crate::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use crate::cli::{EXIT_CONFIG, Output};
use crate::machine::state::InstallMode;
use crate::machine::validate::{Arch, PARAM_SHA256, PARAM_URL, UpgradeTarget, validate_upgrade};
use clap::{Args, Subcommand, ValueEnum};
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, ListSemantic};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Exit status when `--wait` gives up before the operation finished.
pub const EXIT_TIMEOUT: u8 = 3;

const FIELD_MANAGER: &str = "flexnode-op";
const REDACTED: &str = "<redacted>";

#[derive(Debug, Args)]
pub struct OpArgs {
    /// Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config].
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    #[command(subcommand)]
    pub command: OpCommand,
}

#[derive(Debug, Subcommand)]
pub enum OpCommand {
    /// Create a MachineOperation.
    Create(Box<CreateArgs>),
    /// List MachineOperations.
    List {
        /// Only operations addressed to this node by name.
        #[arg(long, value_name = "NAME")]
        node: Option<String>,
    },
    /// Show one MachineOperation.
    Get {
        name: String,
        #[arg(long, short, value_enum, default_value_t = Output::Human)]
        output: Output,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CreateKind {
    Reboot,
    Upgrade,
    Reset,
}

impl CreateKind {
    fn operation(self) -> OperationKind {
        match self {
            Self::Reboot => OperationKind::NodeReboot,
            Self::Upgrade => OperationKind::AgentUpgrade,
            Self::Reset => OperationKind::AgentReset,
        }
    }
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// NodeReboot, AgentUpgrade or AgentReset.
    #[arg(value_enum)]
    pub kind: CreateKind,
    /// Target node by name.
    #[arg(long, value_name = "NAME")]
    pub node: Option<String>,
    /// Target nodes by labels: k=v[,k2=v2].
    #[arg(long, value_name = "LABELS")]
    pub selector: Option<String>,
    /// Upgrade (container install) to this image: oci://REGISTRY/REPO[:TAG].
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// The image's digest: sha256:HEX.
    #[arg(long, value_name = "DIGEST")]
    pub digest: Option<String>,
    /// Upgrade (host install) from this archive URL.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The archive's SHA-256 (hex).
    #[arg(long, value_name = "HEX")]
    pub sha256: Option<String>,
    /// Delete the object this long after it finished (1h, 30m, 90s, 3600).
    #[arg(long, value_name = "DURATION")]
    pub ttl: Option<String>,
    /// Object name [default: <kind>-<node|sel>-<unix seconds>].
    #[arg(long)]
    pub name: Option<String>,
    /// Follow the operation until it completes or fails.
    #[arg(long)]
    pub wait: bool,
    /// Give up waiting after this long (exit 3) [default: 10m].
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
}

/// A failure: what to print and the exit status.
#[derive(Debug)]
struct Fail {
    code: u8,
    msg: String,
}

impl Fail {
    fn usage(msg: impl Into<String>) -> Self {
        Self {
            code: EXIT_CONFIG,
            msg: msg.into(),
        }
    }

    fn failed(msg: impl Into<String>) -> Self {
        Self {
            code: 1,
            msg: msg.into(),
        }
    }

    fn api(e: &kube::Error) -> Self {
        Self::failed(api_message(e))
    }
}

pub fn run(args: OpArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("flexnode op: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(dispatch(args)) {
        Ok(code) => code,
        Err(f) => {
            // One line: parser errors go on to quote their input (a kubeconfig holds secrets).
            eprintln!("flexnode op: {}", f.msg.lines().next().unwrap_or_default());
            ExitCode::from(f.code)
        }
    }
}

async fn dispatch(args: OpArgs) -> Result<ExitCode, Fail> {
    let kubeconfig = args.kubeconfig;
    match args.command {
        OpCommand::Create(create_args) => {
            // Everything the user typed is checked before the cluster is contacted.
            let plan = plan(&create_args, unix_now())?;
            let api = ops(kubeconfig).await?;
            create(api, plan).await
        }
        OpCommand::List { node } => {
            let api = ops(kubeconfig).await?;
            list(api, node.as_deref()).await
        }
        OpCommand::Get { name, output } => {
            let api = ops(kubeconfig).await?;
            get(api, &name, output).await
        }
    }
}

/// The resolved kubeconfig path: `--kubeconfig`, else the first `$KUBECONFIG` entry, else
/// `~/.kube/config`.
fn kubeconfig_path(flag: Option<PathBuf>) -> Result<PathBuf, Fail> {
    if let Some(p) = flag {
        return Ok(p);
    }
    if let Some(v) = std::env::var_os("KUBECONFIG")
        && let Some(first) = std::env::split_paths(&v).find(|p| !p.as_os_str().is_empty())
    {
        return Ok(first);
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".kube/config")),
        None => Err(Fail::usage(
            "no kubeconfig: pass --kubeconfig or set KUBECONFIG",
        )),
    }
}

async fn ops(flag: Option<PathBuf>) -> Result<Api<MachineOperation>, Fail> {
    let path = kubeconfig_path(flag)?;
    if !path.is_file() {
        return Err(Fail::usage(format!(
            "kubeconfig {} not found (pass --kubeconfig or set KUBECONFIG)",
            path.display()
        )));
    }
    match crate::reconcile::client_from_kubeconfig(&path).await {
        Ok(client) => Ok(Api::all(client)),
        Err(kube::Error::InferKubeconfig(e)) => {
            Err(Fail::usage(format!("kubeconfig {}: {e}", path.display())))
        }
        Err(e) => Err(Fail::usage(format!(
            "kubeconfig {}: {}",
            path.display(),
            api_message(&e)
        ))),
    }
}

/// A one-line description of a client error.
fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let msg = if s.message.is_empty() {
                format!("the API server answered {}", s.code)
            } else {
                s.message.clone()
            };
            if s.reason.is_empty() {
                msg
            } else {
                format!("{msg} ({})", s.reason)
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            // The top-level text ("client error (Connect)") says little; the causes say why.
            let mut msg = format!("cannot reach the API server: {e}");
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !msg.contains(&text) {
                    msg.push_str(": ");
                    msg.push_str(&text);
                }
                source = cause.source();
            }
            msg
        }
        other => other.to_string(),
    }
}

// ---- create ------------------------------------------------------------------------------

/// What `op create` will post, fully checked.
#[derive(Debug)]
struct Plan {
    name: String,
    spec: MachineOperationSpec,
    wait: Option<Duration>,
    /// The raw download URL, scrubbed from any error message the API server sends back.
    secret: Option<String>,
}

fn plan(a: &CreateArgs, now_secs: u64) -> Result<Plan, Fail> {
    let node = a.node.as_deref().map(str::trim);
    let (machine_ref, machine_selector) = match (node, a.selector.as_deref()) {
        (Some(_), Some(_)) => {
            return Err(Fail::usage("pass either --node or --selector, not both"));
        }
        (None, None) => return Err(Fail::usage("pass --node NAME or --selector k=v[,k2=v2]")),
        (Some(""), None) => return Err(Fail::usage("--node needs a node name")),
        (Some(n), None) => (Some(n.to_string()), None),
        (None, Some(s)) => (None, Some(parse_selector(s)?)),
    };
    let kind = a.kind.operation();
    let upgrade_flags =
        a.image.is_some() || a.digest.is_some() || a.url.is_some() || a.sha256.is_some();
    let (parameters, secret) = match a.kind {
        CreateKind::Upgrade => {
            let (params, secret) = upgrade_parameters(a)?;
            (Some(params), secret)
        }
        CreateKind::Reboot | CreateKind::Reset if upgrade_flags => {
            return Err(Fail::usage(
                "--image, --digest, --url and --sha256 apply to upgrade only",
            ));
        }
        CreateKind::Reboot | CreateKind::Reset => (None, None),
    };
    let ttl_seconds_after_finished = match a.ttl.as_deref() {
        None => None,
        Some(raw) => {
            let d = parse_duration(raw).ok_or_else(|| {
                Fail::usage("--ttl takes a duration such as 1h, 30m, 90s or 3600")
            })?;
            Some(i32::try_from(d.as_secs()).map_err(|_| Fail::usage("--ttl is too long"))?)
        }
    };
    let wait =
        match (a.wait, a.timeout.as_deref()) {
            (false, Some(_)) => return Err(Fail::usage("--timeout applies to --wait only")),
            (false, None) => None,
            (true, None) => Some(Duration::from_secs(600)),
            (true, Some(raw)) => Some(parse_duration(raw).filter(|d| !d.is_zero()).ok_or_else(
                || Fail::usage("--timeout takes a duration such as 10m, 90s or 600"),
            )?),
        };
    let name = match a.name.as_deref().map(str::trim) {
        Some("") => return Err(Fail::usage("--name needs a name")),
        Some(n) => n.to_string(),
        None => format!(
            "{}-{}-{now_secs}",
            kind.as_str().to_ascii_lowercase(),
            machine_ref.as_deref().unwrap_or("sel")
        ),
    };
    Ok(Plan {
        name,
        spec: MachineOperationSpec {
            machine_ref,
            machine_selector,
            operation_kind: kind,
            parameters,
            ttl_seconds_after_finished,
        },
        wait,
        secret,
    })
}

/// `downloadURL` and `sha256`, checked by the agent's own validator. Rejections print the
/// validator's fixed message only.
fn upgrade_parameters(a: &CreateArgs) -> Result<(BTreeMap<String, String>, Option<String>), Fail> {
    let (mode, url, digest) = match (&a.image, &a.url) {
        (Some(_), Some(_)) => return Err(Fail::usage("pass either --image or --url, not both")),
        (None, None) => {
            return Err(Fail::usage(
                "upgrade needs --image oci://REPO[:TAG] --digest sha256:HEX, or --url URL --sha256 HEX",
            ));
        }
        (Some(image), None) => {
            if a.sha256.is_some() {
                return Err(Fail::usage("--image takes --digest, not --sha256"));
            }
            (InstallMode::Container, image, a.digest.as_deref())
        }
        (None, Some(url)) => {
            if a.digest.is_some() {
                return Err(Fail::usage("--url takes --sha256, not --digest"));
            }
            (InstallMode::Host, url, a.sha256.as_deref())
        }
    };
    let url = url.trim();
    let mut params = BTreeMap::from([(PARAM_URL.to_string(), url.to_string())]);
    if let Some(d) = digest {
        params.insert(PARAM_SHA256.to_string(), d.to_string());
    }
    let target =
        validate_upgrade(mode, Arch::Amd64, &params).map_err(|e| Fail::usage(e.message()))?;
    // Store the digest as the agent compares it: lowercase hex, no `sha256:` prefix.
    let hex = match &target {
        UpgradeTarget::Archive { sha256, .. } => sha256.as_str(),
        UpgradeTarget::Image { digest, .. } => digest.as_str(),
    };
    params.insert(PARAM_SHA256.to_string(), hex.to_string());
    Ok((params, Some(url.to_string())))
}

fn parse_selector(raw: &str) -> Result<LabelSelector, Fail> {
    let bad = || Fail::usage("--selector takes k=v[,k2=v2]");
    let mut labels = BTreeMap::new();
    for pair in raw.split(',') {
        let (k, v) = pair.split_once('=').ok_or_else(bad)?;
        let (k, v) = (k.trim(), v.trim());
        if k.is_empty() || v.contains('=') || labels.insert(k.to_string(), v.to_string()).is_some()
        {
            return Err(bad());
        }
    }
    Ok(LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    })
}

/// `1h`, `30m`, `90s`, `3600` (seconds), or combinations such as `1h30m`.
fn parse_duration(raw: &str) -> Option<Duration> {
    let raw = raw.trim();
    if raw.is_empty() {
        return None;
    }
    if raw.bytes().all(|b| b.is_ascii_digit()) {
        return raw.parse().ok().map(Duration::from_secs);
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    for c in raw.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86_400,
            _ => return None,
        };
        let n: u64 = digits.parse().ok()?;
        total = total.checked_add(n.checked_mul(unit)?)?;
        digits.clear();
    }
    digits.is_empty().then_some(Duration::from_secs(total))
}

async fn create(api: Api<MachineOperation>, plan: Plan) -> Result<ExitCode, Fail> {
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let created = api
        .create(&pp, &MachineOperation::new(&plan.name, plan.spec.clone()))
        .await
        .map_err(|e| {
            let mut msg = api_message(&e);
            if let Some(secret) = plan.secret.as_deref().filter(|s| !s.is_empty()) {
                msg = msg.replace(secret, "<downloadURL>");
            }
            Fail::failed(format!(
                "cannot create machineoperation/{}: {msg}",
                plan.name
            ))
        })?;
    println!("machineoperation/{} created", plan.name);
    match plan.wait {
        None => Ok(ExitCode::SUCCESS),
        Some(timeout) => follow(api, &plan.name, created.metadata.uid, timeout).await,
    }
}

/// Prints each phase change until the operation is terminal: 0 Complete, 1 Failed, 3 timeout.
async fn follow(
    api: Api<MachineOperation>,
    name: &str,
    uid: Option<String>,
    timeout: Duration,
) -> Result<ExitCode, Fail> {
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .list_semantic(ListSemantic::MostRecent);
    let mut stream = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let deadline = tokio::time::Instant::now() + timeout;
    let gone = || {
        Fail::failed(format!(
            "machineoperation/{name} was deleted before it finished"
        ))
    };
    let mut last = String::new();
    let mut listed = false;
    let mut warned = false;
    loop {
        let event = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => {
                let still = if last.is_empty() { "Pending" } else { &last };
                eprintln!(
                    "flexnode op: timed out after {}s waiting for machineoperation/{name} (last: {still})",
                    timeout.as_secs()
                );
                return Ok(ExitCode::from(EXIT_TIMEOUT));
            }
            Ok(None) => return Err(Fail::failed("the watch ended unexpectedly")),
            Ok(Some(event)) => event,
        };
        match event {
            Ok(Event::Init) => listed = false,
            Ok(Event::InitDone) if !listed => return Err(gone()),
            Ok(Event::InitDone) => {}
            Ok(Event::Delete(_)) => return Err(gone()),
            Ok(Event::Apply(op) | Event::InitApply(op)) => {
                // Deleted and recreated under the same name while we were away.
                if uid.is_some() && op.metadata.uid != uid {
                    return Err(gone());
                }
                listed = true;
                let (line, exit) = progress(&op);
                if line != last {
                    println!("{line}");
                    last = line;
                }
                if let Some(code) = exit {
                    return Ok(ExitCode::from(code));
                }
            }
            Err(e) => {
                let inner = match &e {
                    watcher::Error::InitialListFailed(k)
                    | watcher::Error::WatchStartFailed(k)
                    | watcher::Error::WatchFailed(k) => Some(k),
                    watcher::Error::WatchError(_) | watcher::Error::NoResourceVersion => None,
                };
                if let Some(k @ kube::Error::Api(s)) = inner
                    && (s.is_forbidden() || s.code == 401)
                {
                    return Err(Fail::failed(format!(
                        "cannot watch machineoperation/{name}: {}",
                        api_message(k)
                    )));
                }
                if !warned {
                    let why = inner.map_or_else(|| e.to_string(), api_message);
                    eprintln!("flexnode op: watch interrupted, retrying: {why}");
                    warned = true;
                }
            }
        }
    }
}

/// The progress line for an operation, and the exit status once it is terminal.
fn progress(op: &MachineOperation) -> (String, Option<u8>) {
    let status = op.status.as_ref();
    let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
    match status.and_then(|s| s.phase) {
        None | Some(OperationPhase::Pending) => ("Pending".into(), None),
        Some(OperationPhase::InProgress) => (format!("InProgress: {message}"), None),
        Some(OperationPhase::Complete) => (format!("Complete: {message}"), Some(0)),
        Some(OperationPhase::Failed) => {
            let line = match reason(op) {
                Some(r) => format!("Failed ({r}): {message}"),
                None => format!("Failed: {message}"),
            };
            (line, Some(1))
        }
    }
}

/// The `Completed` condition's reason (Succeeded, ExecutionFailed, InvalidParameters, …).
fn reason(op: &MachineOperation) -> Option<&str> {
    op.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Completed")
        .map(|c| c.reason.as_str())
        .filter(|r| !r.is_empty())
}

// ---- list and get ------------------------------------------------------------------------

async fn list(api: Api<MachineOperation>, node: Option<&str>) -> Result<ExitCode, Fail> {
    let mut lp = ListParams::default();
    if let Some(node) = node {
        lp = lp.fields(&format!("spec.machineRef={node}"));
    }
    let items = api.list(&lp).await.map_err(|e| Fail::api(&e))?.items;
    if items.is_empty() {
        eprintln!("No resources found.");
        return Ok(ExitCode::SUCCESS);
    }
    let now = unix_now();
    let mut rows = vec![[
        "NAME".to_string(),
        "MACHINE".into(),
        "OPERATION".into(),
        "PHASE".into(),
        "AGE".into(),
    ]];
    rows.extend(items.iter().map(|op| {
        [
            op.metadata.name.clone().unwrap_or_default(),
            target(&op.spec),
            op.spec.operation_kind.as_str().to_string(),
            phase_name(op).to_string(),
            op.metadata
                .creation_timestamp
                .as_ref()
                .map_or_else(|| "<unknown>".into(), |t| age(now, t)),
        ]
    }));
    print!("{}", table(&rows));
    Ok(ExitCode::SUCCESS)
}

fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn phase_name(op: &MachineOperation) -> &'static str {
    match op.status.as_ref().and_then(|s| s.phase) {
        None | Some(OperationPhase::Pending) => "Pending",
        Some(OperationPhase::InProgress) => "InProgress",
        Some(OperationPhase::Complete) => "Complete",
        Some(OperationPhase::Failed) => "Failed",
    }
}

/// The machine name, or the selector as `selector:k=v,…`.
fn target(spec: &MachineOperationSpec) -> String {
    match (&spec.machine_ref, &spec.machine_selector) {
        (Some(m), _) => m.clone(),
        (None, Some(sel)) => format!("selector:{}", selector_string(sel)),
        (None, None) => "<none>".into(),
    }
}

fn selector_string(sel: &LabelSelector) -> String {
    let mut parts: Vec<String> = sel
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "Exists" => e.key.clone(),
            "DoesNotExist" => format!("!{}", e.key),
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            other => format!("{} {other} ({values})", e.key),
        });
    }
    if parts.is_empty() {
        "<everything>".into()
    } else {
        parts.join(",")
    }
}

/// kubectl's short age format.
fn age(now: u64, t: &Time) -> String {
    let s = u64::try_from(t.0.as_second()).map_or(0, |then| now.saturating_sub(then));
    let (m, h, d) = (s / 60, s / 3600, s / 86_400);
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        match s % 60 {
            0 => format!("{m}m"),
            r => format!("{m}m{r}s"),
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            r => format!("{h}h{r}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if d < 8 {
        match h % 24 {
            0 => format!("{d}d"),
            r => format!("{d}d{r}h"),
        }
    } else if d < 365 * 2 {
        format!("{d}d")
    } else {
        format!("{}y", d / 365)
    }
}

async fn get(api: Api<MachineOperation>, name: &str, output: Output) -> Result<ExitCode, Fail> {
    let op = match api.get_opt(name).await {
        Ok(Some(op)) => op,
        Ok(None) => {
            return Err(Fail::failed(format!(
                "machineoperation \"{name}\" not found"
            )));
        }
        Err(e) => return Err(Fail::api(&e)),
    };
    let text = match output {
        Output::Human => human(&op),
        Output::Json => {
            let v = redacted(&op)?;
            serde_json::to_string_pretty(&v)
                .map(|s| s + "\n")
                .map_err(|e| Fail::failed(format!("cannot render JSON: {e}")))?
        }
        Output::Yaml => {
            let v = redacted(&op)?;
            serde_saphyr::to_string(&v)
                .map_err(|e| Fail::failed(format!("cannot render YAML: {e}")))?
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn human(op: &MachineOperation) -> String {
    let status = op.status.as_ref();
    let none = || "<none>".to_string();
    let time = |t: Option<&Time>| t.map_or_else(none, |t| t.0.to_string());
    let (target_label, target_value) = match (&op.spec.machine_ref, &op.spec.machine_selector) {
        (None, Some(sel)) => ("Selector:", selector_string(sel)),
        _ => ("Machine:", target(&op.spec)),
    };
    let lines = [
        ("Name:", op.metadata.name.clone().unwrap_or_default()),
        (target_label, target_value),
        ("Operation:", op.spec.operation_kind.as_str().to_string()),
        ("Phase:", phase_name(op).to_string()),
        (
            "Message:",
            status
                .and_then(|s| s.message.clone())
                .filter(|m| !m.is_empty())
                .unwrap_or_else(none),
        ),
        ("Reason:", reason(op).map_or_else(none, str::to_string)),
        ("Started:", time(status.and_then(|s| s.started_at.as_ref()))),
        (
            "Completed:",
            time(status.and_then(|s| s.completed_at.as_ref())),
        ),
    ];
    lines.iter().map(|(k, v)| format!("{k:<12}{v}\n")).collect()
}

/// The object as JSON, without anything that may carry credentials: the download URL's query
/// (and userinfo), kubectl's last-applied copy of the spec, and managedFields (as kubectl hides).
fn redacted(op: &MachineOperation) -> Result<serde_json::Value, Fail> {
    let mut v = serde_json::to_value(op)
        .map_err(|e| Fail::failed(format!("cannot render the object: {e}")))?;
    if let Some(url) = v.pointer_mut("/spec/parameters/downloadURL")
        && let Some(s) = url.as_str()
    {
        *url = serde_json::Value::String(redact_url(s));
    }
    if let Some(meta) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
        if let Some(a) = meta
            .get_mut("annotations")
            .and_then(|a| a.as_object_mut())
            .and_then(|a| a.get_mut("kubectl.kubernetes.io/last-applied-configuration"))
        {
            *a = serde_json::Value::String(REDACTED.into());
        }
    }
    Ok(v)
}

/// Drops a URL's query (`?<redacted>`) and userinfo (`<redacted>@`).
fn redact_url(url: &str) -> String {
    let base = match url.split_once('?') {
        Some((base, _)) => format!("{base}?{REDACTED}"),
        None => url.to_string(),
    };
    let Some((scheme, rest)) = base.split_once("://") else {
        return base;
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{REDACTED}{}", &rest[at..]),
        None => base,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "abcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcd";

    fn args(kind: CreateKind) -> CreateArgs {
        CreateArgs {
            kind,
            node: Some("edge-07".into()),
            selector: None,
            image: None,
            digest: None,
            url: None,
            sha256: None,
            ttl: None,
            name: None,
            wait: false,
            timeout: None,
        }
    }

    fn code(a: &CreateArgs) -> u8 {
        plan(a, 1).map_or_else(|f| f.code, |_| 0)
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("30m"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_duration("90s"), Some(Duration::from_secs(90)));
        assert_eq!(parse_duration("3600"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_duration("1h30m"), Some(Duration::from_secs(5400)));
        for bad in ["", "h", "1x", "10m5", "-3", "1.5h"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn default_name_and_targets() {
        let p = plan(&args(CreateKind::Reboot), 1_700_000_000).expect("plan");
        assert_eq!(p.name, "nodereboot-edge-07-1700000000");
        let mut a = args(CreateKind::Reset);
        a.node = None;
        a.selector = Some("site=a, tier = edge".into());
        let p = plan(&a, 5).expect("plan");
        assert_eq!(p.name, "agentreset-sel-5");
        assert_eq!(
            p.spec.machine_selector.and_then(|s| s.match_labels),
            Some(BTreeMap::from([
                ("site".into(), "a".into()),
                ("tier".into(), "edge".into())
            ]))
        );
        for bad in ["", "a", "=b", "a=b,a=c", "a=b=c"] {
            a.selector = Some(bad.into());
            assert_eq!(code(&a), EXIT_CONFIG, "{bad}");
        }
    }

    #[test]
    fn upgrade_parameters_are_validated_and_normalized() {
        let mut a = args(CreateKind::Upgrade);
        a.image = Some("oci://registry.example/flexnode:v2".into());
        a.digest = Some(format!("sha256:{}", HEX.to_uppercase()));
        let p = plan(&a, 1).expect("plan");
        let params = p.spec.parameters.expect("params");
        assert_eq!(params[PARAM_URL], "oci://registry.example/flexnode:v2");
        assert_eq!(params[PARAM_SHA256], HEX);

        let mut a = args(CreateKind::Upgrade);
        a.url = Some("https://user:hunter2@x.example/f.tgz?sig=SECRET".into());
        a.sha256 = Some(HEX.into());
        let f = plan(&a, 1).map(|_| ()).expect_err("rejected");
        assert_eq!(f.code, EXIT_CONFIG);
        assert!(
            !f.msg.contains("hunter2") && !f.msg.contains("SECRET"),
            "{}",
            f.msg
        );

        // Usage errors.
        let mut a = args(CreateKind::Upgrade);
        assert_eq!(code(&a), EXIT_CONFIG);
        a.url = Some("https://x.example/f.tgz".into());
        a.digest = Some(HEX.into());
        assert_eq!(code(&a), EXIT_CONFIG);
        let mut r = args(CreateKind::Reboot);
        r.sha256 = Some(HEX.into());
        assert_eq!(code(&r), EXIT_CONFIG);
        r.sha256 = None;
        r.selector = Some("a=b".into());
        assert_eq!(code(&r), EXIT_CONFIG);
        r.selector = None;
        r.timeout = Some("1m".into());
        assert_eq!(code(&r), EXIT_CONFIG);
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("https://a.example/f.tgz?sig=S&se=1"),
            "https://a.example/f.tgz?<redacted>"
        );
        assert_eq!(
            redact_url("https://u:p@a.example/f.tgz?sig=S"),
            "https://<redacted>@a.example/f.tgz?<redacted>"
        );
        assert_eq!(
            redact_url("oci://registry.example/x:v1"),
            "oci://registry.example/x:v1"
        );
    }

    #[test]
    fn ages_read_like_kubectl() {
        let t = |secs: i64| Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("ts"));
        assert_eq!(age(1000, &t(1000 - 5)), "5s");
        assert_eq!(age(1000, &t(1000 - 150)), "2m30s");
        assert_eq!(age(100_000, &t(100_000 - 3600 * 5)), "5h");
        assert_eq!(age(1_000_000, &t(1_000_000 - 86_400 * 3)), "3d");
    }
}
