//! `flexnode op create`: everything the user typed is checked (upgrade parameters by the
//! agent's own validation) before the cluster is contacted; the download URL never appears in
//! a message, not even in one the API server sends back.

use super::follow::follow;
use super::{FIELD_MANAGER, api_message};
use crate::api::MachineOperation;
use crate::api::machine_operation::MachineOperationSpec;
use crate::api::machine_operation::OperationKind;
use crate::cli::Failure;
use crate::lifecycle::agent::{Arch, InstallMode, UpgradeTarget};
use crate::lifecycle::validate::{PARAM_SHA256, PARAM_URL, validate_upgrade};
use clap::{Args, ValueEnum};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

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
    #[command(flatten)]
    pub from: UpgradeFrom,
    #[command(flatten)]
    pub drain: DrainFlags,
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

/// How a reboot's or reset's drain goes (`op create`, `rollout reboot`): the operation's
/// parameters, over the agent's configuration (docs/drain.md).
#[derive(Debug, Default, Args)]
pub struct DrainFlags {
    /// No drain: the pods are taken down with the machine (for a node drained already).
    #[arg(long, conflicts_with_all = ["drain_timeout", "drain_on_timeout"])]
    pub no_drain: bool,
    /// How long the drain may take (90s, 10m, 1h30m) [default: the agent's, 10m].
    #[arg(long, value_name = "DURATION")]
    pub drain_timeout: Option<String>,
    /// At the drain's timeout: Fail the operation, or Proceed with the pods left.
    #[arg(long, value_name = "Fail|Proceed")]
    pub drain_on_timeout: Option<String>,
}

impl DrainFlags {
    pub(crate) fn is_set(&self) -> bool {
        self.no_drain || self.drain_timeout.is_some() || self.drain_on_timeout.is_some()
    }

    /// The parameters, checked by the agent's own rules (their fixed messages).
    pub(crate) fn parameters(&self) -> Result<Option<BTreeMap<String, String>>, Failure> {
        use crate::lifecycle::drain::{PARAM_DRAIN, PARAM_ON_TIMEOUT, PARAM_TIMEOUT};
        let mut params = BTreeMap::new();
        if self.no_drain {
            params.insert(PARAM_DRAIN.to_string(), "false".to_string());
        }
        if let Some(t) = &self.drain_timeout {
            params.insert(PARAM_TIMEOUT.to_string(), t.trim().to_string());
        }
        if let Some(o) = &self.drain_on_timeout {
            params.insert(PARAM_ON_TIMEOUT.to_string(), o.trim().to_string());
        }
        crate::lifecycle::drain::DrainPolicy::default()
            .with_parameters(&params)
            .map_err(|invalid| Failure::config(invalid.message()))?;
        Ok((!params.is_empty()).then_some(params))
    }
}

/// Where an upgrade goes to (`op create upgrade`, `rollout upgrade`).
#[derive(Debug, Default, Args)]
pub struct UpgradeFrom {
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
}

impl UpgradeFrom {
    pub fn is_set(&self) -> bool {
        self.image.is_some() || self.digest.is_some() || self.url.is_some() || self.sha256.is_some()
    }
}

/// What `op create` will post, fully checked.
#[derive(Debug)]
pub(super) struct Plan {
    name: String,
    spec: MachineOperationSpec,
    wait: Option<Duration>,
    /// The raw download URL, scrubbed from any error message the API server sends back.
    secret: Option<String>,
}

