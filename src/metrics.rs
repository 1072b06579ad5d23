//! The daemon's Prometheus metrics (`flexnode_…`, served by `src/reconcile/metrics_server.rs` when
//! the configuration names an address). One registry per process, so each layer records
//! where the event happens — the executor its transitions, the store its commits, the watches
//! their reconnects, the status writer its API contact — without a handle threaded through.
//! Label values come from closed sets (kinds, reasons, the transition table's states and
//! inputs, the watches' names): never from an object's name or a message.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};
use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    kind: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    from: String,
    input: String,
    to: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchLabels {
    watch: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    decision: String,
    reason: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

struct Metrics {
    registry: Registry,
    operations: Family<OperationLabels, Counter>,
    transitions: Histograms<TransitionLabels>,
    reconnects: Family<WatchLabels, Counter>,
    commits: Histogram,
    api_contact: Gauge<f64, AtomicU64>,
    decisions: Family<DecisionLabels, Counter>,
}

/// From 1 ms to about 9 minutes: a store commit is milliseconds, a repave's step minutes.
fn seconds_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 4.0, 10))
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::with_prefix("flexnode");
        let operations = Family::default();
        registry.register(
            "operations",
            "MachineOperations this process published a terminal result for, by kind and reason",
            operations.clone(),
        );
        let transitions: Histograms<TransitionLabels> =
            Family::new_with_constructor(seconds_buckets);
        registry.register_with_unit(
            "transition_duration",
            "Time from a transition's intent to its recorded outcome, by the transition table's \
             from-state, input and to-state",
            Unit::Seconds,
            transitions.clone(),
        );
        let reconnects = Family::default();
        registry.register(
            "watch_reconnects",
            "Watches that listed again after an interruption (the API server away, a broken \
             stream)",
            reconnects.clone(),
        );
        let commits = seconds_buckets();
        registry.register_with_unit(
            "store_commit_duration",
            "Time to commit a step's transaction to the state store",
            Unit::Seconds,
            commits.clone(),
        );
        let api_contact = Gauge::default();
        registry.register_with_unit(
            "last_api_contact_timestamp",
            "When the API server last answered (a list, a watch event, a status write), as \
             Unix time",
            Unit::Seconds,
            api_contact.clone(),
        );
        let decisions = Family::default();
        registry.register(
            "approver_decisions",
            "Certificate requests for an agent identity that `flexnode approver` approved or \
             denied, by decision and reason (src/identity/rules.rs)",
            decisions.clone(),
        );
        Metrics {
            registry,
            decisions,
            operations,
            transitions,
            reconnects,
            commits,
            api_contact,
        }
    })
}

/// A terminal result was published for an operation of `kind`.
pub fn operation_finished(kind: &str, reason: &str) {
    metrics()
        .operations
        .get_or_create(&OperationLabels {
            kind: kind.to_string(),
            reason: reason.to_string(),
        })
        .inc();
}

/// A transition of the table ran its effects in `seconds`.
pub fn transition(from: &str, input: &str, to: &str, seconds: f64) {
    metrics()
        .transitions
        .get_or_create(&TransitionLabels {
            from: from.to_string(),
            input: input.to_string(),
            to: to.to_string(),
        })
        .observe(seconds);
}

/// The watch `watch` listed again after an interruption.
pub fn watch_reconnected(watch: &str) {
    metrics()
        .reconnects
        .get_or_create(&WatchLabels {
            watch: watch.to_string(),
        })
        .inc();
}

pub fn store_committed(seconds: f64) {
    metrics().commits.observe(seconds);
}

/// The API server answered now.
pub fn api_contact() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    metrics().api_contact.set(now);
}

/// The approver decided a certificate request (`Approved` or `Denied`) for `reason`.
pub fn approver_decided(decision: &str, reason: &str) {
    metrics()
        .decisions
        .get_or_create(&DecisionLabels {
            decision: decision.to_string(),
            reason: reason.to_string(),
        })
        .inc();
}

/// The Prometheus text format (0.0.4) of every metric.
pub fn render() -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &metrics().registry);
    out
}

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_conventions() {
        operation_finished("NodeReboot", "Succeeded");
        transition("Ready", "OperationClaimed", "Rebooting", 0.2);
        watch_reconnected("own");
        store_committed(0.003);
        api_contact();
        let text = render();
        for line in [
            "# TYPE flexnode_operations_total counter",
            "flexnode_operations_total{kind=\"NodeReboot\",reason=\"Succeeded\"} ",
            "# TYPE flexnode_transition_duration_seconds histogram",
            "flexnode_transition_duration_seconds_count{from=\"Ready\",input=\"OperationClaimed\",to=\"Rebooting\"} ",
            "flexnode_watch_reconnects_total{watch=\"own\"} ",
            "flexnode_store_commit_duration_seconds_count ",
            "# TYPE flexnode_last_api_contact_timestamp_seconds gauge",
        ] {
            // Other tests of this process record too: counts are at least one.
            assert!(
                text.lines().any(|l| l.starts_with(line)),
                "{line:?} not in:\n{text}"
            );
        }
    }
}
