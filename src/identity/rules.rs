//! Which certificate requests the approver approves: exactly those that ask for one agent's
//! identity in its one shape, from a requester that may have that identity — a bootstrap
//! token bound to that node, or the node's agent renewing itself. A leaked token mints one
//! node's identity, not the fleet's. Everything else that asks for an agent identity is
//! denied, with the reason on the request; what asks for none is not the approver's.

use super::{AGENT_GROUP, AGENT_USER_PREFIX, BOOTSTRAP_USER_PREFIX, BOUND_GROUP_PREFIX, SIGNER};
use super::{agent_user, node_of};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

/// A CertificateSigningRequest as the approver reads it; `username` and `groups` are the
/// requester's, which the API server sets.
pub struct Request<'a> {
    pub signer: &'a str,
    pub username: &'a str,
    pub groups: &'a [String],
    pub usages: &'a [String],
    pub pem: &'a [u8],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It asks for no agent identity.
    NotOurs,
    Approve {
        reason: &'static str,
        message: String,
    },
    Deny {
        reason: &'static str,
        message: String,
    },
}

/// The usages an agent's certificate may have; `client auth` it must.
const USAGES: [&str; 3] = ["client auth", "digital signature", "key encipherment"];

/// The key kinds and sizes accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyKind {
    EcdsaP256,
    EcdsaP384,
    Ed25519,
    Rsa(usize),
    Other(String),
}

impl KeyKind {
    fn allowed(&self) -> bool {
        match self {
            KeyKind::EcdsaP256 | KeyKind::EcdsaP384 | KeyKind::Ed25519 => true,
            KeyKind::Rsa(bits) => (2048..=8192).contains(bits),
            KeyKind::Other(_) => false,
        }
    }
}

/// What a PEM certificate request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub common_names: Vec<String>,
    pub organizations: Vec<String>,
    /// Subject attributes other than CN and O, by OID.
    pub other_subject: Vec<String>,
    /// Extensions requested (alternative names, constraints, …): an agent asks for none.
    pub extensions: usize,
    pub alternative_names: usize,
    pub key: KeyKind,
    /// The subject public key's bits.
    pub public_key: Vec<u8>,
}

const OID_CN: &str = "2.5.4.3";
const OID_O: &str = "2.5.4.10";
const OID_EC: &str = "1.2.840.10045.2.1";
const OID_P256: &str = "1.2.840.10045.3.1.7";
const OID_P384: &str = "1.3.132.0.34";
const OID_ED25519: &str = "1.3.101.112";

impl Parsed {
    pub fn from_pem(pem: &[u8]) -> Option<Self> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem).ok()?;
        if block.label != "CERTIFICATE REQUEST" {
            return None;
        }
        let (_, req) = X509CertificationRequest::from_der(&block.contents).ok()?;
        let info = &req.certification_request_info;
        let (mut common_names, mut organizations, mut other_subject) = (vec![], vec![], vec![]);
        for attr in info.subject.iter_attributes() {
            let oid = attr.attr_type().to_id_string();
            let value = attr.as_str().map(str::to_string).unwrap_or_default();
            match oid.as_str() {
                OID_CN => common_names.push(value),
                OID_O => organizations.push(value),
                _ => other_subject.push(oid),
            }
        }
        let (mut extensions, mut alternative_names) = (0, 0);
        for ext in req.requested_extensions().into_iter().flatten() {
            extensions += 1;
            if let x509_parser::extensions::ParsedExtension::SubjectAlternativeName(san) = ext {
                alternative_names += san.general_names.len().max(1);
            }
        }
        let spki = &info.subject_pki;
        let algorithm = spki.algorithm.algorithm.to_id_string();
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok())
            .map(|o| o.to_id_string());
        let key = match (algorithm.as_str(), curve.as_deref(), spki.parsed()) {
            (OID_EC, Some(OID_P256), _) => KeyKind::EcdsaP256,
            (OID_EC, Some(OID_P384), _) => KeyKind::EcdsaP384,
            (OID_ED25519, _, _) => KeyKind::Ed25519,
            (_, _, Ok(PublicKey::RSA(rsa))) => KeyKind::Rsa(rsa.key_size()),
            (other, curve, _) => KeyKind::Other(format!("{other} {}", curve.unwrap_or(""))),
        };
        Some(Self {
            common_names,
            organizations,
            other_subject,
            extensions,
            alternative_names,
            key,
            public_key: spki.subject_public_key.data.to_vec(),
        })
    }

    fn asks_for_an_agent(&self) -> bool {
        self.common_names
            .iter()
            .any(|cn| cn.starts_with(AGENT_USER_PREFIX))
            || self.organizations.iter().any(|o| o == AGENT_GROUP)
    }
}

fn deny(reason: &'static str, message: String) -> Verdict {
    Verdict::Deny { reason, message }
}

/// The approver's decision on one request.
pub fn judge(r: &Request<'_>) -> Verdict {
    if r.signer != SIGNER {
        return Verdict::NotOurs;
    }
    // The API server refuses a request that does not parse; one we cannot read asks for
    // nothing we could give.
    let Some(p) = Parsed::from_pem(r.pem) else {
        return Verdict::NotOurs;
    };
    if !p.asks_for_an_agent() {
        return Verdict::NotOurs;
    }
    let node = match p.common_names.as_slice() {
        [cn] => node_of(cn),
        _ => None,
    };
    let Some(node) = node else {
        return deny(
            "BadSubject",
            format!(
                "an agent's certificate has one common name, {AGENT_USER_PREFIX}<node name>; \
                 this asks for {:?}",
                p.common_names
            ),
        );
    };
    if p.organizations != [AGENT_GROUP] || !p.other_subject.is_empty() {
        return deny(
            "BadSubject",
            format!(
                "an agent's certificate has the organization {AGENT_GROUP} and nothing else in its \
                 subject; this asks for organizations {:?} and other attributes {:?}",
                p.organizations, p.other_subject
            ),
        );
    }
    if p.extensions > 0 {
        return deny(
            "BadExtensions",
            format!(
                "an agent's request asks for no extensions; this asks for {} ({} alternative names)",
                p.extensions, p.alternative_names
            ),
        );
    }
    if !r.usages.iter().any(|u| u == "client auth")
        || r.usages.iter().any(|u| !USAGES.contains(&u.as_str()))
    {
        return deny(
            "BadUsages",
            format!(
                "an agent's certificate is for client auth (with digital signature and key \
                 encipherment allowed); this asks for {:?}",
                r.usages
            ),
        );
    }
    if !p.key.allowed() {
        return deny(
            "KeyNotAllowed",
            format!(
                "the key must be ECDSA P-256 or P-384, Ed25519, or RSA of 2048 to 8192 bits; this \
                 is {:?}",
                p.key
            ),
        );
    }
    let bound = format!("{BOUND_GROUP_PREFIX}{node}");
    let in_group = |g: &str| r.groups.iter().any(|x| x == g);
    if r.username.starts_with(BOOTSTRAP_USER_PREFIX) && in_group(&bound) {
        return Verdict::Approve {
            reason: "BoundBootstrapToken",
            message: format!(
                "{} is a bootstrap token bound to node {node} ({bound})",
                r.username
            ),
        };
    }
    if r.username == agent_user(node) && in_group(AGENT_GROUP) {
        return Verdict::Approve {
            reason: "Renewal",
            message: format!("node {node}'s agent renews its own identity"),
        };
    }
    deny(
        "RequesterNotBound",
        format!(
            "{} may not have the identity of node {node}: only a bootstrap token in group {bound} \
             or {} itself may",
            r.username,
            agent_user(node)
        ),
    )
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
