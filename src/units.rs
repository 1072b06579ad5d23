//! The agent's systemd units per install mode, in the order they are written: dependencies
//! first, so `OnFailure=` never names a unit that does not exist yet.

use crate::effects::EffectResult;
use crate::effects::fs::{read_small, write_file_atomic};
use crate::lifecycle::agent::InstallMode;
use std::path::Path;

/// What every unit's `Documentation=` names, in both install modes (`units/README.md`): written
/// with the configuration by `flexnode join`, again at each daemon start (so an upgraded build
/// brings its own text), and on the container install by Ignition beside the bootstrap unit.
pub const DOC_PATH: &str = "/etc/flexnode/README.md";
pub const DOC: &str = include_str!("../units/README.md");
/// The directory it is in: the runtime directory.
pub const DOC_DIR: &str = "/etc/flexnode";
const DOC_NAME: &str = "README.md";

/// Writes [`DOC`] into the runtime directory `dir` (the host's `/etc/flexnode`) unless it is
/// there already.
pub fn write_doc(dir: &Path) -> EffectResult {
    let path = dir.join(DOC_NAME);
    if read_small(&path, DOC.len() as u64 + 1, false)?.as_deref() == Some(DOC) {
        return Ok(());
    }
    write_file_atomic(&path, DOC.as_bytes(), 0o644)
}

const HOST: &[(&str, &str)] = &[
    (
        "flexnode-agent-recovery.service",
        include_str!("../units/host/flexnode-agent-recovery.service"),
    ),
    (
        "flexnode-reset.service",
        include_str!("../units/host/flexnode-reset.service"),
    ),
    (
        "flexnode-bootstrap.service",
        include_str!("../units/host/flexnode-bootstrap.service"),
    ),
    (
        "flexnode-agent.service",
        include_str!("../units/host/flexnode-agent.service"),
    ),
];

const CONTAINER: &[(&str, &str)] = &[
    (
        "flexnode-agent-recovery.service",
        include_str!("../units/container/flexnode-agent-recovery.service"),
    ),
    (
        "flexnode-reset.service",
        include_str!("../units/container/flexnode-reset.service"),
    ),
    (
        "flexnode-bootstrap.service",
        include_str!("../units/container/flexnode-bootstrap.service"),
    ),
    (
        "flexnode-agent.service",
        include_str!("../units/container/flexnode-agent.service"),
    ),
];

pub fn for_mode(mode: InstallMode) -> &'static [(&'static str, &'static str)] {
    match mode {
        InstallMode::Host => HOST,
        InstallMode::Container => CONTAINER,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_unit_is_written_before_the_unit_that_names_it() {
        for mode in [InstallMode::Host, InstallMode::Container] {
            let units = for_mode(mode);
            let pos = |n: &str| units.iter().position(|(name, _)| *name == n);
            assert!(pos("flexnode-agent-recovery.service") < pos("flexnode-agent.service"));
            let (_, agent) = units[units.len() - 1];
            assert!(agent.contains("OnFailure=flexnode-agent-recovery.service"));
            let (_, bootstrap) = units[2];
            assert!(bootstrap.contains("RestartPreventExitStatus=78"));
        }
    }

    #[test]
    fn every_unit_documents_itself_with_the_file_the_agent_writes() {
        assert_eq!(Path::new(DOC_DIR).join(DOC_NAME), Path::new(DOC_PATH));
        for mode in [InstallMode::Host, InstallMode::Container] {
            for (name, text) in for_mode(mode) {
                let docs: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("Documentation="))
                    .collect();
                assert_eq!(docs, [format!("file://{DOC_PATH}")], "{name}");
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        write_doc(dir.path()).expect("write");
        let path = dir.path().join(DOC_NAME);
        assert_eq!(std::fs::read_to_string(&path).expect("read"), DOC);
        std::fs::write(&path, "older text").expect("write");
        write_doc(dir.path()).expect("rewrite");
        assert_eq!(std::fs::read_to_string(&path).expect("read"), DOC);
    }
}
