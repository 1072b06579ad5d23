//! Where the process's log lines go: to the journal with structured fields when systemd
//! connected stderr to it, else as text on stderr.
//!
//! Under systemd every event becomes one journal entry whose MESSAGE is the same text as on
//! a terminal (`transition from=… to=…`, which operators and the labs read) and whose fields
//! are also journal fields, `FLEXNODE_<FIELD>`: `journalctl FLEXNODE_OPERATION=reboot-1`
//! finds one operation's lines (docs/cli.md, "The journal"). `tracing-journald` was the
//! first choice, but it writes only the bare message as MESSAGE, which would drop the
//! `key=value` text from every plain `journalctl` view; libsystemd sends what we format.

pub use libsystemd::logging::Priority;
use std::fmt::Write as _;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{DefaultFields, FormatFields, Writer};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry};

/// The prefix of every field this process adds to its journal entries.
const FIELD_PREFIX: &str = "FLEXNODE_";

/// When this process began logging (just after its arguments were parsed).
static STARTED: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();

/// How long since [`init`]: the daemon's first line reports its own start-up with it, so a
/// hand-off's start splits into systemd's part and the daemon's (docs/benchmarks.md).
pub fn since_start() -> std::time::Duration {
    STARTED.get().map(|t| t.elapsed()).unwrap_or_default()
}

/// Installs the process's subscriber; `level` applies unless `RUST_LOG` says otherwise.
pub fn init(level: &str) {
    let _ = STARTED.set(std::time::Instant::now());
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    if libsystemd::logging::connected_to_journal() {
        Registry::default().with(filter).with(Journal(send)).init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            // Pipes get plain text; colours only on a terminal.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init();
    }
}

/// One journal entry: MESSAGE, PRIORITY and the other fields.
#[derive(Debug)]
pub struct Entry {
    pub priority: Priority,
    pub message: String,
    pub fields: Vec<(String, String)>,
}

/// Makes each event an [`Entry`] and hands it to its sink: journald in the daemon, a buffer
/// in tests (`tests/core/url_secrets.rs` reads what the journal would get).
pub struct Journal<F>(pub F);

impl<S: Subscriber, F: Fn(&Entry) + Send + Sync + 'static> Layer<S> for Journal<F> {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut message = String::new();
        // Formatting into a String cannot fail.
        let _ = DefaultFields::new().format_fields(Writer::new(&mut message), event);
        let meta = event.metadata();
        let mut fields = Fields(vec![
            ("SYSLOG_IDENTIFIER".to_string(), "flexnode".to_string()),
            ("TARGET".to_string(), meta.target().to_string()),
        ]);
        event.record(&mut fields);
        (self.0)(&Entry {
            priority: priority(meta.level()),
            message,
            fields: fields.0,
        });
    }
}

/// Sends over journald's native protocol; an entry it refuses (the journal went away)
/// still reaches it over the stream, as text.
fn send(entry: &Entry) {
    let pairs = entry.fields.iter().map(|(k, v)| (k, v));
    if libsystemd::logging::journal_send(entry.priority, &entry.message, pairs).is_err() {
        eprintln!("{}", entry.message);
    }
}

fn priority(level: &Level) -> Priority {
    match *level {
        Level::ERROR => Priority::Error,
        Level::WARN => Priority::Warning,
        Level::INFO => Priority::Info,
        Level::DEBUG | Level::TRACE => Priority::Debug,
    }
}

/// An event's fields other than its message, as journal fields.
struct Fields(Vec<(String, String)>);

impl Fields {
    fn push(&mut self, field: &Field, value: String) {
        if field.name() != "message" {
            self.0.push((journal_name(field.name()), value));
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, value.to_string());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let mut text = String::new();
        let _ = write!(text, "{value:?}");
        self.push(field, text);
    }
}

/// `operation_uid` → `FLEXNODE_OPERATION_UID`: journal field names are upper-case letters,
/// digits and `_`.
fn journal_name(field: &str) -> String {
    let mut name = String::from(FIELD_PREFIX);
    name.extend(field.chars().map(|c| {
        if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        }
    }));
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_are_valid_journal_names() {
        assert_eq!(journal_name("operation_uid"), "FLEXNODE_OPERATION_UID");
        assert_eq!(journal_name("r#type"), "FLEXNODE_R_TYPE");
        assert_eq!(journal_name("a.b"), "FLEXNODE_A_B");
    }
}
