//! The kubeconfig the agent (and an operator's `flexnode op`) reaches the API server with: the
//! one rule that the API server is verified — checked when the configuration loads (every
//! cluster the file names) and again when a client is built (the one its context selects) —
//! and the one way a client's error is told.

use kube::config::{AuthInfo, Cluster, KubeConfigOptions, Kubeconfig, KubeconfigError};
use std::path::Path;

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
/// whose selected API server would not be verified is refused; an exec command `flexnode` is
/// this binary.
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<kube::Client, kube::Error> {
    let mut kubeconfig = Kubeconfig::read_from(path).map_err(kube::Error::InferKubeconfig)?;
    if let Ok(exe) = std::env::current_exe() {
        resolve_self(&mut kubeconfig, &exe);
    }
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

/// A one-line description of a client error.
pub fn api_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let msg = if s.message.is_empty() {
                format!("the API server answered {}", s.code)
            } else {
                s.message.clone()
            };
            if s.reason.is_empty() {
                msg
            } else {
                format!("{msg} ({})", s.reason)
            }
        }
        kube::Error::HyperError(_) | kube::Error::Service(_) => {
            // The top-level text ("client error (Connect)") says little; the causes say why.
            let mut msg = format!("cannot reach the API server: {e}");
            let mut source = std::error::Error::source(e);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !msg.contains(&text) {
                    msg.push_str(": ");
                    msg.push_str(&text);
                }
                source = cause.source();
            }
            msg
        }
        other => other.to_string(),
    }
}

/// The user the kubeconfig's current context selects.
pub fn current_user(kc: &Kubeconfig) -> Option<&AuthInfo> {
    let user = kc
        .current_context
        .as_deref()
        .and_then(|name| kc.contexts.iter().find(|c| c.name == name))
        .and_then(|c| c.context.as_ref()?.user.clone())?;
    kc.auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .as_ref()
}

/// The arguments after `token` of the `flexnode token` exec plugin the current user runs, if
/// it does: the kubelet is then given the same plugin (src/effects/host/kubelet.rs).
pub fn token_plugin(kc: &Kubeconfig) -> Option<Vec<String>> {
    let exec = current_user(kc)?.exec.as_ref()?;
    let command = exec.command.as_deref()?;
    let args = exec.args.as_deref().unwrap_or_default();
    let flexnode = Path::new(command).file_name() == Some(SELF_COMMAND.as_ref());
    match args.split_first() {
        Some((first, rest)) if flexnode && first == "token" => Some(rest.to_vec()),
        _ => None,
    }
}

/// The exec command that stands for the running flexnode binary (`flexnode token`,
/// src/identity/exec.rs).
pub const SELF_COMMAND: &str = "flexnode";

/// Every exec command `flexnode` in `kc` made `exe` (the running binary).
pub fn resolve_self(kc: &mut Kubeconfig, exe: &Path) {
    let execs = kc
        .auth_infos
        .iter_mut()
        .filter_map(|named| named.auth_info.as_mut()?.exec.as_mut());
    for exec in execs {
        if exec.command.as_deref() == Some(SELF_COMMAND) {
            exec.command = Some(exe.to_string_lossy().into_owned());
        }
    }
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

    #[test]
    fn the_command_flexnode_is_this_binary() {
        let mut kc = Kubeconfig::from_yaml(
            "users:\n- name: a\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: flexnode\n      args: [token]\n- name: b\n  user:\n    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: /usr/bin/other\n",
        )
        .expect("kubeconfig");
        resolve_self(&mut kc, Path::new("/opt/flexnode/current/flexnode"));
        let commands: Vec<_> = kc
            .auth_infos
            .iter()
            .map(|a| {
                a.auth_info
                    .as_ref()
                    .and_then(|i| i.exec.as_ref()?.command.clone())
            })
            .collect();
        assert_eq!(
            commands,
            [
                Some("/opt/flexnode/current/flexnode".to_string()),
                Some("/usr/bin/other".to_string())
            ]
        );
    }
}
