//! `flexnode rollout`: one operation for every node a label selector matches, in waves of at
//! most `--max-unavailable` nodes, each wave waited for; the first failure stops the rollout
//! and names the node and why. The rollout is kept in the cluster as a labelled ConfigMap
//! (`plan.rs`), so `--resume NAME` goes on from any terminal without repeating a node that
//! is done, and a second rollout on the same selector is refused by the API server itself.

pub mod plan;

use crate::api::machine_operation::{MachineOperationSpec, OperationKind, OperationPhase};
use crate::api::{Machine, MachineOperation};
use crate::cli::op::create::{
    DrainFlags, UpgradeFrom, parse_duration, parse_selector, upgrade_parameters,
};
use crate::cli::op::{api_message, client, follow::reason, unix_now};
use crate::cli::{EXIT_TIMEOUT, Failure};
use clap::{Args, ValueEnum};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use plan::{MaxUnavailable, Phase, Record, Stop};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Labels every object of a rollout (its ConfigMap and its operations) with its name.
pub const ROLLOUT_LABEL: &str = "flexnode.io/rollout";
/// The ConfigMap's phase, for `kubectl get cm -l flexnode.io/rollout -L flexnode.io/rollout-phase`.
pub const PHASE_LABEL: &str = "flexnode.io/rollout-phase";
const RECORD_KEY: &str = "rollout.json";
const FIELD_MANAGER: &str = "flexnode-rollout";
const POLL: Duration = Duration::from_secs(1);

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RolloutKind {
    Reboot,
    Upgrade,
}

#[derive(Debug, Args)]
pub struct RolloutArgs {
    /// What each node gets: a NodeReboot or an AgentUpgrade.
    #[arg(value_enum, required_unless_present = "resume")]
    pub kind: Option<RolloutKind>,
    /// The nodes: every Machine with these labels, k=v[,k2=v2].
    #[arg(long, value_name = "LABELS", required_unless_present = "resume")]
    pub selector: Option<String>,
    #[command(flatten)]
    pub from: UpgradeFrom,
    #[command(flatten)]
    pub drain: DrainFlags,
    /// How many nodes go at once: a count, or a percent of the nodes (rounded up).
    #[arg(long, value_name = "N|P%", default_value = "1")]
    pub max_unavailable: String,
    /// The rollout's name (a DNS label) [default: <kind>-<unix seconds>].
    #[arg(long)]
    pub name: Option<String>,
    /// Go on with the stopped (or abandoned) rollout NAME from where it stopped.
    #[arg(long, value_name = "NAME", conflicts_with_all = [
        "kind", "selector", "image", "digest", "url", "sha256", "name", "no_drain",
        "drain_timeout", "drain_on_timeout"
    ])]
    pub resume: Option<String>,
    /// Print the waves and create nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop when a wave has not finished after this long (exit 3; resumable).
    #[arg(long, value_name = "DURATION", default_value = "30m")]
    pub wave_timeout: String,
    /// The namespace of the rollout's ConfigMap.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
}

pub fn run(args: RolloutArgs) -> ExitCode {
    crate::cli::block_on("rollout", rollout(args))
}

/// What each node's operation is, and the URL to keep out of messages.
struct Template {
    kind: OperationKind,
    parameters: Option<BTreeMap<String, String>>,
    secret: Option<String>,
}

struct Cluster {
    maps: Api<ConfigMap>,
    ops: Api<MachineOperation>,
    /// The ConfigMap's name and the resourceVersion this terminal last wrote.
    lock: String,
    version: Option<String>,
    wave_timeout: Duration,
}

