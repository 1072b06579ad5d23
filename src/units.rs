//! The agent's systemd units per install mode, in the order they are written: dependencies
//! first, so `OnFailure=` never names a unit that does not exist yet.

use crate::machine::agent::InstallMode;

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
}
