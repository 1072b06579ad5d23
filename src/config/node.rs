//! The kubelet's side of the configuration: which node image a version runs (pins in
//! `nodeImages`, any version through the `nodeImage` pattern), the pod sandbox, the pod range
//! and the kubelet's settings. All of it comes with a node image or not at all.

use super::image::node_image;
use super::{
    ConfigError, DEFAULT_POD_CIDR, DEFAULT_SANDBOX_IMAGE, KubeletTuning, NodeConfig,
    NodeImagePattern, NodeImages, VERSION_PLACEHOLDER, bad, is_kubernetes_version,
};
use crate::lifecycle::validate::{
    POD_RANGE_FROM_CLUSTER, UnpinnedImage, parse_pinned_image, valid_pod_range,
};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The keys as written.
pub(super) struct NodeKeys {
    pub(super) pins: Option<BTreeMap<String, String>>,
    pub(super) pattern: Option<String>,
    pub(super) archive: Option<String>,
    pub(super) sandbox_image: Option<String>,
    pub(super) sandbox_image_archive: Option<PathBuf>,
    pub(super) pod_cidr: Option<String>,
    pub(super) kubelet: Option<KubeletTuning>,
}

/// `None` without `nodeImages` and `nodeImage` (then no other kubelet key may be set); the
/// join's version must have an image, pinned or by the pattern.
pub(super) fn node_config(
    kubernetes_version: &str,
    keys: NodeKeys,
    has_kubelet_credential: bool,
) -> Result<Option<NodeConfig>, ConfigError> {
    if keys.pins.is_none() && keys.pattern.is_none() {
        for (setting, set) in [
            ("sandboxImage", keys.sandbox_image.is_some()),
            ("sandboxImageArchive", keys.sandbox_image_archive.is_some()),
            ("nodeImageArchive", keys.archive.is_some()),
            ("podCIDR", keys.pod_cidr.is_some()),
            ("kubelet", keys.kubelet.is_some()),
        ] {
            if set {
                return Err(bad(
                    setting,
                    "is a kubelet setting: it needs nodeImage or nodeImages",
                ));
            }
        }
        return Ok(None);
    }
    let mut pins = BTreeMap::new();
    for (version, value) in keys.pins.iter().flatten() {
        if !is_kubernetes_version(version) {
            return Err(bad(
                "nodeImages",
                format!("{version:?} is not a version like v1.34.12"),
            ));
        }
        pins.insert(version.clone(), node_image(version, value)?);
    }
    let pattern = keys
        .pattern
        .as_deref()
        .map(NodeImagePattern::parse)
        .transpose()?;
    if pattern.is_none() && !pins.contains_key(kubernetes_version) {
        return Err(bad(
            "nodeImages",
            format!(
                "names no image for kubernetesVersion {kubernetes_version} (and there is no \
                 nodeImage pattern)"
            ),
        ));
    }
    if !has_kubelet_credential {
        return Err(bad(
            "bootstrapTokenFile",
            "is required with a node image: the kubelet's first credential (unless the \
             kubeconfig's user is the exec plugin `flexnode token`, which the kubelet then runs \
             too)",
        ));
    }
    let sandbox_image = keys
        .sandbox_image
        .unwrap_or_else(|| DEFAULT_SANDBOX_IMAGE.to_string());
    match parse_pinned_image(&sandbox_image) {
        Ok(_) => {}
        Err(UnpinnedImage::NoDigest) => {
            return Err(bad(
                "sandboxImage",
                "must be pinned by digest: REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex> (a tag \
                 could change under the node)",
            ));
        }
        Err(UnpinnedImage::NotAReference) => {
            return Err(bad(
                "sandboxImage",
                "is not an image reference: REGISTRY/REPOSITORY[:TAG]@sha256:<64 hex>",
            ));
        }
    }
    if let Some(archive) = &keys.archive
        && !archive.starts_with('/')
    {
        return Err(bad(
            "nodeImageArchive",
            format!(
                "{archive:?} is not an absolute path (an OCI archive or layout, \
                 {VERSION_PLACEHOLDER} naming the version)"
            ),
        ));
    }
    if let Some(archive) = &keys.sandbox_image_archive
        && !archive.is_absolute()
    {
        return Err(bad(
            "sandboxImageArchive",
            format!("{} is not an absolute path", archive.display()),
        ));
    }
    let pod_cidr = keys
        .pod_cidr
        .unwrap_or_else(|| DEFAULT_POD_CIDR.to_string());
    if !valid_pod_range(&pod_cidr) {
        return Err(bad(
            "podCIDR",
            format!(
                "{pod_cidr:?} is neither {POD_RANGE_FROM_CLUSTER:?} nor an IPv4 CIDR like \
                 10.88.0.0/16"
            ),
        ));
    }
    let kubelet = keys.kubelet.unwrap_or_default();
    kubelet.check().map_err(|(key, why)| bad(&key, why))?;
    Ok(Some(NodeConfig {
        images: NodeImages {
            pins,
            pattern,
            archive: keys.archive,
        },
        sandbox_image,
        sandbox_image_archive: keys.sandbox_image_archive,
        pod_cidr,
        kubelet,
    }))
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::super::tests::kubeconfig_with_ca;
    use std::os::unix::fs::PermissionsExt;

    /// A valid join configuration with `extra` keys.
    fn config(extra: &str) -> Result<Config, super::ConfigError> {
        let dir = tempfile::tempdir().expect("tmp");
        let kc = kubeconfig_with_ca(dir.path());
        let token = dir.path().join("token");
        std::fs::write(&token, "abcdef.0123456789abcdef\n").expect("token");
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let text = format!(
            "kubeconfig: {}\nkubernetesVersion: v1.34.12\nbootstrapTokenFile: {}\n{extra}",
            kc.display(),
            token.display()
        );
        Config::parse(&text, "h")
    }

    #[test]
    fn a_pattern_names_any_version_and_is_rendered_back() {
        let c = config("nodeImage: oci://r.example:5000/flexnode/node:{kubernetesVersion}\n")
            .expect("valid");
        let node = c.node.clone().expect("node");
        let pattern = node.images.pattern.clone().expect("pattern");
        assert!(node.images.pins.is_empty());
        assert_eq!(
            pattern.for_version("v1.35.1").map(|i| i.to_string()),
            Some("oci://r.example:5000/flexnode/node:v1.35.1".to_string())
        );
        let r = c.rendered();
        assert_eq!(
            r.node_image.as_deref(),
            Some("oci://r.example:5000/flexnode/node:{kubernetesVersion}")
        );
        assert_eq!(r.node_images, None);
        // A pin for another version beside the pattern: both kept.
        let hex = "ab".repeat(32);
        let both = config(&format!(
            "nodeImage: oci://r.example/node:k-{{kubernetesVersion}}\nnodeImages:\n  v1.33.9: oci://r.example/node@sha256:{hex}\n"
        ))
        .expect("valid");
        assert_eq!(both.node.expect("node").images.pins.len(), 1);
    }

    #[test]
    fn a_pattern_must_put_the_version_in_the_tag() {
        for bad in [
            "oci://r.example/node:latest",
            "oci://r.example/node:v1.34.12",
            "oci://r.example/{kubernetesVersion}/node:v1",
            "r.example/node:{kubernetesVersion}",
            "oci://node:{kubernetesVersion}",
            "oci://r.example/node:{kubernetesVersion}@sha256:00",
        ] {
            let e = config(&format!("nodeImage: \"{bad}\"\n")).expect_err(bad);
            assert_eq!(e.setting, "nodeImage", "{bad}: {e}");
        }
    }

    #[test]
    fn kubelet_settings_need_a_node_image_and_are_checked_by_name() {
        let pattern = "nodeImage: oci://r.example/node:{kubernetesVersion}\n";
        let c = config(&format!(
            "{pattern}kubelet:\n  maxPods: 50\n  systemReserved: {{cpu: 100m, memory: 256Mi}}\n  \
             evictionHard: {{memory.available: 100Mi, nodefs.available: 10%}}\n  \
             imageGCHighThresholdPercent: 90\n  nodeIP: 10.0.0.5\n  clusterDNS: [10.96.0.10]\n  \
             clusterDomain: cluster.local\n"
        ))
        .expect("valid");
        let kubelet = c.node.clone().expect("node").kubelet;
        assert_eq!(kubelet.max_pods, Some(50));
        assert_eq!(kubelet.cluster_dns.len(), 1);
        assert_eq!(c.rendered().kubelet, Some(kubelet));
        for (extra, setting) in [
            ("kubelet:\n  maxPods: 0\n", "kubelet.maxPods"),
            ("kubelet:\n  maxPod: 5\n", "maxPod"),
            (
                "kubelet:\n  kubeReserved: {gpu: '1'}\n",
                "kubelet.kubeReserved",
            ),
            ("kubelet:\n  nodeIP: ten\n", "config"),
        ] {
            let e = config(&format!("{pattern}{extra}")).expect_err(extra);
            assert!(e.setting.starts_with(setting), "{extra}: {e}");
        }
        let e = config("kubelet:\n  maxPods: 50\n").expect_err("without an image");
        assert_eq!(e.setting, "kubelet");
    }

    #[test]
    fn an_offline_nodes_archives_are_absolute_paths_rendered_back() {
        let pattern = "nodeImage: oci://r.example/node:{kubernetesVersion}\n";
        let c = config(&format!(
            "{pattern}nodeImageArchive: /var/lib/offline/node-{{kubernetesVersion}}.oci.tar\n\
             sandboxImageArchive: /var/lib/offline/pause.oci.tar\n"
        ))
        .expect("valid");
        let node = c.node.clone().expect("node");
        assert_eq!(
            node.images.archive_for("v1.35.0"),
            Some("/var/lib/offline/node-v1.35.0.oci.tar".into())
        );
        let r = c.rendered();
        assert_eq!(
            r.node_image_archive.as_deref(),
            Some("/var/lib/offline/node-{kubernetesVersion}.oci.tar")
        );
        assert_eq!(
            r.sandbox_image_archive.as_deref(),
            Some(std::path::Path::new("/var/lib/offline/pause.oci.tar"))
        );
        // One archive for every version (each image tagged with its version in it).
        let one =
            config(&format!("{pattern}nodeImageArchive: /srv/nodes.oci.tar\n")).expect("valid");
        assert_eq!(
            one.node.expect("node").images.archive_for("v1.35.0"),
            Some("/srv/nodes.oci.tar".into())
        );
        for (extra, setting) in [
            ("nodeImageArchive: node.tar\n", "nodeImageArchive"),
            ("sandboxImageArchive: pause.tar\n", "sandboxImageArchive"),
        ] {
            let e = config(&format!("{pattern}{extra}")).expect_err(extra);
            assert_eq!(e.setting, setting, "{extra}: {e}");
            let e = config(extra).expect_err("without a node image");
            assert_eq!(e.setting, setting, "{extra}: {e}");
        }
    }
}
