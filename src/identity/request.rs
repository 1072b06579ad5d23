//! Asking the cluster for the agent's certificate: a CertificateSigningRequest named after
//! the key (sent again after a crash, it is found, not made twice), then its approval and
//! issuance watched, with progress while it waits.

use super::SIGNER;
use super::csr::{AgentKey, CsrError, Issued};
use super::rules::Parsed;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::wait::await_condition;
use std::time::{Duration, Instant};

/// How often a wait says it still waits.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("the cluster denied the certificate request {name} ({reason}): {message}")]
    Denied {
        name: String,
        reason: String,
        message: String,
    },
    #[error("the signer failed the certificate request {name} ({reason}): {message}")]
    Failed {
        name: String,
        reason: String,
        message: String,
    },
    #[error(
        "the certificate request {name} was not approved within {} s: run the approver \
         (`kubectl apply -k manifests/approver`, `flexnode approver`), or approve it by hand \
         (`kubectl certificate approve {name}`)", waited.as_secs()
    )]
    NotApproved { name: String, waited: Duration },
    #[error(
        "the certificate request {name} was approved but no certificate was issued within {} s: \
         the cluster's signer for {SIGNER} does not sign (kube-controller-manager \
         --cluster-signing-cert-file and --cluster-signing-key-file)", waited.as_secs()
    )]
    NotIssued { name: String, waited: Duration },
    #[error("the certificate request {name} exists for another key")]
    Taken { name: String },
    #[error("the issued certificate of {name}: {why}")]
    BadCertificate { name: String, why: String },
    #[error(transparent)]
    Csr(#[from] CsrError),
    #[error("the API server: {}", crate::config::kubeconfig::api_message(.0))]
    Api(#[from] kube::Error),
    #[error("watching the certificate request: {0}")]
    Watch(String),
}

impl RequestError {
    /// The credential that sent it was refused (401: an expired, deleted or mistyped token),
    /// or may not send requests (403).
    pub fn refused(&self) -> bool {
        matches!(self, RequestError::Api(kube::Error::Api(s)) if s.code == 401 || s.code == 403)
    }
}

/// Where a wait stands, for the terminal.
pub enum Progress<'a> {
    Sent {
        name: &'a str,
    },
    Waiting {
        name: &'a str,
        approved: bool,
        waited: Duration,
    },
}

/// The request's name for `node` and `key`.
pub fn name(node: &str, key: &AgentKey) -> String {
    let node: String = node.chars().take(200).collect();
    format!("flexnode-{node}-{}", &key.fingerprint()[..16])
}

fn condition(csr: &CertificateSigningRequest, type_: &str) -> Option<(String, String)> {
    csr.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

fn issued(csr: &CertificateSigningRequest) -> Option<&[u8]> {
    let cert = csr.status.as_ref()?.certificate.as_ref()?;
    (!cert.0.is_empty()).then_some(cert.0.as_slice())
}

/// The certificate for `node`'s identity and `key`, asked of the cluster through `client`
/// (a bootstrap token's, or the agent's own when it renews), waiting at most `limit`.
pub async fn obtain(
    client: &kube::Client,
    node: &str,
    key: &AgentKey,
    expiration_seconds: Option<i32>,
    limit: Duration,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<(String, Issued), RequestError> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let name = name(node, key);
    let request = ByteString(key.request(node)?.into_bytes());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request,
            signer_name: SIGNER.into(),
            usages: Some(vec!["digital signature".into(), "client auth".into()]),
            expiration_seconds,
            ..Default::default()
        },
        status: None,
    };
    match api.create(&PostParams::default(), &csr).await {
        Ok(_) => {}
        // Sent before a crash: the same key makes the same name.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let found = api.get(&name).await?;
            // Ours if it asks for this key (a signature differs each time it is made).
            let theirs = Parsed::from_pem(&found.spec.request.0).map(|p| p.public_key);
            if theirs.as_deref() != Some(key.public_key()) {
                return Err(RequestError::Taken { name });
            }
        }
        Err(e) => return Err(e.into()),
    }
    progress(Progress::Sent { name: &name });
    let started = Instant::now();
    let watched = name.clone();
    let done = await_condition(
        api.clone(),
        &watched,
        |o: Option<&CertificateSigningRequest>| {
            o.is_some_and(|c| {
                issued(c).is_some()
                    || condition(c, "Denied").is_some()
                    || condition(c, "Failed").is_some()
            })
        },
    );
    tokio::pin!(done);
    let every = PROGRESS_EVERY.min(limit);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    let got = loop {
        tokio::select! {
            got = &mut done => break got.map_err(|e| RequestError::Watch(e.to_string()))?,
            _ = tick.tick() => {
                let waited = started.elapsed();
                let approved = api
                    .get_opt(&name)
                    .await?
                    .is_some_and(|c| condition(&c, "Approved").is_some());
                progress(Progress::Waiting { name: &name, approved, waited });
                if waited >= limit {
                    return Err(if approved {
                        RequestError::NotIssued { name, waited }
                    } else {
                        RequestError::NotApproved { name, waited }
                    });
                }
            }
        }
    };
    let Some(csr) = got else {
        return Err(RequestError::Failed {
            name,
            reason: "Deleted".into(),
            message: "the request was deleted before a certificate was issued".into(),
        });
    };
    if let Some((reason, message)) = condition(&csr, "Denied") {
        return Err(RequestError::Denied {
            name,
            reason,
            message,
        });
    }
    if let Some((reason, message)) = condition(&csr, "Failed") {
        return Err(RequestError::Failed {
            name,
            reason,
            message,
        });
    }
    let pem = issued(&csr).unwrap_or_default();
    let cert = Issued::from_pem(pem).map_err(|e| RequestError::BadCertificate {
        name: name.clone(),
        why: e.to_string(),
    })?;
    if !key.matches(&cert) || cert.common_name != super::agent_user(node) {
        return Err(RequestError::BadCertificate {
            name,
            why: format!(
                "it is not for this key and {} (common name {:?})",
                super::agent_user(node),
                cert.common_name
            ),
        });
    }
    Ok((String::from_utf8_lossy(pem).into_owned(), cert))
}