async fn rollout(args: RolloutArgs) -> Result<ExitCode, Failure> {
    let max = MaxUnavailable::parse(&args.max_unavailable).ok_or_else(|| {
        Failure::config("--max-unavailable takes a count (2) or a percent (25%) above zero")
    })?;
    let wave_timeout = parse_duration(&args.wave_timeout)
        .filter(|d| !d.is_zero())
        .ok_or_else(|| Failure::config("--wave-timeout takes a duration such as 30m or 600"))?;
    if let Some(name) = &args.resume {
        return resume(&args, name, wave_timeout).await;
    }
    let (Some(kind), Some(selector)) = (args.kind, args.selector.as_deref()) else {
        return Err(Failure::config("pass reboot|upgrade and --selector k=v"));
    };
    parse_selector(selector)?;
    let template = template(&args, kind)?;
    let name = match args.name.as_deref().map(str::trim) {
        Some(n) => n.to_string(),
        None => format!(
            "{}-{}",
            template.kind.as_str().to_ascii_lowercase(),
            unix_now()
        ),
    };
    if !is_dns_label(&name) {
        return Err(Failure::config(format!(
            "--name {name:?} must be a DNS label (lowercase letters, digits, '-'; at most 63)"
        )));
    }
    let client = client(args.kubeconfig.clone()).await?;
    let machines: Api<Machine> = Api::all(client.clone());
    let listed = machines
        .list(&ListParams::default().labels(selector))
        .await
        .map_err(|e| Failure::failed(format!("cannot list Machines: {}", api_message(&e))))?;
    let nodes: Vec<String> = listed
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    if nodes.is_empty() {
        return Err(Failure::failed(format!(
            "no Machine matches {selector}: nothing to roll out"
        )));
    }
    let mut record = Record::new(&name, selector, template.kind.as_str(), max, nodes);
    record.driver = driver();
    for node in &record.nodes {
        let op = record.operation(node);
        if op.len() > 253 {
            return Err(Failure::config(format!(
                "the operation name {op:?} is too long: choose a shorter --name"
            )));
        }
    }
    if args.dry_run {
        print_plan(&record, "would run");
        return Ok(ExitCode::SUCCESS);
    }
    let mut cluster = Cluster {
        maps: Api::namespaced(client.clone(), &args.namespace),
        ops: Api::all(client),
        lock: plan::lock_name(selector),
        version: None,
        wave_timeout,
    };
    cluster.take(&record).await?;
    print_plan(&record, "runs");
    drive(&mut cluster, record, &template).await
}

async fn resume(
    args: &RolloutArgs,
    name: &str,
    wave_timeout: Duration,
) -> Result<ExitCode, Failure> {
    let client = client(args.kubeconfig.clone()).await?;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    let found = maps
        .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}={name}")))
        .await
        .map_err(|e| Failure::failed(format!("cannot read rollouts: {}", api_message(&e))))?;
    let Some(map) = found.items.into_iter().next() else {
        return Err(Failure::failed(format!(
            "no rollout {name} in namespace {} (kubectl get configmaps -l {ROLLOUT_LABEL})",
            args.namespace
        )));
    };
    let mut record = read_record(&map)?;
    if record.phase == Phase::Complete {
        println!(
            "rollout {name} is already complete: {} nodes",
            record.done.len()
        );
        return Ok(ExitCode::SUCCESS);
    }
    let ops: Api<MachineOperation> = Api::all(client);
    let template = template_of(&ops, &record).await?;
    record.resume(&driver());
    if args.dry_run {
        print_plan(&record, "would resume with");
        return Ok(ExitCode::SUCCESS);
    }
    let mut cluster = Cluster {
        maps,
        ops,
        lock: map.metadata.name.clone().unwrap_or_default(),
        version: map.metadata.resource_version.clone(),
        wave_timeout,
    };
    cluster.save(&record).await?;
    print_plan(&record, "resumes with");
    drive(&mut cluster, record, &template).await
}

/// Each node's operation, its parameters checked by the agent's own validation.
fn template(args: &RolloutArgs, kind: RolloutKind) -> Result<Template, Failure> {
    match kind {
        RolloutKind::Reboot if args.from.is_set() => Err(Failure::config(
            "--image, --digest, --url and --sha256 apply to upgrade only",
        )),
        RolloutKind::Reboot => Ok(Template {
            kind: OperationKind::NodeReboot,
            parameters: args.drain.parameters()?,
            secret: None,
        }),
        RolloutKind::Upgrade if args.drain.is_set() => Err(Failure::config(
            "--no-drain, --drain-timeout and --drain-on-timeout apply to reboot only",
        )),
        RolloutKind::Upgrade => {
            let (parameters, secret) = upgrade_parameters(&args.from)?;
            Ok(Template {
                kind: OperationKind::AgentUpgrade,
                parameters: Some(parameters),
                secret,
            })
        }
    }
}

