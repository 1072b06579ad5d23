//! `flexnode approver`: the in-cluster controller that decides the certificate requests for
//! an agent identity (src/identity/rules.rs) — approved when the requester may have that one
//! node's identity, denied with the reason on the request otherwise — and says each decision
//! as an Event and in its metrics. Requests for no agent identity (the kubelets') are left to
//! their own approvers; a decided request is never decided again.

use crate::identity::rules::{Request, Verdict, judge};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// Who the Events say decided.
const CONTROLLER: &str = "flexnode-approver";

struct Context {
    api: Api<CertificateSigningRequest>,
    recorder: Recorder,
}

#[derive(Debug, thiserror::Error)]
#[error("deciding {name}: {source}")]
pub struct DecideError {
    name: String,
    source: kube::Error,
}

fn decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied")
        })
}

/// Decides every request as it appears, until the future is dropped.
pub async fn run(client: kube::Client) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let context = Arc::new(Context {
        api: api.clone(),
        recorder: Recorder::new(
            client,
            Reporter {
                controller: CONTROLLER.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        ),
    });
    tracing::info!("approver: deciding certificate requests for agent identities");
    Controller::new(api, watcher::Config::default())
        .run(decide, retry, context)
        .for_each(|result| async move {
            if let Err(e) = result {
                tracing::warn!(error = %e, "approver: a request was not decided; it is tried again");
            }
        })
        .await;
}

fn retry(_: Arc<CertificateSigningRequest>, _: &DecideError, _: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

async fn decide(
    csr: Arc<CertificateSigningRequest>,
    cx: Arc<Context>,
) -> Result<Action, DecideError> {
    if decided(&csr) {
        return Ok(Action::await_change());
    }
    let spec = &csr.spec;
    let verdict = judge(&Request {
        signer: &spec.signer_name,
        username: spec.username.as_deref().unwrap_or_default(),
        groups: spec.groups.as_deref().unwrap_or_default(),
        usages: spec.usages.as_deref().unwrap_or_default(),
        pem: &spec.request.0,
    });
    let (type_, reason, message) = match verdict {
        Verdict::NotOurs => return Ok(Action::await_change()),
        Verdict::Approve { reason, message } => ("Approved", reason, message),
        Verdict::Deny { reason, message } => ("Denied", reason, message),
    };
    let name = csr.name_any();
    let fail = |source| DecideError {
        name: name.clone(),
        source,
    };
    let condition = CertificateSigningRequestCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message.clone()),
        last_update_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        ..Default::default()
    };
    let patch = serde_json::json!({"status": {"conditions": [condition]}});
    cx.api
        .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(fail)?;
    crate::metrics::approver_decided(type_, reason);
    tracing::info!(request = %name, decision = type_, reason, requester = spec.username.as_deref().unwrap_or_default(), "approver: {message}");
    let event = Event {
        type_: if type_ == "Approved" {
            EventType::Normal
        } else {
            EventType::Warning
        },
        reason: type_.into(),
        note: Some(format!("{reason}: {message}")),
        action: "Decide".into(),
        secondary: None,
    };
    // The decision stands without its Event.
    if let Err(e) = cx.recorder.publish(&event, &csr.object_ref(&())).await {
        tracing::warn!(request = %name, error = %e, "approver: Event not recorded");
    }
    Ok(Action::await_change())
}
