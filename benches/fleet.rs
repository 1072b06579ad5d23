//! The fleet benchmark (docs/benchmarks.md, "Fleet"): N agents against one real API server,
//! each with its own client certificate (`system:flexnode:<node>`), store and watches, over
//! the simulated host, under the agents' RBAC and admission policies. Never a timed assertion.
//!
//! `cargo bench --bench fleet -- [--nodes 1,10,100,1000] [--out FILE]` (`bench/run` runs it).
//!
//! For each N and each watch strategy (`OperationWatch::Selected`, flexnode's;
//! `OperationWatch::All`, the AKS Flex Node agent's: every operation, filtered locally) the
//! agents run in one child process (this binary again, `FLEET_AGENTS` set), so that its CPU
//! and memory are the agents' alone; this process creates the operations and watches their
//! status like a controller would. Two phases: a burst (one NodeReboot per node, created at
//! once) and a trickle (10 per second, round robin over the nodes, a node's next only once
//! its last is finished). Per phase: claim latency
//! (create sent → `InProgress` seen by the controller's watch) and completion latency
//! (→ `Complete`), operation watch events delivered per agent, API requests per operation
//! (the API server's `apiserver_request_total`, the controller's own creates taken out),
//! agent CPU per operation, and the API server's CPU and memory. Memory per agent is the
//! child's RSS once every agent is in sync, less its RSS before the first started, over N.
//!
//! The stores are on tmpfs: a fleet of separate machines does not share one disk's fsyncs,
//! which one process on one disk would (the commit latency itself is in the footprint
//! benchmark, `bench/footprint`).

#[path = "../tests/support/mod.rs"]
mod support;
// Flags, medians and the cache directory (benches/common/).
mod common;

use common::flag;
use flexnode::api::machine_operation::{MachineOperation, OperationPhase};
use flexnode::config::kubeconfig::client_from_kubeconfig;
use flexnode::lifecycle::agent::InstallMode;
use flexnode::reconcile::{DaemonConfig, OperationWatch, WatchCounters};
use futures::StreamExt;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::Lab;
use support::agent::{Agent, admin, apply_rbac, create_node_and_machine, node_reboot};
use support::proc::{cpu_secs, rss_mib};

const TRICKLE_OPS: usize = 100;
const TRICKLE_EVERY: Duration = Duration::from_millis(100);
const PHASE_LIMIT: Duration = Duration::from_secs(600);

fn main() {
    if let Ok(strategy) = std::env::var("FLEET_AGENTS") {
        agents(&strategy);
        return;
    }
    let nodes: Vec<usize> = flag("--nodes")
        .unwrap_or_else(|| "1,10,100,1000".into())
        .split(',')
        .map(|n| n.parse().expect("--nodes wants numbers: 1,10,100,1000"))
        .collect();
    let out = PathBuf::from(flag("--out").unwrap_or_else(|| "fleet.json".into()));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(drive(&nodes, &out));
    println!("fleet: results in {}", out.display());
}

fn strategy_name(s: OperationWatch) -> &'static str {
    match s {
        OperationWatch::Selected => "selected",
        OperationWatch::All => "all",
    }
}

fn node_name(i: usize) -> String {
    format!("fleet-{i:04}")
}

/// Writes `out` after every N and strategy: a later failure keeps what was measured.
async fn drive(sizes: &[usize], out: &Path) {
    let max = sizes.iter().copied().max().unwrap_or(0);
    let open_files = open_file_limit();
    assert!(
        open_files >= 8 * max as u64 + 1024,
        "{max} agents need about {} open files; the limit is {open_files} (bench/run raises it)",
        8 * max + 1024
    );
    let lab = Lab::up();
    apply_rbac(&lab);
    let client = admin(&lab).await;
    let names: Vec<String> = (0..max).map(node_name).collect();
    let started = Instant::now();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let kubeconfigs = lab.node_kubeconfigs(&refs);
    futures::stream::iter(names.iter())
        .for_each_concurrent(16, |n| {
            create_node_and_machine(&client, n, &[("pool", "fleet")])
        })
        .await;
    eprintln!(
        "fleet: {max} identities, Nodes and Machines in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let apiserver = pid(&lab, "kube-apiserver");
    let mut results = Vec::new();
    for &n in sizes {
        for strategy in [OperationWatch::Selected, OperationWatch::All] {
            let run = Run {
                lab: &lab,
                client: &client,
                apiserver,
                names: &names[..n],
                kubeconfigs: &kubeconfigs[..n],
                strategy,
            };
            results.extend(run.measure().await);
            let text = serde_json::to_string_pretty(&results).expect("json");
            std::fs::write(out, text + "\n").expect("write the results");
        }
    }
}

fn open_file_limit() -> u64 {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn pid(lab: &Lab, name: &str) -> u32 {
    let file = lab.dir.join(format!("pids/{name}.pid"));
    std::fs::read_to_string(&file)
        .expect("the control plane's pid file")
        .trim()
        .parse()
        .expect("a pid")
}

/// The API server's resource requests so far, by `verb resource`.
async fn api_requests(client: &Client) -> HashMap<String, f64> {
    let mut text = String::new();
    for attempt in 1.. {
        let req = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("request");
        match client.request_text(req).await {
            Ok(t) => {
                text = t;
                break;
            }
            Err(e) if attempt < 10 => {
                eprintln!("fleet: /metrics: {e}; again");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => panic!("/metrics: {e}"),
        }
    }
    let mut by = HashMap::new();
    for line in text.lines() {
        let Some(labels) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = labels.rsplit_once("} ") else {
            continue;
        };
        let label = |k: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=\"")))
                .map(|v| v.trim_end_matches('"').to_owned())
                .unwrap_or_default()
        };
        let resource = label("resource");
        if resource.is_empty() {
            continue; // /metrics, /readyz and the like
        }
        let sub = label("subresource");
        let key = format!(
            "{} {resource}{}",
            label("verb"),
            if sub.is_empty() {
                String::new()
            } else {
                format!("/{sub}")
            }
        );
        *by.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
    }
    by
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn spread(mut v: Vec<f64>) -> Value {
    v.sort_by(f64::total_cmp);
    json!({
        "p50": percentile(&v, 50.0),
        "p95": percentile(&v, 95.0),
        "p99": percentile(&v, 99.0),
    })
}

