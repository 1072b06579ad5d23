//! Pull progress: reported per MiB of each layer and once per finished layer.

use containerd_client::types::Descriptor;
use std::sync::Arc;

/// Progress of a pull's layer downloads (into the content store), reported to the
/// [`GrpcContainerd::with_progress`] callback: each time the bytes streamed pass a multiple
/// of [`PROGRESS_EVERY`] (1 MiB) and once per layer when it is in the content store (also for layers
/// that were there already). Counts are over all the layers of the platform manifest, so
/// `bytes_done` and `layers_done` never decrease during one pull and the last report of a
/// successful pull has `bytes_done == bytes_total` and `layers_done == layers_total`.
/// Config, manifest and index (small, fetched first) are not counted. Holds no reference,
/// registry address or URL: nothing that could carry a credential or a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullProgress {
    /// The layer the report is about (`sha256:…`, from the verified manifest).
    pub layer_digest: String,
    /// Bytes of all layers in the content store or streamed into it so far.
    pub bytes_done: u64,
    /// Sum of the layer sizes the manifest declares.
    pub bytes_total: u64,
    /// Layers complete in the content store.
    pub layers_done: usize,
    pub layers_total: usize,
}

/// A pull-progress callback; called on the pulling task, so it should be quick.
pub type ProgressFn = Arc<dyn Fn(PullProgress) + Send + Sync>;

/// Bytes of a layer between two progress reports.
pub const PROGRESS_EVERY: u64 = 1 << 20;

/// The default progress callback: a `tracing::info!` event each time a pull passes another
/// tenth of its bytes or finishes a layer (a node image's 120 MiB would be 120 lines a MiB).
pub(super) fn log_progress() -> ProgressFn {
    // (bytes_total, tenths, layers_done) last logged: a new pull starts below them.
    let last = std::sync::Mutex::new((0u64, 0u64, 0usize));
    Arc::new(move |p: PullProgress| {
        let tenths = (p.bytes_done * 10).checked_div(p.bytes_total).unwrap_or(10);
        let Ok(mut last) = last.lock() else { return };
        let (total, t, layers) = *last;
        let new_pull = total != p.bytes_total || tenths < t || p.layers_done < layers;
        if !new_pull && tenths == t && p.layers_done == layers {
            return;
        }
        *last = (p.bytes_total, tenths, p.layers_done);
        tracing::info!(
            layer = %p.layer_digest,
            bytes_done = p.bytes_done,
            bytes_total = p.bytes_total,
            layers_done = p.layers_done,
            layers_total = p.layers_total,
            "pull progress"
        );
    })
}

/// A sign of life from inside one long effect (a layer streamed into the content store or
/// unpacked into a machine's tree, per chunk): the daemon feeds systemd's watchdog and start
/// timeout with it (`src/reconcile/notify.rs`), so a slow pull or unpack is not mistaken for
/// a wedged agent. Called on the working task, often: it should be quick.
pub type Heartbeat = Arc<dyn Fn() + Send + Sync>;

#[derive(Clone)]
pub(super) struct HeartbeatSink(pub(super) Option<Heartbeat>);

impl HeartbeatSink {
    pub(super) fn beat(&self) {
        if let Some(f) = &self.0 {
            f();
        }
    }
}

impl std::fmt::Debug for HeartbeatSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HeartbeatSink")
    }
}

#[derive(Clone)]
pub(super) struct ProgressSink(pub(super) ProgressFn);

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProgressSink")
    }
}

/// Running totals of one pull's layer downloads.
pub(super) struct PullTracker {
    sink: ProgressFn,
    bytes_done: u64,
    bytes_total: u64,
    layers_done: usize,
    layers_total: usize,
    /// `bytes_done` when the current layer started.
    layer_base: u64,
    /// `bytes_done` at the last report.
    reported: u64,
}

impl PullTracker {
    pub(super) fn new(sink: ProgressFn, layers: &[Descriptor]) -> Self {
        Self {
            sink,
            bytes_done: 0,
            bytes_total: layers
                .iter()
                .map(|l| u64::try_from(l.size).unwrap_or(0))
                .sum(),
            layers_done: 0,
            layers_total: layers.len(),
            layer_base: 0,
            reported: 0,
        }
    }

    pub(super) fn report(&mut self, layer: &str) {
        self.reported = self.bytes_done;
        (self.sink)(PullProgress {
            layer_digest: layer.to_string(),
            bytes_done: self.bytes_done,
            bytes_total: self.bytes_total,
            layers_done: self.layers_done,
            layers_total: self.layers_total,
        });
    }

    /// `n` more bytes of `layer` were sent to the content store: a report each time the
    /// pull's total passes a multiple of [`PROGRESS_EVERY`] (however the network chunks it).
    pub(super) fn bytes(&mut self, layer: &str, n: usize) {
        self.bytes_done += n as u64;
        if self.bytes_done / PROGRESS_EVERY > self.reported / PROGRESS_EVERY {
            self.report(layer);
        }
    }

    /// `layer` is in the content store (streamed now or found there).
    pub(super) fn layer_done(&mut self, layer: &Descriptor) {
        self.layer_base += u64::try_from(layer.size).unwrap_or(0);
        self.bytes_done = self.layer_base;
        self.layers_done += 1;
        self.report(&layer.digest);
    }
}
