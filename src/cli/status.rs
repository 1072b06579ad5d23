//! `flexnode status` and `flexnode history`: read the store directly, so they work while the
//! daemon is stopped (and while it runs: the store has one writer and any number of readers).
//! Status also looks, without writing anything, at what the agent needs around the store — the
//! configuration, the store's and `/etc`'s filesystems — and a store it cannot read is
//! explained, with what to do, instead of shown (src/lifecycle/fault.rs).

use super::{EXIT_NO_STORE, Output, json, wiring, yaml};
use crate::config::CONFIG_PATH;
use crate::config::Config;
use crate::effects::AGENT_UNIT;
use crate::lifecycle::fault::{Fault, FaultKind, Problem};
use crate::lifecycle::time::Timestamp;
use crate::status_report::{self, HistoryReport, StatusReport};
use crate::store::fault::{environment, of_store};
use crate::store::{StoreError, StoreReader};
use std::path::Path;
use std::process::ExitCode;

pub fn status(state: &Path, output: Output) -> ExitCode {
    read(state, output, |reader| {
        let mut report = status_report::build(reader)?;
        report.problems = problems(state, report.node.is_some());
        report.daemon = crate::reconcile::status_socket::ask(state);
        Ok(render(&report, output))
    })
}

pub fn history(state: &Path, limit: i64, output: Output) -> ExitCode {
    read(state, output, |reader| {
        let entries = reader.journal(limit.max(1))?;
        Ok(match output {
            Output::Human => entries
                .iter()
                .map(|e| status_report::journal_line(e) + "\n")
                .collect(),
            Output::Json => json(&HistoryReport::new(entries)),
            Output::Yaml => yaml(&HistoryReport::new(entries)),
        })
    })
}

fn render(report: &StatusReport, output: Output) -> String {
    match output {
        Output::Human => status_report::render_human(report),
        Output::Json => json(report),
        Output::Yaml => yaml(report),
    }
}

/// What a look around finds wrong for a joined node: its configuration, the agent's
/// certificate, and the store's and `/etc`'s filesystems.
fn problems(state: &Path, joined: bool) -> Vec<Problem> {
    let mut found = environment(state, &wiring::on_host("/etc"));
    if joined {
        match Config::installed(&wiring::on_host(CONFIG_PATH), "") {
            Err(fault) => found.push(fault),
            Ok(config) => found.extend(expired(&config.kubeconfig.to_string_lossy())),
        }
    }
    found.iter().map(Fault::problem).collect()
}

/// The agent's certificate, when it has expired: the daemon replaces it through the bootstrap
/// token when it starts, and stops with this fault when the token cannot.
fn expired(kubeconfig: &str) -> Option<Fault> {
    let cert = crate::identity::credential::certificate_in(&wiring::on_host(kubeconfig))?;
    (crate::identity::unix_now() >= cert.not_after).then(|| {
        Fault::new(
            FaultKind::CertificateExpired,
            Path::new(kubeconfig),
            format!(
                "it expired at {}",
                Timestamp::from_millis(cert.not_after.saturating_mul(1000)).rfc3339()
            ),
        )
    })
}

fn read(
    path: &Path,
    output: Output,
    render_with: impl FnOnce(&StoreReader) -> Result<String, StoreError>,
) -> ExitCode {
    let result = StoreReader::open(path).and_then(|reader| render_with(&reader));
    let e = match result {
        Ok(text) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => e,
    };
    let installed = wiring::on_host(&format!("/etc/systemd/system/{AGENT_UNIT}")).exists();
    let fault = match &e {
        // No store on a host the agent is not installed on: nothing joined yet.
        StoreError::Missing(_) if !installed => None,
        e => of_store(e, path),
    };
    let code = match &e {
        StoreError::Missing(_) => ExitCode::from(EXIT_NO_STORE),
        _ => ExitCode::FAILURE,
    };
    let Some(fault) = fault else {
        eprintln!("flexnode: {e}");
        return code;
    };
    eprintln!("flexnode: {fault}");
    print!("{}", render(&unreadable(&fault), output));
    code
}

/// The report of a store that cannot be read: no state (it would be a guess), the problem.
fn unreadable(fault: &Fault) -> StatusReport {
    let mut r = StatusReport::unknown();
    r.problems = vec![fault.problem()];
    r
}
