//! Which MachineOperations are this node's, and what claiming one means (docs/design.md,
//! "Reconciler").

use crate::api::Machine;
use crate::api::machine_operation::{MachineOperation, OperationKind, OperationPhase};
use crate::api::selector_matches;
use crate::lifecycle::input::{Claim, ClaimKind};
use crate::lifecycle::state::{Goal, NodeSettings, OpRef};
use std::collections::BTreeMap;

/// The goal a Machine states: its generation, `spec.kubernetes.version` (`default_version`
/// when it names none), and the labels and taints its Node registers with.
pub fn goal(machine: &Machine, default_version: &str) -> Goal {
    let k = machine.spec.kubernetes.as_ref();
    Goal {
        generation: machine.metadata.generation.unwrap_or(0),
        kubernetes_version: k
            .and_then(|k| k.version.clone())
            .unwrap_or_else(|| default_version.to_string()),
        node: NodeSettings {
            labels: k.and_then(|k| k.node_labels.clone()).unwrap_or_default(),
            taints: k
                .and_then(|k| k.register_with_taints.clone())
                .unwrap_or_default(),
        },
    }
}

/// `machineRef` names this node, or `machineSelector` matches `labels` (the Node's, or the
/// Machine's when the Node does not exist; `None` when neither exists: not matched).
pub fn addressed(
    op: &MachineOperation,
    node: &str,
    labels: Option<&BTreeMap<String, String>>,
) -> bool {
    match (&op.spec.machine_ref, &op.spec.machine_selector) {
        (Some(name), _) if !name.is_empty() => name == node,
        (_, Some(selector)) => labels.is_some_and(|l| selector_matches(selector, l)),
        (Some(_) | None, None) => false,
    }
}

/// `machineRef` names another node: never this node's, whatever its labels (what the
/// server's `spec.machineRef` field selectors leave out).
pub fn elsewhere(op: &MachineOperation, node: &str) -> bool {
    op.spec
        .machine_ref
        .as_deref()
        .is_some_and(|name| !name.is_empty() && name != node)
}

/// Handlers run only for a phase that is empty or Pending; InProgress is never re-executed
/// from the API (an interrupted one is resumed from the store).
pub fn is_claimable(op: &MachineOperation) -> bool {
    matches!(
        op.status.as_ref().and_then(|s| s.phase),
        None | Some(OperationPhase::Pending)
    )
}

/// The claim for an operation this agent runs; `None` for kinds meant for other controllers,
/// which are left untouched.
pub fn claim(op: &MachineOperation, machine_generation: i64) -> Option<Claim> {
    let kind = match op.spec.operation_kind {
        OperationKind::NodeReboot => ClaimKind::NodeReboot {
            parameters: op.spec.parameters.clone().unwrap_or_default(),
        },
        OperationKind::AgentReset => ClaimKind::AgentReset {
            parameters: op.spec.parameters.clone().unwrap_or_default(),
        },
        OperationKind::AgentUpgrade => ClaimKind::AgentUpgrade {
            parameters: op.spec.parameters.clone().unwrap_or_default(),
        },
        OperationKind::HostReboot
        | OperationKind::HostPowerOff
        | OperationKind::HostPowerOn
        | OperationKind::HostReplace
        | OperationKind::Unknown => return None,
    };
    Some(Claim {
        op: OpRef {
            name: op.metadata.name.clone()?,
            uid: op.metadata.uid.clone()?,
        },
        kind,
        machine_generation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::machine_operation::MachineOperationSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

    fn op(machine_ref: Option<&str>, selector: Option<LabelSelector>) -> MachineOperation {
        let mut op = MachineOperation::new(
            "op",
            MachineOperationSpec {
                machine_ref: machine_ref.map(str::to_string),
                machine_selector: selector,
                ..Default::default()
            },
        );
        op.metadata.uid = Some("u".into());
        op
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn machine_ref_must_name_this_node() {
        assert!(addressed(&op(Some("edge-07"), None), "edge-07", None));
        assert!(!addressed(&op(Some("edge-08"), None), "edge-07", None));
        assert!(!addressed(&op(None, None), "edge-07", Some(&labels(&[]))));
        assert!(elsewhere(&op(Some("edge-08"), None), "edge-07"));
        assert!(!elsewhere(&op(Some("edge-07"), None), "edge-07"));
        assert!(!elsewhere(&op(None, None), "edge-07"));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let site = labels(&[("site", "flex"), ("tier", "edge")]);
        let by_label = LabelSelector {
            match_labels: Some(labels(&[("site", "flex")])),
            ..Default::default()
        };
        assert!(addressed(
            &op(None, Some(by_label.clone())),
            "n",
            Some(&site)
        ));
        assert!(
            !addressed(&op(None, Some(by_label)), "n", None),
            "no Node and no Machine"
        );
        let expr = |key: &str, operator: &str, values: &[&str]| LabelSelector {
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: key.into(),
                operator: operator.into(),
                values: Some(values.iter().map(|v| v.to_string()).collect()),
            }]),
            ..Default::default()
        };
        assert!(selector_matches(
            &expr("tier", "In", &["edge", "core"]),
            &site
        ));
        assert!(!selector_matches(&expr("tier", "NotIn", &["edge"]), &site));
        assert!(selector_matches(&expr("zone", "DoesNotExist", &[]), &site));
        assert!(selector_matches(&expr("site", "Exists", &[]), &site));
        assert!(!selector_matches(&expr("site", "Bogus", &[]), &site));
        assert!(selector_matches(&LabelSelector::default(), &site));
    }

    #[test]
    fn a_kind_from_a_newer_crd_is_read_and_left_alone() {
        let json = r#"{"apiVersion":"unbounded-cloud.io/v1alpha3","kind":"MachineOperation",
            "metadata":{"name":"x","uid":"u"},"spec":{"machineRef":"n","operationKind":"HostReimage"}}"#;
        let op: MachineOperation = serde_json::from_str(json).expect("decodes");
        assert_eq!(op.spec.operation_kind, OperationKind::Unknown);
        assert_eq!(claim(&op, 0), None);
    }

    #[test]
    fn other_controllers_kinds_are_not_claimed() {
        let mut o = op(Some("n"), None);
        o.spec.operation_kind = OperationKind::HostPowerOff;
        assert_eq!(claim(&o, 0), None);
        o.spec.operation_kind = OperationKind::NodeReboot;
        assert_eq!(claim(&o, 3).map(|c| c.machine_generation), Some(3));
    }
}