/// A resumed rollout's operation: its kind from the record, an upgrade's parameters from the
/// operations it already created (the record holds nothing secret).
async fn template_of(ops: &Api<MachineOperation>, record: &Record) -> Result<Template, Failure> {
    let mine = ops
        .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}={}", record.name)))
        .await
        .map_err(|e| Failure::failed(format!("cannot list operations: {}", api_message(&e))))?;
    let Some(first) = mine.items.into_iter().next() else {
        return Err(Failure::failed(format!(
            "rollout {} created no operation yet: nothing to resume from; delete it \
             (kubectl delete configmap -l {ROLLOUT_LABEL}={}) and start it again",
            record.name, record.name
        )));
    };
    if first.spec.operation_kind.as_str() != record.kind {
        return Err(Failure::failed(format!(
            "rollout {}: its operations are {}, its record says {}",
            record.name,
            first.spec.operation_kind.as_str(),
            record.kind
        )));
    }
    let secret = first
        .spec
        .parameters
        .as_ref()
        .and_then(|p| p.get(crate::lifecycle::validate::PARAM_URL).cloned());
    Ok(Template {
        kind: first.spec.operation_kind,
        parameters: first.spec.parameters,
        secret,
    })
}

fn driver() -> String {
    format!("{}/{}", crate::cli::wiring::hostname(), std::process::id())
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn print_plan(record: &Record, verb: &str) {
    let waves = record.waves();
    println!(
        "rollout {} {verb} {} on {} of {} nodes matching {}, {} at a time ({} wave{})",
        record.name,
        record.kind,
        waves.iter().map(Vec::len).sum::<usize>(),
        record.nodes.len(),
        record.selector,
        record.max_unavailable,
        waves.len(),
        if waves.len() == 1 { "" } else { "s" }
    );
    for (i, wave) in waves.iter().enumerate() {
        println!("  wave {}: {}", i + 1, wave.join(" "));
    }
}

fn read_record(map: &ConfigMap) -> Result<Record, Failure> {
    let text = map
        .data
        .as_ref()
        .and_then(|d| d.get(RECORD_KEY))
        .ok_or_else(|| Failure::failed("the rollout's ConfigMap holds no record"))?;
    serde_json::from_str(text)
        .map_err(|e| Failure::failed(format!("the rollout's record cannot be read: {e}")))
}

impl Cluster {
    fn object(&self, record: &Record) -> Result<ConfigMap, Failure> {
        let text = serde_json::to_string_pretty(record)
            .map_err(|e| Failure::failed(format!("cannot write the rollout's record: {e}")))?;
        Ok(ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.lock.clone()),
                labels: Some(BTreeMap::from([
                    (ROLLOUT_LABEL.to_string(), record.name.clone()),
                    (PHASE_LABEL.to_string(), record.phase.as_str().to_string()),
                ])),
                resource_version: self.version.clone(),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(RECORD_KEY.to_string(), text)])),
            ..Default::default()
        })
    }

    /// Takes the selector's lock: creates the ConfigMap, or replaces a complete rollout's.
    /// Another rollout of the selector that is not complete is refused.
    async fn take(&mut self, record: &Record) -> Result<(), Failure> {
        let pp = post_params();
        match self.maps.create(&pp, &self.object(record)?).await {
            Ok(created) => {
                self.version = created.metadata.resource_version;
                return Ok(());
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => {
                return Err(Failure::failed(format!(
                    "cannot record the rollout: {}",
                    api_message(&e)
                )));
            }
        }
        let existing =
            self.maps.get(&self.lock).await.map_err(|e| {
                Failure::failed(format!("cannot read rollouts: {}", api_message(&e)))
            })?;
        let other = read_record(&existing)?;
        if other.phase != Phase::Complete {
            return Err(Failure::failed(format!(
                "rollout {} ({}, driven by {}) already covers the nodes of {}: resume it with \
                 `flexnode rollout --resume {}`, or wait until it completes",
                other.name,
                other.phase.as_str(),
                other.driver,
                other.selector,
                other.name
            )));
        }
        self.version = existing.metadata.resource_version;
        self.save(record).await
    }

    /// Writes the record over the version this terminal last wrote: another terminal's write
    /// in between (a `--resume` elsewhere) stops this one.
    async fn save(&mut self, record: &Record) -> Result<(), Failure> {
        match self
            .maps
            .replace(&self.lock, &post_params(), &self.object(record)?)
            .await
        {
            Ok(written) => {
                self.version = written.metadata.resource_version;
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 409 => Err(Failure::failed(format!(
                "rollout {} was changed by another terminal (resumed elsewhere?): stopping here",
                record.name
            ))),
            Err(e) => Err(Failure::failed(format!(
                "cannot record the rollout: {}",
                api_message(&e)
            ))),
        }
    }

    /// Creates `name` for `node`, or adopts it when this rollout created it before (a
    /// terminal that died between the create and the record).
    async fn start(&self, record: &Record, node: &str, template: &Template) -> Result<(), Failure> {
        let name = record.operation(node);
        let mut op = MachineOperation::new(
            &name,
            MachineOperationSpec {
                machine_ref: Some(node.to_string()),
                machine_selector: None,
                operation_kind: template.kind,
                parameters: template.parameters.clone(),
                ttl_seconds_after_finished: None,
            },
        );
        op.metadata.labels = Some(BTreeMap::from([(
            ROLLOUT_LABEL.to_string(),
            record.name.clone(),
        )]));
        match self.ops.create(&post_params(), &op).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                let existing = self.ops.get(&name).await.map_err(|e| {
                    Failure::failed(format!(
                        "cannot read machineoperation/{name}: {}",
                        api_message(&e)
                    ))
                })?;
                let ours = existing
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(ROLLOUT_LABEL))
                    == Some(&record.name);
                if ours {
                    Ok(())
                } else {
                    Err(Failure::failed(format!(
                        "machineoperation/{name} exists and is not rollout {}'s",
                        record.name
                    )))
                }
            }
            Err(e) => {
                let mut msg = api_message(&e);
                if let Some(secret) = template.secret.as_deref().filter(|s| !s.is_empty()) {
                    msg = msg.replace(secret, "<downloadURL>");
                }
                Err(Failure::failed(format!(
                    "cannot create machineoperation/{name}: {msg}"
                )))
            }
        }
    }

    /// Waits until every node of `wave` is terminal, or the wave timeout; prints each node's
    /// phase as it changes.
    async fn wait(&self, record: &Record, wave: &[String], progress: &WaveProgress) -> WaveEnd {
        let deadline = tokio::time::Instant::now() + self.wave_timeout;
        let mut shown: BTreeMap<String, String> = BTreeMap::new();
        // Until a list says otherwise, every node is still going.
        let mut end = WaveEnd {
            pending: wave.to_vec(),
            ..WaveEnd::default()
        };
        let mut warned = false;
        loop {
            let listed = self
                .ops
                .list(&ListParams::default().labels(&format!("{ROLLOUT_LABEL}={}", record.name)))
                .await;
            match listed {
                Err(e) if !warned => {
                    eprintln!(
                        "flexnode rollout: cannot list operations, retrying: {}",
                        api_message(&e)
                    );
                    warned = true;
                }
                Err(_) => {}
                Ok(list) => {
                    warned = false;
                    let by_name: BTreeMap<String, MachineOperation> = list
                        .items
                        .into_iter()
                        .filter_map(|op| Some((op.metadata.name.clone()?, op)))
                        .collect();
                    end = WaveEnd::default();
                    for node in wave {
                        let operation = record.operation(node);
                        let op = by_name.get(&operation);
                        let line = match (op.and_then(|o| o.status.as_ref()?.phase), op) {
                            (Some(OperationPhase::Complete), _) => {
                                end.complete.push(node.clone());
                                "Complete".to_string()
                            }
                            (Some(OperationPhase::Failed), Some(op)) => {
                                let why = failure(op);
                                let line = format!("Failed ({why})");
                                end.stops.push(Stop {
                                    node: node.clone(),
                                    operation,
                                    why,
                                    failed: true,
                                });
                                line
                            }
                            (Some(OperationPhase::InProgress), _) => {
                                end.pending.push(node.clone());
                                "InProgress".to_string()
                            }
                            _ => {
                                end.pending.push(node.clone());
                                "Pending".to_string()
                            }
                        };
                        if shown.get(node) != Some(&line) {
                            progress.line(&format!("  {node}: {line}"));
                            shown.insert(node.clone(), line);
                        }
                    }
                    progress.set(wave.len() - end.pending.len());
                    if end.pending.is_empty() {
                        return end;
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                if let Some(node) = end.pending.first().cloned() {
                    end.stops.insert(
                        0,
                        Stop {
                            operation: record.operation(&node),
                            node,
                            why: format!(
                                "the wave did not finish within {}s",
                                self.wave_timeout.as_secs()
                            ),
                            failed: false,
                        },
                    );
                }
                end.timed_out = true;
                return end;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// How a wave ended: its nodes by outcome.
#[derive(Debug, Default)]
struct WaveEnd {
    complete: Vec<String>,
    /// Failed nodes (a timeout's first, naming a node still going).
    stops: Vec<Stop>,
    pending: Vec<String>,
    timed_out: bool,
}

/// A wave's progress: a bar on a terminal, plain lines otherwise (a pipe, a CI log).
struct WaveProgress(Option<indicatif::ProgressBar>);

impl WaveProgress {
    fn new(nodes: usize, title: &str) -> Self {
        if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
            println!("{title}");
            return Self(None);
        }
        let bar = indicatif::ProgressBar::new(nodes as u64);
        if let Ok(style) =
            indicatif::ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} finished")
        {
            bar.set_style(style);
        }
        bar.set_prefix(title.to_string());
        bar.enable_steady_tick(Duration::from_millis(500));
        Self(Some(bar))
    }

    fn line(&self, text: &str) {
        match &self.0 {
            Some(bar) => bar.println(text),
            None => println!("{text}"),
        }
    }

    fn set(&self, finished: usize) {
        if let Some(bar) = &self.0 {
            bar.set_position(finished as u64);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish();
        }
    }
}

/// `Failed (reason): message` of a failed operation.
fn failure(op: &MachineOperation) -> String {
    let message = op
        .status
        .as_ref()
        .and_then(|s| s.message.as_deref())
        .unwrap_or("");
    match reason(op) {
        Some(r) => format!("{r}: {message}"),
        None => message.to_string(),
    }
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Runs the waves still to go; the record is written after each.
async fn drive(
    cluster: &mut Cluster,
    mut record: Record,
    template: &Template,
) -> Result<ExitCode, Failure> {
    let waves = record.waves();
    for (i, wave) in waves.iter().enumerate() {
        let progress = WaveProgress::new(
            wave.len(),
            &format!("wave {}/{}: {}", i + 1, waves.len(), wave.join(" ")),
        );
        for node in wave {
            cluster.start(&record, node, template).await?;
        }
        let end = cluster.wait(&record, wave, &progress).await;
        progress.finish();
        record.done.extend(end.complete);
        if let Some(stop) = end.stops.first().cloned() {
            record.phase = Phase::Stopped;
            record.stopped = end.stops;
            cluster.save(&record).await?;
            eprintln!(
                "flexnode rollout: {} stopped at node {} (machineoperation/{}): {}\n\
                 {} of {} nodes done. Mend the node, then go on with `flexnode rollout --resume {}`.",
                record.name,
                stop.node,
                stop.operation,
                stop.why,
                record.done.len(),
                record.nodes.len(),
                record.name
            );
            return Ok(ExitCode::from(if end.timed_out { EXIT_TIMEOUT } else { 1 }));
        }
        cluster.save(&record).await?;
    }
    record.phase = Phase::Complete;
    cluster.save(&record).await?;
    println!(
        "rollout {} complete: {} node{}",
        record.name,
        record.done.len(),
        if record.done.len() == 1 { "" } else { "s" }
    );
    Ok(ExitCode::SUCCESS)
}
