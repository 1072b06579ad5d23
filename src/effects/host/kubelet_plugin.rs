//! The kubelet's exec credential: when the agent's kubeconfig runs `flexnode token`
//! (src/identity/exec.rs), the machine's kubelet runs the same plugin for the audience
//! `kubelet` — the agent's binary copied into the machine (again by each daemon that starts,
//! so an AgentUpgrade's build is the one the kubelet runs), the files the plugin reads (a
//! client secret, a CA) copied beside it. No bootstrap token and no client certificate: the
//! API server's JWT authenticator maps the token to `system:node:<node>`.

use std::path::{Path, PathBuf};

/// Where the agent's binary is in the machine: the kubelet's plugin command.
pub const PLUGIN_BINARY: &str = "usr/local/libexec/flexnode/flexnode";
/// Where the files the plugin reads are in the machine.
const PLUGIN_FILES: &str = "etc/kubernetes/exec";
/// The kubeconfig the kubelet runs the plugin from.
pub const KUBELET_EXEC_KUBECONFIG: &str = "etc/kubernetes/kubelet.kubeconfig";

/// `flexnode token`'s options that take a value, and whether the value names a file the
/// plugin reads (src/cli/token.rs holds the same names; its tests check they agree).
pub const PLUGIN_OPTIONS: [(&str, bool); 6] = [
    ("--token-url", false),
    ("--client-id", false),
    ("--client-secret-file", true),
    ("--metadata-url", false),
    ("--audience", false),
    ("--ca-file", true),
];

/// The kubelet's plugin, from the agent's: its arguments with the machine's paths, the files
/// to copy (host path → path in the machine), and the agent's binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeletPlugin {
    pub args: Vec<String>,
    pub copies: Vec<(PathBuf, PathBuf)>,
    pub binary: PathBuf,
}

/// The kubelet's plugin from `agent_args` (what follows `token` in the agent's kubeconfig):
/// the same source, the audience `kubelet`, each file at a path of the machine.
pub fn kubelet_plugin(agent_args: &[String], binary: &Path) -> Result<KubeletPlugin, String> {
    let mut args = vec!["token".to_string()];
    let mut copies = Vec::new();
    let mut rest = agent_args.iter();
    while let Some(arg) = rest.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let Some(&(option, is_file)) = PLUGIN_OPTIONS.iter().find(|(o, _)| *o == name) else {
            return Err(format!(
                "`flexnode token {arg}`: an option the kubelet's copy of the plugin is not given"
            ));
        };
        let value = match inline {
            Some(v) => v,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| format!("`flexnode token {option}` has no value"))?,
        };
        if option == "--audience" {
            continue;
        }
        let value = if is_file {
            let from = PathBuf::from(&value);
            let name = from
                .file_name()
                .ok_or_else(|| format!("`flexnode token {option} {value}` names no file"))?;
            let to = Path::new(PLUGIN_FILES)
                .join(option.trim_start_matches("--"))
                .join(name);
            let shown = format!("/{}", to.display());
            copies.push((from, to));
            shown
        } else {
            value
        };
        args.extend([option.to_string(), value]);
    }
    args.extend(["--audience".to_string(), "kubelet".to_string()]);
    Ok(KubeletPlugin {
        args,
        copies,
        binary: binary.to_path_buf(),
    })
}

impl KubeletPlugin {
    /// What goes into the machine: (host file, path in the machine, mode) — the binary
    /// (0755), then each file the plugin reads (0600: a client secret).
    pub fn files(&self) -> Vec<(PathBuf, PathBuf, u32)> {
        let mut files = vec![(self.binary.clone(), PathBuf::from(PLUGIN_BINARY), 0o755)];
        files.extend(
            self.copies
                .iter()
                .map(|(from, to)| (from.clone(), to.clone(), 0o600)),
        );
        files
    }
}

/// The kubeconfig the kubelet runs the plugin from.
pub fn kubelet_kubeconfig(
    server: &str,
    ca_data: &str,
    plugin: &KubeletPlugin,
) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "cluster", "cluster": {
            "server": server, "certificate-authority-data": ca_data}}],
        "users": [{"name": "kubelet", "user": {"exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": format!("/{PLUGIN_BINARY}"),
            "args": plugin.args,
            "interactiveMode": "Never",
        }}}],
        "contexts": [{"name": "kubelet", "context": {"cluster": "cluster", "user": "kubelet"}}],
        "current-context": "kubelet",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn the_kubelet_asks_for_its_own_audience_with_the_agents_source_and_files_in_the_machine() {
        let p = kubelet_plugin(
            &strings(&[
                "--token-url",
                "https://idp.example/token",
                "--client-id=node-a",
                "--client-secret-file",
                "/root/client-secret",
                "--ca-file",
                "/root/idp-ca.pem",
                "--audience",
                "flexnode",
            ]),
            Path::new("/opt/flexnode/current/flexnode"),
        )
        .expect("plugin");
        assert_eq!(
            p.args,
            strings(&[
                "token",
                "--token-url",
                "https://idp.example/token",
                "--client-id",
                "node-a",
                "--client-secret-file",
                "/etc/kubernetes/exec/client-secret-file/client-secret",
                "--ca-file",
                "/etc/kubernetes/exec/ca-file/idp-ca.pem",
                "--audience",
                "kubelet",
            ])
        );
        assert_eq!(
            p.copies,
            [
                (
                    PathBuf::from("/root/client-secret"),
                    PathBuf::from("etc/kubernetes/exec/client-secret-file/client-secret")
                ),
                (
                    PathBuf::from("/root/idp-ca.pem"),
                    PathBuf::from("etc/kubernetes/exec/ca-file/idp-ca.pem")
                ),
            ]
        );
    }

    #[test]
    fn an_option_the_copy_is_not_given_is_refused() {
        let e = kubelet_plugin(&strings(&["--verbose"]), Path::new("/x")).expect_err("refused");
        assert!(e.contains("--verbose"), "{e}");
        let e = kubelet_plugin(&strings(&["--client-id"]), Path::new("/x")).expect_err("refused");
        assert!(e.contains("no value"), "{e}");
    }
}
