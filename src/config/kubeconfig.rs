//! The kubeconfig the agent (and an operator's `flexnode op`) reaches the API server with: the
//! one rule that the API server is verified — checked when the configuration loads (every
//! cluster the file names) and again when a client is built (the one its context selects).

use kube::config::{Cluster, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why the API server of `cluster` (named `name`) would not be verified, if it would not be:
/// TLS verification turned off (`insecure-skip-tls-verify`), or plain http. The node's
/// credential and everything it reads from the cluster go over that connection, so neither
/// is ever taken silently.
pub fn unverified(name: &str, cluster: &Cluster) -> Option<String> {
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Some(format!(
            "cluster {name:?} sets insecure-skip-tls-verify: the API server must be verified \
             (name its CA in certificate-authority-data)"
        ));
    }
    let server = cluster.server.as_deref()?;
    (!server.starts_with("https://")).then(|| {
        format!(
            "cluster {name:?}: the API server must be reached over https:// (the server is not \
             shown: it may carry credentials)"
        )
    })
}

/// The first cluster of `kc` whose API server would not be verified, and why.
pub fn first_unverified(kc: &Kubeconfig) -> Option<String> {
    kc.clusters
        .iter()
        .find_map(|c| unverified(&c.name, c.cluster.as_ref()?))
}

/// A client from a kubeconfig file (the agent's per-node credential, or an operator's). One
/// whose selected API server would not be verified is refused.
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<kube::Client, kube::Error> {
    let kubeconfig = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    let selected = kubeconfig
        .current_context
        .as_deref()
        .and_then(|name| kubeconfig.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref())
        .map(|c| c.cluster.as_str());
    let why = kubeconfig
        .clusters
        .iter()
        .filter(|c| Some(c.name.as_str()) == selected)
        .find_map(|c| unverified(&c.name, c.cluster.as_ref()?));
    if let Some(why) = why {
        return Err(kube::Error::InferKubeconfig(
            KubeconfigError::LoadClusterOfContext(why),
        ));
    }
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(kube::Error::InferKubeconfig)?;
    kube::Client::try_from(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's kubeconfig (`flexnode op`) too: a client that would not verify the API
    /// server is never built.
    #[tokio::test]
    async fn clients_that_would_not_verify_the_api_server_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let kubeconfig = |name: &str, cluster: &str| {
            let path = dir.path().join(name);
            std::fs::write(
                &path,
                format!(
                    "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\
                     users:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  \
                     context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
                ),
            )
            .expect("write");
            path
        };
        let ok = kubeconfig("ok", "    server: https://127.0.0.1:6443\n");
        assert!(client_from_kubeconfig(&ok).await.is_ok());
        for (name, cluster, why) in [
            (
                "insecure",
                "    server: https://127.0.0.1:6443\n    insecure-skip-tls-verify: true\n",
                "insecure-skip-tls-verify",
            ),
            ("http", "    server: http://127.0.0.1:8080\n", "https://"),
        ] {
            let Err(e) = client_from_kubeconfig(&kubeconfig(name, cluster)).await else {
                panic!("{name}: a client was built");
            };
            assert!(e.to_string().contains(why), "{name}: {e}");
        }
    }
}