/// What a controller's watch saw of each operation: when it was first `InProgress` and when
/// it reached a terminal phase (and whether that was `Complete`).
#[derive(Default)]
struct Seen {
    in_progress: HashMap<String, Instant>,
    done: HashMap<String, (Instant, bool)>,
}

fn observe(client: &Client) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let api: Api<MachineOperation> = Api::all(client.clone());
    let record = seen.clone();
    let task = tokio::spawn(async move {
        let mut events = watcher::watcher(api, watcher::Config::default()).boxed();
        while let Some(event) = events.next().await {
            let (watcher::Event::Apply(op) | watcher::Event::InitApply(op)) = (match event {
                Ok(e) => e,
                Err(_) => continue,
            }) else {
                continue;
            };
            let (Some(name), Some(phase)) = (
                op.metadata.name.clone(),
                op.status.as_ref().and_then(|s| s.phase),
            ) else {
                continue;
            };
            let now = Instant::now();
            let mut seen = record.lock().expect("lock");
            match phase {
                OperationPhase::InProgress => {
                    seen.in_progress.entry(name).or_insert(now);
                }
                OperationPhase::Complete | OperationPhase::Failed => {
                    let ok = phase == OperationPhase::Complete;
                    seen.done.entry(name).or_insert((now, ok));
                }
                OperationPhase::Pending | OperationPhase::Unknown => {}
            }
        }
    });
    (seen, task)
}

/// An operation a phase creates: at `at` after the phase's start, and not before `after`
/// (the same node's previous operation) is finished.
struct Planned {
    name: String,
    node: String,
    at: Duration,
    after: Option<String>,
}

struct Run<'a> {
    lab: &'a Lab,
    client: &'a Client,
    apiserver: u32,
    names: &'a [String],
    kubeconfigs: &'a [PathBuf],
    strategy: OperationWatch,
}

