//! The tests' watch recorder (tests/support/recording.rs) for the Python suites: every state of
//! every MachineOperation, or of every Machine, one JSON line each on stdout, until killed.
//! e2e/host/lab.py `Recorder` runs it; `cargo test` builds it.
//!
//!     watch-recorder KUBECONFIG operations|machines

#[path = "../tests/support/recording.rs"]
#[allow(dead_code)]
mod recording;

use flexnode::api::{Machine, MachineOperation};
use kube::Client;
use kube::api::Api;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use recording::{Line, Record, Recording, State, machine, operation, record};
use std::io::Write;

/// A sink that prints each line the recording says.
fn printer<T: State + Line>() -> impl FnMut(Record<T>) {
    let mut recording = Recording::default();
    move |told| {
        let Some(line) = recording.say(told) else {
            return;
        };
        let mut out = std::io::stdout().lock();
        // A reader that went away ends the recording.
        if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
            std::process::exit(0);
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [kubeconfig, what] = args.as_slice() else {
        anyhow::bail!("usage: watch-recorder KUBECONFIG operations|machines");
    };
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    let client = Client::try_from(config)?;
    match what.as_str() {
        "operations" => record(Api::<MachineOperation>::all(client), operation, printer()).await,
        "machines" => record(Api::<Machine>::all(client), machine, printer()).await,
        other => anyhow::bail!("watch-recorder: {other:?}: want operations or machines"),
    }
    Ok(())
}
