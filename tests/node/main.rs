//! A real host install: the agent in a booted nspawn container (systemd as PID 1) joined to a
//! real kube-apiserver (hand-off, security, bad environments), the kubelet's TLS bootstrap,
//! and the QEMU tier's guest.

#[path = "../support/mod.rs"]
mod support;

mod host_bad_env;
mod host_handoff;
mod host_rejoin;
mod host_security;
mod kubelet_bootstrap;
mod qemu_tier;
