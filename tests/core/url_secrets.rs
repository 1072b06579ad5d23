//! Property tests: no input makes any message, log line or status contain the secret part of
//! a URL (its userinfo, query or fragment, as a WHATWG parser reads it). Arbitrary URLs with a
//! secret planted there — in spellings parsers disagree on (one slash, backslashes, no
//! slashes, upper-case schemes, tabs, surrounding blanks), in `oci://` references and archive
//! URLs — go through everything that renders them:
//!
//! - the validation's messages and the accepted targets' `Display`/`Debug`, the pure core's
//!   journal lines, effects and published results over a claim and the steps after it, and
//!   `flexnode op get`'s rendering (by the fuzz targets' own checks, `fuzz/src/`);
//! - a simulated node (`src/sim/`: the real executor and store) that joins, takes the
//!   upgrade, downloads or fails to, hands off and publishes: its results and status writes,
//!   the store's journal, `flexnode status`'s report, and every tracing log line;
//! - the `flexnode op create` binary, which validates before it contacts the cluster.
//!
//! A few seconds in all (a debug build).

use crate::fuzz::{archive_url, common, oci_ref, upgrade_params};

use common::{MARKER, secret_in};
use flexnode::lifecycle::agent::{Arch, InstallMode, redact_url};
use flexnode::lifecycle::table::BASE;
use flexnode::lifecycle::validate::{PARAM_SHA256, PARAM_URL, validate_upgrade};
use flexnode::sim::{Build, SimNode, upgrade};
use flexnode::store::StoreReader;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const HEX: &str = "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592";

#[derive(Clone, Copy, Debug)]
enum Place {
    User,
    Password,
    QueryValue,
    QueryKey,
    Fragment,
}

/// A URL with `secret` in its userinfo, query or fragment: `(raw, secret)`.
fn url_with_secret(schemes: &'static [&'static str]) -> impl Strategy<Value = (String, String)> {
    let secret = "[A-Za-z0-9]{8,16}".prop_map(|s| format!("{MARKER}{s}"));
    let place = prop::sample::select(vec![
        Place::User,
        Place::Password,
        Place::QueryValue,
        Place::QueryKey,
        Place::Fragment,
    ]);
    let separator = prop::sample::select(vec![
        "://", "://", "://", ":/", ":\\\\", ":", ":///", ":/\\",
    ]);
    let host = prop::sample::select(vec![
        "a.example",
        "127.0.0.1:8080",
        "registry.example:5000",
        "[::1]:5000",
        "localhost",
    ]);
    let path = "(/[a-z0-9._-]{1,8}){0,3}";
    let extra = "(&[a-z]{1,4}=[a-z0-9]{0,6}){0,2}";
    let blank = prop::sample::select(vec!["", "", " ", "\t"]);
    (
        secret,
        place,
        prop::sample::select(schemes.to_vec()),
        separator,
        host,
        path,
        extra,
        blank,
        any::<bool>(),
    )
        .prop_map(
            |(secret, place, scheme, sep, host, path, extra, blank, tab)| {
                // A tab inside the secret: WHATWG parsers drop it, so it is the same secret.
                let planted = if tab {
                    format!("{}\t{}", &secret[..4], &secret[4..])
                } else {
                    secret.clone()
                };
                let (userinfo, query, fragment) = match place {
                    Place::User => (format!("{planted}@"), String::new(), String::new()),
                    Place::Password => (format!("u:{planted}@"), String::new(), String::new()),
                    Place::QueryValue => (
                        String::new(),
                        format!("?sig={planted}{extra}"),
                        String::new(),
                    ),
                    Place::QueryKey => {
                        (String::new(), format!("?{planted}=1{extra}"), String::new())
                    }
                    Place::Fragment => {
                        (String::new(), format!("?x=1{extra}"), format!("#{planted}"))
                    }
                };
                let raw =
                    format!("{blank}{scheme}{sep}{userinfo}{host}{path}{query}{fragment}{blank}");
                (raw, secret)
            },
        )
}

const ANY_SCHEME: &[&str] = &[
    "https", "http", "HTTPS", "Http", "oci", "OCI", "ftp", "file",
];

fn params(url: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (PARAM_URL.to_string(), url.to_string()),
        (PARAM_SHA256.to_string(), HEX.to_string()),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Validation, the accepted targets, the pure core's steps and `flexnode op get`.
    #[test]
    fn no_message_or_rendering_shows_a_url_secret((raw, secret) in url_with_secret(ANY_SCHEME)) {
        let hidden = secret_in(&raw);
        for mode in [InstallMode::Host, InstallMode::Container] {
            let shown = match validate_upgrade(mode, Arch::Amd64, &params(&raw)) {
                Err(e) => format!("{e} {e:?}"),
                Ok(target) => format!("{target} {target:?}"),
            };
            prop_assert!(!hidden || !shown.contains(&secret), "{}: {}", raw, shown);
        }
        prop_assert!(!hidden || !redact_url(&raw).contains(&secret), "{}", redact_url(&raw));
        // The fuzz targets' checks: the same properties, and the core's steps after a claim.
        for flags in ["h", "c"] {
            upgrade_params::check(format!("{flags}\n{raw}\n{HEX}\n").as_bytes(), std::path::Path::new("."));
        }
        archive_url::check(format!("{raw}\n/next?sig=1").as_bytes(), std::path::Path::new("."));
        oci_ref::check(raw.as_bytes(), std::path::Path::new("."));
    }
}

