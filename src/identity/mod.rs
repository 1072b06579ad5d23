//! The agent's own identity in the cluster: `system:flexnode:<node>` in group
//! `flexnode:agents` (manifests/rbac/), a client certificate the node obtains by a
//! CertificateSigningRequest, authenticated by a bootstrap token bound to that node or by the
//! identity it renews — never minted out of band with the cluster's CA key.
//!
//! - `csr.rs`: the key and the request, made on the node; what a certificate says.
//! - `rules.rs`: which requests the approver approves (pure).
//! - `request.rs`: sending the request and waiting for its certificate.
//! - `credential.rs`: the kubeconfig the certificate goes into.
//! - `rotation.rs`: renewal while the daemon runs, the client switched in place.
//! - `bootstrap.rs`: a join's certificate, obtained with a bootstrap token (crash-safe).
//! - `exec.rs`: `flexnode token`, an exec plugin for a JWT authenticator (no certificate).

pub mod bootstrap;
pub mod credential;
pub mod csr;
pub mod exec;
pub mod request;
pub mod rotation;
pub mod rules;

/// The group every agent's identity is in (RBAC binds it: manifests/rbac/agent-rbac.yaml).
pub const AGENT_GROUP: &str = "flexnode:agents";
/// Every agent's user name starts so; the node's name follows.
pub const AGENT_USER_PREFIX: &str = "system:flexnode:";
/// The signer whose certificates the API server accepts for client authentication.
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// A bootstrap token in the group `BOUND_GROUP_PREFIX<node>` (its Secret's
/// `auth-extra-groups`) may obtain that node's identity and no other.
pub const BOUND_GROUP_PREFIX: &str = "system:bootstrappers:flexnode:";
/// What the API server names a bootstrap token's user.
pub const BOOTSTRAP_USER_PREFIX: &str = "system:bootstrap:";

/// The agent's user name on `node`.
pub fn agent_user(node: &str) -> String {
    format!("{AGENT_USER_PREFIX}{node}")
}

/// The node an agent's user name is of.
pub fn node_of(user: &str) -> Option<&str> {
    user.strip_prefix(AGENT_USER_PREFIX)
        .filter(|n| crate::config::is_dns_subdomain(n))
}

/// The wall clock in Unix seconds, as certificates count time.
pub fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
