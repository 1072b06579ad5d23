//! The daemon, the operator's CLI and the rollout against a real kube-apiserver
//! (`e2e/controlplane/run`), the host underneath simulated: claims, status publication,
//! watches, RBAC, CRDs, metrics.

#[path = "../support/mod.rs"]
mod support;

mod apiserver_crds;
mod apiserver_rbac;
mod daemon;
mod daemon_bad_env;
mod drain;
mod exec_credentials;
mod identity;
mod machine_goal;
mod op_cli;
mod preflight;
mod publisher;
mod rollout;
mod status_model;
