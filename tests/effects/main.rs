//! The effects against the real parts they drive: systemd (a booted nspawn container,
//! `e2e/nspawn/run`), containerd 1.6 and 2.x with TLS registries (`e2e/containerd/run`), the
//! machine rootfs and the agent's image; one contract run against them and the simulated host.

#[path = "../support/mod.rs"]
mod support;

mod agent_image;
mod containerd;
mod contract;
mod effects_contract;
mod host;
mod machine_rootfs;
mod systemd;