impl Run<'_> {
    async fn measure(&self) -> Vec<Value> {
        let n = self.names.len();
        let label = format!("N={n} {}", strategy_name(self.strategy));
        let mut agents = Agents::start(self);
        let base = rss_mib(agents.pid());
        agents.say("start");
        let synced = agents.expect("synced");
        let per_agent = (rss_mib(agents.pid()) - base) / n as f64;
        eprintln!("fleet {label}: in sync in {synced} s, {per_agent:.2} MiB per agent");
        let (seen, observer) = observe(self.client);
        tokio::time::sleep(Duration::from_secs(2)).await;

        let burst: Vec<Planned> = self
            .names
            .iter()
            .map(|node| Planned {
                name: format!("burst-{node}"),
                node: node.clone(),
                at: Duration::ZERO,
                after: None,
            })
            .collect();
        let trickle_name = |i: usize| format!("trickle-{i:03}-{}", self.names[i % n]);
        let trickle: Vec<Planned> = (0..TRICKLE_OPS)
            .map(|i| Planned {
                name: trickle_name(i),
                node: self.names[i % n].clone(),
                at: TRICKLE_EVERY * i as u32,
                after: i.checked_sub(n).map(trickle_name),
            })
            .collect();
        let mut out = Vec::new();
        for (phase, ops) in [("burst", burst), ("trickle", trickle)] {
            let mut result = self.phase(&mut agents, &seen, &ops).await;
            result["nodes"] = json!(n);
            result["strategy"] = json!(strategy_name(self.strategy));
            result["phase"] = json!(phase);
            result["memory_mib_per_agent"] = json!(per_agent);
            result["sync_secs"] = json!(synced.parse::<f64>().unwrap_or(f64::NAN));
            eprintln!("fleet {label} {phase}: {result}");
            out.push(result);
            self.delete_operations().await;
        }
        observer.abort();
        agents.quit();
        out
    }

    async fn phase(&self, agents: &mut Agents, seen: &Arc<Mutex<Seen>>, ops: &[Planned]) -> Value {
        let api_before = api_requests(self.client).await;
        let events_before = agents.events();
        let (agent_cpu, api_cpu) = (cpu_secs(agents.pid()), cpu_secs(self.apiserver));
        let start = Instant::now();
        let api: Api<MachineOperation> = Api::all(self.client.clone());
        // Creates run 64 at a time (a burst wider than the API server's mutating limit would
        // be refused, not queued); each is timed from when its request is sent.
        let creates: Vec<(String, Instant, u32)> = futures::stream::iter(ops.iter())
            .map(
                |Planned {
                     name,
                     node,
                     at,
                     after,
                 }| {
                    let api = api.clone();
                    async move {
                        tokio::time::sleep_until((start + *at).into()).await;
                        // A node's next operation waits for its last: claim latency is the
                        // agent's, not a queue's.
                        if let Some(after) = after {
                            while !seen.lock().expect("lock").done.contains_key(after) {
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                        let op = node_reboot(name, node);
                        let sent = Instant::now();
                        let mut attempts = 0;
                        loop {
                            attempts += 1;
                            match api.create(&PostParams::default(), &op).await {
                                Ok(_) => break,
                                Err(kube::Error::Api(s)) if s.code == 429 && attempts < 20 => {
                                    tokio::time::sleep(Duration::from_millis(200)).await;
                                }
                                Err(e) => panic!("create {name}: {e}"),
                            }
                        }
                        (name.clone(), sent, attempts)
                    }
                },
            )
            .buffer_unordered(64)
            .collect()
            .await;
        let deadline = Instant::now() + PHASE_LIMIT;
        loop {
            let done = seen.lock().expect("lock").done.len();
            if creates
                .iter()
                .all(|(n, _, _)| seen.lock().expect("lock").done.contains_key(n))
            {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("fleet: {done} operations finished before the phase's limit");
                break;
            }
            agents.alive();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let elapsed = start.elapsed().as_secs_f64();
        // The agents' last writes (Events) after the terminal status.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (agent_cpu, api_cpu) = (
            cpu_secs(agents.pid()) - agent_cpu,
            cpu_secs(self.apiserver) - api_cpu,
        );
        let events = agents.events();
        let api_after = api_requests(self.client).await;
        let mut by: Vec<(String, f64)> = api_after
            .iter()
            .map(|(k, v)| (k.clone(), v - api_before.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect();
        by.sort_by(|a, b| b.1.total_cmp(&a.1));
        let own_creates: u32 = creates.iter().map(|c| c.2).sum();
        let total: f64 = by.iter().map(|(_, d)| d).sum::<f64>() - f64::from(own_creates);
        let ops_n = ops.len() as f64;
        let seen = seen.lock().expect("lock");
        let (mut claim, mut complete, mut failed, mut missing) = (vec![], vec![], 0, 0);
        for (name, sent, _) in &creates {
            match seen.done.get(name) {
                Some((at, ok)) => {
                    complete.push(at.duration_since(*sent).as_secs_f64() * 1000.0);
                    failed += usize::from(!ok);
                }
                None => missing += 1,
            }
            if let Some(at) = seen
                .in_progress
                .get(name)
                .or(seen.done.get(name).map(|d| &d.0))
            {
                claim.push(at.duration_since(*sent).as_secs_f64() * 1000.0);
            }
        }
        let n = events.len() as f64;
        let delivered: Vec<f64> = events
            .iter()
            .zip(&events_before)
            .map(|(a, b)| (a - b) as f64)
            .collect();
        json!({
            "operations": ops.len(),
            "failed": failed,
            "unfinished": missing,
            "secs": elapsed,
            "claim_ms": spread(claim),
            "complete_ms": spread(complete),
            "events_per_agent": delivered.iter().sum::<f64>() / n,
            "events_per_agent_max": delivered.iter().copied().fold(0.0, f64::max),
            "requests_per_operation": total / ops_n,
            "requests": by.iter().take(8).map(|(k, d)| json!([k, d])).collect::<Vec<_>>(),
            "agent_cpu_ms_per_operation": agent_cpu * 1000.0 / ops_n,
            "apiserver_cpu_secs": api_cpu,
            "apiserver_rss_mib": rss_mib(self.apiserver),
        })
    }

    async fn delete_operations(&self) {
        let api: Api<MachineOperation> = Api::all(self.client.clone());
        // Under the whole-cluster watches a thousand deletions fan out a million events: the
        // API server may drop the request while it works through them; asking again is safe.
        for attempt in 1.. {
            match api
                .delete_collection(&DeleteParams::default(), &ListParams::default())
                .await
            {
                Ok(_) => break,
                Err(e) if attempt < 10 => {
                    eprintln!("fleet: deleting the operations: {e}; again");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
                Err(e) => panic!("delete the operations: {e}"),
            }
        }
        let all = ListParams::default();
        while !api
            .list_metadata(&all)
            .await
            .map(|l| l.items.is_empty())
            .unwrap_or(false)
        {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Until the agents have heard of the deletions.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// The child process that runs the agents, spoken to by lines.
struct Agents {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    _stores: tempfile::TempDir,
}

impl Agents {
    fn start(run: &Run<'_>) -> Self {
        let stores = tempfile::Builder::new()
            .prefix("flexnode-fleet-")
            .tempdir_in("/dev/shm")
            .expect("a tmpfs directory for the stores");
        let list = stores.path().join("agents");
        let lines: String = run
            .names
            .iter()
            .zip(run.kubeconfigs)
            .map(|(n, k)| format!("{n} {}\n", k.display()))
            .collect();
        std::fs::write(&list, lines).expect("write the agent list");
        let log = std::fs::File::create(run.lab.dir.join("logs/fleet-agents.log")).expect("log");
        let mut child = Command::new(std::env::current_exe().expect("this binary"))
            .env("FLEET_AGENTS", strategy_name(run.strategy))
            .env("FLEET_DIR", stores.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("start the agents' process");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut agents = Self {
            child,
            stdin,
            stdout,
            _stores: stores,
        };
        agents.expect("base");
        agents
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics (the lab is stopped as the stack unwinds) once the agents' process has died.
    fn alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the agents' process exited ({status}); see logs/fleet-agents.log");
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").expect("write to the agents");
        self.stdin.flush().expect("flush");
    }

    /// The next line's words after `word`.
    fn expect(&mut self, word: &str) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read the agents");
        let rest = line.trim().strip_prefix(word).unwrap_or_else(|| {
            panic!("the agents said {line:?}, not {word}; see logs/fleet-agents.log")
        });
        rest.trim().to_owned()
    }

    /// Operation watch events each agent has received so far.
    fn events(&mut self) -> Vec<u64> {
        self.say("stats");
        serde_json::from_str(&self.expect("stats")).expect("stats")
    }

    fn quit(mut self) {
        self.say("quit");
        let _ = self.child.wait();
    }
}

/// The child: starts every agent of `FLEET_DIR/agents` and answers the driver.
fn agents(strategy: &str) {
    let strategy = match strategy {
        "all" => OperationWatch::All,
        _ => OperationWatch::Selected,
    };
    let dir = PathBuf::from(std::env::var("FLEET_DIR").expect("FLEET_DIR"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        tracing_subscriber::fmt()
            .with_env_filter("warn")
            .with_writer(std::io::stderr)
            .init();
        let mut lines = BufReader::new(std::io::stdin()).lines();
        let mut next = move || lines.next().and_then(Result::ok).unwrap_or_default();
        println!("base");
        assert_eq!(next(), "start");
        let list = std::fs::read_to_string(dir.join("agents")).expect("the agent list");
        let started = Instant::now();
        let (mut counters, mut fleet) = (Vec::new(), Vec::new());
        for line in list.lines() {
            let (name, kubeconfig) = line.split_once(' ').expect("NAME KUBECONFIG");
            let client = client_from_kubeconfig(Path::new(kubeconfig))
                .await
                .expect("the agent's client");
            let config = DaemonConfig {
                node_name: name.to_owned(),
                tick: Duration::from_secs(2),
                operations: strategy,
                counters: Arc::new(WatchCounters::default()),
                etc: None,
                metrics: None,
                live_status: false,
                ..Default::default()
            };
            counters.push(config.counters.clone());
            let store = tempfile::tempdir_in(&dir).expect("the agent's directory");
            fleet.push(Agent::join_with(client, store, InstallMode::Host, config).await);
        }
        while !counters.iter().all(|c| c.synced()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        println!("synced {:.1}", started.elapsed().as_secs_f64());
        // Anything else ("quit", or the driver gone) ends the agents.
        while tokio::task::block_in_place(&mut next) == "stats" {
            let events: Vec<u64> = counters
                .iter()
                .map(|c| c.operation_events.load(Ordering::Relaxed))
                .collect();
            println!("stats {}", serde_json::to_string(&events).expect("json"));
        }
    });
    std::process::exit(0);
}
