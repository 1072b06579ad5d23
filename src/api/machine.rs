//! `Machine`: the node's goal. flexnode reads `spec.kubernetes` and `metadata.generation`,
//! and reports only through fields the upstream schema has. Every field of the upstream
//! schema is here with its type (`tests/core/upstream_crds.rs` checks it).
// kube's derive repeats `type_` per printer column, which this lint misreads.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "unbounded-cloud.io",
    version = "v1alpha3",
    kind = "Machine",
    shortname = "mach",
    status = "MachineStatus",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Kubernetes",
        type_ = "string",
        json_path = ".spec.kubernetes.version"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct MachineSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pxe: Option<PxeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubernetesSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Not in the v0.1.22 schema (later upstream versions); kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::preserve_unknown")]
    pub provider_ref: Option<serde_json::Value>,
    /// Deprecated upstream; kept so older manifests still apply.
    #[serde(
        default,
        rename = "providerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider_id: Option<String>,
    /// Not in the v0.1.22 schema (later upstream versions); kept as written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::preserve_unknown")]
    pub host: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_ref: Option<ConfigurationRef>,
}

/// A Secret's key, by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretKeyRef {
    pub name: String,
    pub namespace: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// A Secret, by namespace and name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretRef {
    pub name: String,
    pub namespace: String,
}

/// An object by name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NameRef {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshSpec {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    pub private_key_ref: SecretKeyRef,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bastion: Option<Bastion>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bastion {
    pub host: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key_ref: Option<SecretKeyRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PxeSpec {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub architecture: Option<PxeArchitecture>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_protocol: Option<BootProtocol>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloud_init: Option<CloudInit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp_leases: Option<Vec<DhcpLease>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netboot_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netboot_pull_secret_ref: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret_ref: Option<SecretRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish: Option<Redfish>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_disk: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PxeArchitecture {
    Amd64,
    Arm64,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum BootProtocol {
    #[serde(rename = "PXE")]
    Pxe,
    #[serde(rename = "HTTP")]
    Http,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_data_config_map_ref: Option<SecretKeyRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DhcpLease {
    pub mac: String,
    pub ipv4: String,
    pub subnet_mask: String,
    pub gateway: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<Vec<String>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Redfish {
    pub url: String,
    pub username: String,
    pub password_ref: SecretKeyRef,
    #[serde(default, rename = "deviceID", skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubernetesSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ref: Option<NameRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<BTreeMap<String, String>>,
    /// `key[=value]:Effect`, as kubelet's `--register-with-taints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub register_with_taints: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_token_ref: Option<NameRef>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// Container install: the agent image by digest (informative; upgrades use AgentUpgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, rename = "baseURL", skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downloads: Option<Downloads>,
}

/// Where the node's components come from. flexnode takes them from the node image instead
/// and says so on the Machine (docs/node.md, "spec.agent.downloads").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Downloads {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cni: Option<Download>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containerd: Option<Download>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crictl: Option<Download>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<Download>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runc: Option<Download>,
}

impl Downloads {
    /// The components named with a source (a URL, a base URL or a version).
    pub fn named(&self) -> Vec<&'static str> {
        [
            ("kubernetes", &self.kubernetes),
            ("containerd", &self.containerd),
            ("runc", &self.runc),
            ("cni", &self.cni),
            ("crictl", &self.crictl),
        ]
        .into_iter()
        .filter(|(_, d)| {
            d.as_ref()
                .is_some_and(|d| d.url.is_some() || d.base_url.is_some() || d.version.is_some())
        })
        .map(|(name, _)| name)
        .collect()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct Download {
    #[serde(default, rename = "baseURL", skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ConfigurationRef {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::string")]
    pub phase: Option<MachinePhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<ConfigurationStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<SshStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redfish: Option<RedfishStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<TpmStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AgentStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigurationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_name: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SshStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedfishStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_fingerprint: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TpmStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ek_public_key: Option<String>,
}

/// The schema is a plain string, as upstream's: a phase this version does not know is
/// [`MachinePhase::Unknown`], never a Machine that cannot be read.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum MachinePhase {
    Pending,
    Rebooting,
    Provisioning,
    Joining,
    Ready,
    Failed,
    #[serde(other)]
    Unknown,
}
