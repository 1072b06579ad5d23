//! What the daemon asks of the API server besides status writes and drains (its watches
//! aside).

use super::KubePublisher;
use crate::api::Machine;
use crate::api::machine_operation::MachineOperation;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, Preconditions};

impl KubePublisher {
    /// The node's Node and Machine, read afresh: what a decision that changes the node on
    /// its own waits for (src/reconcile/owner.rs, `read_goal`).
    pub async fn read_node_and_machine(
        &self,
    ) -> Result<(Option<Node>, Option<Machine>), kube::Error> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let machines: Api<Machine> = Api::all(self.client.clone());
        Ok((
            nodes.get_opt(&self.node).await?,
            machines.get_opt(&self.node).await?,
        ))
    }

    /// Deletes the finished operation `name` while it is still the object `uid` (its
    /// `ttlSecondsAfterFinished` ran out). `true`: deleted now; `false`: already gone or
    /// replaced.
    pub async fn delete_finished(&self, name: &str, uid: &str) -> Result<bool, kube::Error> {
        let api: Api<MachineOperation> = Api::all(self.client.clone());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}
