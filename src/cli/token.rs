//! `flexnode token`: an exec credential plugin (src/identity/exec.rs) a kubeconfig's user
//! names, for the agent and, in the machine, the kubelet.

use super::Failure;
use crate::identity::exec::{Source, exec_credential, fetch};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
#[command(group = clap::ArgGroup::new("source").required(true).args(["token_url", "metadata_url"]))]
pub struct TokenArgs {
    /// An OAuth 2 token endpoint (client-credentials grant: a service principal's shape).
    #[arg(long, value_name = "URL", requires_all = ["client_id", "client_secret_file"])]
    token_url: Option<String>,
    /// The client ID sent to --token-url.
    #[arg(long, value_name = "ID")]
    client_id: Option<String>,
    /// The client secret, in a file only its owner may read (0600); never an argument.
    #[arg(long, value_name = "FILE")]
    client_secret_file: Option<PathBuf>,
    /// A metadata endpoint on the node (a managed identity's shape: `GET URL?resource=AUDIENCE`
    /// with `Metadata: true`).
    #[arg(long, value_name = "URL", conflicts_with_all = ["token_url", "client_id", "client_secret_file"])]
    metadata_url: Option<String>,
    /// Whom the token is for: the API server's JWT authenticator maps it (`kubelet`: the
    /// node's kubelet; otherwise the agent).
    #[arg(long, value_name = "AUDIENCE", default_value = "flexnode")]
    audience: String,
    /// A CA (PEM) the provider's certificate is checked against, besides the system's.
    #[arg(long, value_name = "FILE")]
    ca_file: Option<PathBuf>,
}

pub fn run(args: TokenArgs) -> ExitCode {
    super::block_on("token", async move {
        let source = match (args.token_url, args.metadata_url) {
            (Some(token_url), None) => Source::ClientSecret {
                token_url,
                // clap requires both with --token-url.
                client_id: args.client_id.unwrap_or_default(),
                secret_file: args.client_secret_file.unwrap_or_default(),
            },
            (None, Some(url)) => Source::Metadata { url },
            _ => {
                return Err(Failure::config(
                    "name one of --token-url and --metadata-url",
                ));
            }
        };
        let now = crate::identity::unix_now();
        let token = fetch(&source, &args.audience, args.ca_file.as_deref(), now)
            .await
            .map_err(|e| Failure::failed(format!("no token: {e}")))?;
        println!("{}", exec_credential(&token, now));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::TokenArgs;
    use crate::effects::host::kubelet_plugin::PLUGIN_OPTIONS;
    use clap::{Args, Command};

    #[test]
    fn the_kubelets_copy_knows_every_option_of_the_plugin() {
        let cmd = TokenArgs::augment_args(Command::new("token"));
        let mut options: Vec<String> = cmd
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect();
        options.sort();
        let mut known: Vec<String> = PLUGIN_OPTIONS.iter().map(|(o, _)| o.to_string()).collect();
        known.sort();
        assert_eq!(options, known);
    }
}