/// A tracing subscriber's output, kept in memory.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}

/// Everything a simulated node shows after it took an upgrade from `raw`: results, status
/// writes, calls, the journal, `flexnode status` (human and JSON) and the log lines (text,
/// JSON and the journald entries with their fields, every level).
fn simulated_node(raw: &str, mode: InstallMode, served: bool) -> String {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("state/state.db");
    let logs = Logs::default();
    let json_logs = Logs::default();
    let journal = Logs::default();
    use tracing_subscriber::layer::SubscriberExt;
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(logs.clone())
                .with_ansi(false),
        )
        .with(
            tracing_subscriber::fmt::layer()
                .json()
                .with_writer(json_logs.clone()),
        )
        // What the journal would get: MESSAGE and every field.
        .with(flexnode::log::Journal({
            let sink = journal.clone();
            move |entry: &flexnode::log::Entry| {
                let line = format!("{entry:?}\n");
                sink.0
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend_from_slice(line.as_bytes());
            }
        }))
        .with(tracing_subscriber::filter::LevelFilter::TRACE);
    let mut node = SimNode::new(&path, BASE);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    tracing::subscriber::with_default(subscriber, || {
        rt.block_on(async {
            let v2 = Build {
                version: "0.2.0".into(),
                crashes: false,
            };
            if served {
                // Served where the agent downloads from: the URL as validation accepted it.
                if let Ok(flexnode::lifecycle::agent::UpgradeTarget::Archive { url, .. }) =
                    validate_upgrade(InstallMode::Host, Arch::Amd64, &params(raw))
                {
                    node.host.serve_artifact(url.expose(), HEX, v2.clone());
                }
                node.host.serve_image(HEX, v2);
            }
            node.join(mode, "edge-07").await.expect("join");
            node.boot().await.expect("boot");
            node.claim("u1", upgrade(raw, HEX)).await.expect("claim");
            node.settle().await.expect("settle");
            node.stop_process();
        });
    });
    let mut shown = format!("{:?}", node.host.results());
    {
        let w = node.host.world();
        shown.push_str(&format!("{:?} {:?}", w.api, w.calls));
    }
    let reader = StoreReader::open(&path).expect("open the store");
    shown.push_str(&format!("{:?}", reader.journal(1000).expect("journal")));
    let report = flexnode::status_report::build(&reader).expect("status");
    shown.push_str(&flexnode::status_report::render_human(&report));
    shown.push_str(&serde_json::to_string(&report).expect("json"));
    shown.push_str(&logs.text());
    shown.push_str(&json_logs.text());
    shown.push_str(&journal.text());
    assert!(logs.text().contains("transition"), "the logs were captured");
    assert!(
        journal.text().contains("FLEXNODE_OPERATION"),
        "the journal entries were captured"
    );
    shown
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The simulated node, host and container install, download served or not.
    #[test]
    fn a_simulated_node_never_shows_a_url_secret(
        (raw, secret) in url_with_secret(&["https", "http", "HTTPS", "oci"]),
        served in any::<bool>(),
    ) {
        let mode = if raw.to_ascii_lowercase().contains("oci:") {
            InstallMode::Container
        } else {
            InstallMode::Host
        };
        let shown = simulated_node(&raw, mode, served);
        prop_assert!(!secret_in(&raw) || !shown.contains(&secret), "{}: {}", raw, shown);
    }
}

/// `flexnode op create` refuses or tries the (unreachable) API server: neither message
/// shows the secret.
#[test]
fn op_create_never_shows_a_url_secret() {
    let dir = tempfile::tempdir().expect("tmp");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\n\
         current-context: x\n",
    )
    .expect("write");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(24));
    let strategy = url_with_secret(&["https", "http", "oci"]);
    let hidden = std::sync::atomic::AtomicUsize::new(0);
    runner
        .run(&strategy, |(raw, secret)| {
            let (flag, digest_flag, digest) = if raw.contains("oci:") {
                ("--image", "--digest", format!("sha256:{HEX}"))
            } else {
                ("--url", "--sha256", HEX.to_string())
            };
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_flexnode"))
                .args([
                    "op",
                    "create",
                    "upgrade",
                    "--node",
                    "n1",
                    flag,
                    &raw,
                    digest_flag,
                    &digest,
                ])
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .output()
                .expect("run flexnode");
            prop_assert!(!out.status.success(), "{:?}", out);
            let all = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if secret_in(&raw) {
                hidden.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                prop_assert!(!all.contains(&secret), "{}: {}", raw, all);
            }
            Ok(())
        })
        .expect("no secret shown");
    assert!(
        hidden.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "no case planted a secret the parser sees"
    );
}
