//! `op create --wait`: a watch of the one object, printing each phase change until it is
//! terminal.

use super::api_message;
use crate::api::MachineOperation;
use crate::api::machine_operation::OperationPhase;
use crate::cli::{EXIT_TIMEOUT, Failure};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, ListSemantic};
use std::process::ExitCode;
use std::time::Duration;

/// Prints each phase change until the operation is terminal: 0 Complete, 1 Failed, 3 timeout.
pub(super) async fn follow(
    api: Api<MachineOperation>,
    name: &str,
    uid: Option<String>,
    timeout: Duration,
) -> Result<ExitCode, Failure> {
    let config = watcher::Config::default()
        .fields(&format!("metadata.name={name}"))
        .list_semantic(ListSemantic::MostRecent);
    let mut stream = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let deadline = tokio::time::Instant::now() + timeout;
    let gone = || {
        Failure::failed(format!(
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
            Ok(None) => return Err(Failure::failed("the watch ended unexpectedly")),
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
                    return Err(Failure::failed(format!(
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
pub(super) fn progress(op: &MachineOperation) -> (String, Option<u8>) {
    let status = op.status.as_ref();
    let message = status.and_then(|s| s.message.as_deref()).unwrap_or("");
    match status.and_then(|s| s.phase) {
        None | Some(OperationPhase::Pending) => ("Pending".into(), None),
        Some(OperationPhase::InProgress) => (format!("InProgress: {message}"), None),
        Some(OperationPhase::Unknown) => (
            format!("(a phase this version does not know): {message}"),
            None,
        ),
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
pub(crate) fn reason(op: &MachineOperation) -> Option<&str> {
    op.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Completed")
        .map(|c| c.reason.as_str())
        .filter(|r| !r.is_empty())
}
