//! The agent's key and certificate request, made on the node (the key never leaves it), and
//! what an issued certificate says.

use super::{AGENT_GROUP, agent_user};
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256};
use sha2::{Digest, Sha256};
use x509_parser::prelude::{FromDer, X509Certificate};

#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("cannot make the key or the request: {0}")]
    Make(#[from] rcgen::Error),
    #[error("{0}")]
    Certificate(String),
}

/// A private key (PKCS#8 PEM). Its `Debug` shows nothing of it.
pub struct AgentKey {
    pair: KeyPair,
}

impl std::fmt::Debug for AgentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentKey(…)")
    }
}

impl AgentKey {
    /// A new ECDSA P-256 key.
    pub fn generate() -> Result<Self, CsrError> {
        Ok(Self {
            pair: KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?,
        })
    }

    pub fn from_pem(pem: &str) -> Result<Self, CsrError> {
        Ok(Self {
            pair: KeyPair::from_pem(pem)?,
        })
    }

    pub fn pem(&self) -> String {
        self.pair.serialize_pem()
    }

    /// The SHA-256 of the public key: a request's name is made from it, so that a request
    /// sent again after a crash is found instead of made twice.
    pub fn fingerprint(&self) -> String {
        hex::encode(Sha256::digest(self.pair.public_key_raw()))
    }

    /// The request for `node`'s identity: CN `system:flexnode:<node>`, O `flexnode:agents`,
    /// nothing else (no alternative names; the usages go in the CSR object).
    pub fn request(&self, node: &str) -> Result<String, CsrError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, agent_user(node));
        dn.push(DnType::OrganizationName, AGENT_GROUP);
        params.distinguished_name = dn;
        Ok(params.serialize_request(&self.pair)?.pem()?)
    }

    /// The public key (the subject public key's bits).
    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key_raw()
    }

    /// Whether `cert` certifies this key.
    pub fn matches(&self, cert: &Issued) -> bool {
        cert.public_key == self.pair.public_key_raw()
    }
}

/// What an issued certificate says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub common_name: String,
    pub organizations: Vec<String>,
    /// Unix seconds.
    pub not_before: i64,
    pub not_after: i64,
    public_key: Vec<u8>,
}

impl Issued {
    /// The first certificate of a PEM bundle.
    pub fn from_pem(pem: &[u8]) -> Result<Self, CsrError> {
        let bad = |e: String| CsrError::Certificate(format!("not a PEM certificate: {e}"));
        let (_, block) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| bad(e.to_string()))?;
        let (_, cert) =
            X509Certificate::from_der(&block.contents).map_err(|e| bad(e.to_string()))?;
        let subject = cert.subject();
        let text = |v: Result<&str, _>| v.map(str::to_string).unwrap_or_default();
        Ok(Self {
            common_name: subject
                .iter_common_name()
                .next()
                .map(|a| text(a.as_str()))
                .unwrap_or_default(),
            organizations: subject
                .iter_organization()
                .map(|a| text(a.as_str()))
                .collect(),
            not_before: cert.validity().not_before.timestamp(),
            not_after: cert.validity().not_after.timestamp(),
            public_key: cert.public_key().subject_public_key.data.to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_node_and_the_agents_group_only() {
        let key = AgentKey::generate().expect("key");
        let pem = key.request("node-a").expect("request");
        let parsed = crate::identity::rules::Parsed::from_pem(pem.as_bytes()).expect("parse");
        assert_eq!(parsed.common_names, ["system:flexnode:node-a"]);
        assert_eq!(parsed.organizations, ["flexnode:agents"]);
        assert!(parsed.other_subject.is_empty() && parsed.alternative_names == 0);
        // The key reloads, and keeps its fingerprint.
        let again = AgentKey::from_pem(&key.pem()).expect("reload");
        assert_eq!(again.fingerprint(), key.fingerprint());
        assert_eq!(format!("{key:?}"), "AgentKey(…)");
    }
}
