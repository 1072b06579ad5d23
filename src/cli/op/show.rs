//! `op list` and `op get`: operations as kubectl shows them, with every URL redacted and
//! kubectl's last-applied copy of the spec and managedFields left out.

use super::follow::reason;
use super::{REDACTED, api_failure, unix_now};
use crate::api::MachineOperation;
use crate::api::machine_operation::{MachineOperationSpec, OperationPhase};
use crate::cli::{Failure, Output};
use crate::lifecycle::agent::redact_url;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::api::{Api, ListParams};
use std::process::ExitCode;

pub(super) async fn list(
    api: Api<MachineOperation>,
    node: Option<&str>,
    output: Output,
) -> Result<ExitCode, Failure> {
    let mut lp = ListParams::default();
    if let Some(node) = node {
        lp = lp.fields(&format!("spec.machineRef={node}"));
    }
    let items = api.list(&lp).await.map_err(|e| api_failure(&e))?.items;
    if output != Output::Human {
        // kubectl's shape for a list of objects, each redacted as `op get` shows it.
        let items = items.iter().map(redacted).collect::<Result<Vec<_>, _>>()?;
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        print!("{}", render(&list, output)?);
        return Ok(ExitCode::SUCCESS);
    }
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

pub(super) fn table<const N: usize>(rows: &[[String; N]]) -> String {
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

pub(super) fn phase_name(op: &MachineOperation) -> &'static str {
    match op.status.as_ref().and_then(|s| s.phase) {
        None | Some(OperationPhase::Pending) => "Pending",
        Some(OperationPhase::InProgress) => "InProgress",
        Some(OperationPhase::Complete) => "Complete",
        Some(OperationPhase::Failed) => "Failed",
        Some(OperationPhase::Unknown) => "Unknown",
    }
}

/// The machine name, or the selector as `selector:k=v,…`.
pub(super) fn target(spec: &MachineOperationSpec) -> String {
    match (&spec.machine_ref, &spec.machine_selector) {
        (Some(m), _) => m.clone(),
        (None, Some(sel)) => format!("selector:{}", selector_string(sel)),
        (None, None) => "<none>".into(),
    }
}

pub(super) fn selector_string(sel: &LabelSelector) -> String {
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
pub(super) fn age(now: u64, t: &Time) -> String {
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

pub(super) async fn get(
    api: Api<MachineOperation>,
    name: &str,
    output: Output,
) -> Result<ExitCode, Failure> {
    let op = match api.get_opt(name).await {
        Ok(Some(op)) => op,
        Ok(None) => {
            return Err(Failure::failed(format!(
                "machineoperation \"{name}\" not found"
            )));
        }
        Err(e) => return Err(api_failure(&e)),
    };
    let text = match output {
        Output::Human => human(&op),
        Output::Json | Output::Yaml => render(&redacted(&op)?, output)?,
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

fn render(v: &serde_json::Value, output: Output) -> Result<String, Failure> {
    match output {
        Output::Yaml => serde_saphyr::to_string(v)
            .map_err(|e| Failure::failed(format!("cannot render YAML: {e}"))),
        Output::Json | Output::Human => serde_json::to_string_pretty(v)
            .map(|s| s + "\n")
            .map_err(|e| Failure::failed(format!("cannot render JSON: {e}"))),
    }
}

/// `op get`'s human form. Public for the property tests of secrets (`tests/core/url_secrets.rs`).
pub fn human(op: &MachineOperation) -> String {
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
/// Public for the fuzz targets and the property tests of secrets (`tests/core/url_secrets.rs`).
pub fn redacted(op: &MachineOperation) -> Result<serde_json::Value, Failure> {
    let mut v = serde_json::to_value(op)
        .map_err(|e| Failure::failed(format!("cannot render the object: {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let t = |secs: i64| Time(k8s_openapi::jiff::Timestamp::from_second(secs).expect("ts"));
        assert_eq!(age(1000, &t(1000 - 5)), "5s");
        assert_eq!(age(1000, &t(1000 - 150)), "2m30s");
        assert_eq!(age(100_000, &t(100_000 - 3600 * 5)), "5h");
        assert_eq!(age(1_000_000, &t(1_000_000 - 86_400 * 3)), "3d");
    }
}