pub(super) fn plan(a: &CreateArgs, now_secs: u64) -> Result<Plan, Failure> {
    let node = a.node.as_deref().map(str::trim);
    let (machine_ref, machine_selector) = match (node, a.selector.as_deref()) {
        (Some(_), Some(_)) => {
            return Err(Failure::config(
                "pass either --node or --selector, not both",
            ));
        }
        (None, None) => {
            return Err(Failure::config(
                "pass --node NAME or --selector k=v[,k2=v2]",
            ));
        }
        (Some(""), None) => return Err(Failure::config("--node needs a node name")),
        (Some(n), None) => (Some(n.to_string()), None),
        (None, Some(s)) => (None, Some(parse_selector(s)?)),
    };
    let kind = a.kind.operation();
    let upgrade_flags = a.from.is_set();
    let (parameters, secret) = match a.kind {
        CreateKind::Upgrade if a.drain.is_set() => {
            return Err(Failure::config(
                "--no-drain, --drain-timeout and --drain-on-timeout apply to reboot and reset only",
            ));
        }
        CreateKind::Upgrade => {
            let (params, secret) = upgrade_parameters(&a.from)?;
            (Some(params), secret)
        }
        CreateKind::Reboot | CreateKind::Reset if upgrade_flags => {
            return Err(Failure::config(
                "--image, --digest, --url and --sha256 apply to upgrade only",
            ));
        }
        CreateKind::Reboot | CreateKind::Reset => (a.drain.parameters()?, None),
    };
    let ttl_seconds_after_finished = match a.ttl.as_deref() {
        None => None,
        Some(raw) => {
            let d = parse_duration(raw).ok_or_else(|| {
                Failure::config("--ttl takes a duration such as 1h, 30m, 90s or 3600")
            })?;
            Some(i32::try_from(d.as_secs()).map_err(|_| Failure::config("--ttl is too long"))?)
        }
    };
    let wait = match (a.wait, a.timeout.as_deref()) {
        (false, Some(_)) => return Err(Failure::config("--timeout applies to --wait only")),
        (false, None) => None,
        (true, None) => Some(Duration::from_secs(600)),
        (true, Some(raw)) => Some(parse_duration(raw).filter(|d| !d.is_zero()).ok_or_else(
            || Failure::config("--timeout takes a duration such as 10m, 90s or 600"),
        )?),
    };
    let name = match a.name.as_deref().map(str::trim) {
        Some("") => return Err(Failure::config("--name needs a name")),
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
pub(crate) fn upgrade_parameters(
    a: &UpgradeFrom,
) -> Result<(BTreeMap<String, String>, Option<String>), Failure> {
    let (mode, url, digest) = match (&a.image, &a.url) {
        (Some(_), Some(_)) => {
            return Err(Failure::config("pass either --image or --url, not both"));
        }
        (None, None) => {
            return Err(Failure::config(
                "upgrade needs --image oci://REPO[:TAG] --digest sha256:HEX, or --url URL --sha256 HEX",
            ));
        }
        (Some(image), None) => {
            if a.sha256.is_some() {
                return Err(Failure::config("--image takes --digest, not --sha256"));
            }
            (InstallMode::Container, image, a.digest.as_deref())
        }
        (None, Some(url)) => {
            if a.digest.is_some() {
                return Err(Failure::config("--url takes --sha256, not --digest"));
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
        validate_upgrade(mode, Arch::Amd64, &params).map_err(|e| Failure::config(e.message()))?;
    // Store the digest as the agent compares it: lowercase hex, no `sha256:` prefix.
    let hex = match &target {
        UpgradeTarget::Archive { sha256, .. } => sha256.as_str(),
        UpgradeTarget::Image { digest, .. } => digest.as_str(),
    };
    params.insert(PARAM_SHA256.to_string(), hex.to_string());
    Ok((params, Some(url.to_string())))
}

pub(crate) fn parse_selector(raw: &str) -> Result<LabelSelector, Failure> {
    let bad = || Failure::config("--selector takes k=v[,k2=v2]");
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
pub(crate) fn parse_duration(raw: &str) -> Option<Duration> {
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

pub(super) async fn create(api: Api<MachineOperation>, plan: Plan) -> Result<ExitCode, Failure> {
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
            Failure::failed(format!(
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

#[cfg(test)]
mod tests {
    use super::CreateKind;
    use super::*;
    use crate::cli::EXIT_CONFIG;

    const HEX: &str = "abcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcdefabcd";

    fn args(kind: CreateKind) -> CreateArgs {
        CreateArgs {
            kind,
            node: Some("edge-07".into()),
            selector: None,
            from: UpgradeFrom::default(),
            drain: DrainFlags::default(),
            ttl: None,
            name: None,
            wait: false,
            timeout: None,
        }
    }

    fn code(a: &CreateArgs) -> u8 {
        plan(a, 1).map_or_else(|f| f.code, |_| 0)
    }

    /// The drain's flags become its parameters, checked by the agent's rules; an upgrade
    /// takes none.
    #[test]
    fn drain_flags() {
        let mut a = args(CreateKind::Reboot);
        a.drain.drain_timeout = Some("15m".into());
        a.drain.drain_on_timeout = Some("Proceed".into());
        let p = plan(&a, 1).expect("plan");
        let params = p.spec.parameters.expect("params");
        assert_eq!(params.get("drainTimeout").map(String::as_str), Some("15m"));
        assert_eq!(
            params.get("drainOnTimeout").map(String::as_str),
            Some("Proceed")
        );
        let mut off = args(CreateKind::Reset);
        off.drain.no_drain = true;
        let params = plan(&off, 1)
            .expect("plan")
            .spec
            .parameters
            .expect("params");
        assert_eq!(params.get("drain").map(String::as_str), Some("false"));
        a.drain.drain_timeout = Some("forever".into());
        assert_eq!(code(&a), EXIT_CONFIG);
        let mut up = args(CreateKind::Upgrade);
        up.from.url = Some("https://a.example/f.tgz".into());
        up.from.sha256 = Some(HEX.into());
        up.drain.no_drain = true;
        assert_eq!(code(&up), EXIT_CONFIG);
        assert_eq!(
            plan(&args(CreateKind::Reboot), 1)
                .expect("plan")
                .spec
                .parameters,
            None
        );
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
        a.from.image = Some("oci://registry.example/flexnode:v2".into());
        a.from.digest = Some(format!("sha256:{}", HEX.to_uppercase()));
        let p = plan(&a, 1).expect("plan");
        let params = p.spec.parameters.expect("params");
        assert_eq!(params[PARAM_URL], "oci://registry.example/flexnode:v2");
        assert_eq!(params[PARAM_SHA256], HEX);

        let mut a = args(CreateKind::Upgrade);
        a.from.url = Some("https://user:hunter2@x.example/f.tgz?sig=SECRET".into());
        a.from.sha256 = Some(HEX.into());
        let f = plan(&a, 1).map(|_| ()).expect_err("rejected");
        assert_eq!(f.code, EXIT_CONFIG);
        assert!(
            !f.message.contains("hunter2") && !f.message.contains("SECRET"),
            "{}",
            f.message
        );

        // Usage errors.
        let mut a = args(CreateKind::Upgrade);
        assert_eq!(code(&a), EXIT_CONFIG);
        a.from.url = Some("https://x.example/f.tgz".into());
        a.from.digest = Some(HEX.into());
        assert_eq!(code(&a), EXIT_CONFIG);
        let mut r = args(CreateKind::Reboot);
        r.from.sha256 = Some(HEX.into());
        assert_eq!(code(&r), EXIT_CONFIG);
        r.from.sha256 = None;
        r.selector = Some("a=b".into());
        assert_eq!(code(&r), EXIT_CONFIG);
        r.selector = None;
        r.timeout = Some("1m".into());
        assert_eq!(code(&r), EXIT_CONFIG);
    }
}
