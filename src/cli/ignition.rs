//! `flexnode ignition`: renders a container install's first boot (src/ignition.rs) from a join
//! config, into a Butane config and its Ignition JSON. Both hold the node's credential, so
//! they are written 0600 and never printed.

use super::{Failure, impossible, wiring};
use crate::config::{Config, ConfigError};
use crate::effects::fs::write_file_atomic;
use crate::ignition::{Credential, Inputs, provisioning};
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;
use std::process::ExitCode;

pub const BUTANE_FILE: &str = "config.bu";
pub const IGNITION_FILE: &str = "config.ign";

pub fn run(config: &Path, out: &Path) -> ExitCode {
    super::finish("ignition", render(config, out))
}

fn render(path: &Path, out: &Path) -> Result<(), Failure> {
    let config = Config::load(path, &wiring::hostname()).map_err(impossible)?;
    let read = |setting: &str, p: &Path| {
        std::fs::read_to_string(p)
            .map_err(|e| impossible(ConfigError::new(setting, format!("{}: {e}", p.display()))))
    };
    let inputs = Inputs {
        credential: match &config.token_join {
            None => Credential::Kubeconfig(read("kubeconfig", &config.kubeconfig)?),
            Some(t) => Credential::ApiServerCa(read("apiServerCAFile", &t.ca_file)?),
        },
        trusted_ca: config
            .trusted_ca_file
            .as_deref()
            .map(|p| read("trustedCAFile", p))
            .transpose()?,
        registry_credentials: config
            .registry_credentials_file
            .as_deref()
            .map(|p| read("registryCredentialsFile", p))
            .transpose()?,
        bootstrap_token: config
            .bootstrap_token_file
            .as_deref()
            .map(|p| read("bootstrapTokenFile", p))
            .transpose()?,
    };
    let p = provisioning(&config, inputs).map_err(|e| Failure::config(e.to_string()))?;
    let butane = p.butane().map_err(|e| Failure::failed(e.to_string()))?;
    let ignition = p.ignition().map_err(|e| Failure::failed(e.to_string()))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(out)
        .map_err(|e| Failure::failed(format!("{}: {e}", out.display())))?;
    for (name, text) in [(BUTANE_FILE, butane), (IGNITION_FILE, ignition)] {
        let file = out.join(name);
        write_file_atomic(&file, text.as_bytes(), 0o600)
            .map_err(|e| Failure::failed(format!("{}: {e}", file.display())))?;
        println!("{}", file.display());
    }
    Ok(())
}
