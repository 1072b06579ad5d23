//! flexnode: a node agent that joins a Linux host to Kubernetes and runs its lifecycle.
pub mod machine;
