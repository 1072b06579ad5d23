//! Timeouts and limits as plain data.

/// Seconds each non-resting state may take before its deadline fires.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    pub join_secs: i64,
    pub reboot_secs: i64,
    pub stage_secs: i64,
    pub switch_secs: i64,
    pub handoff_secs: i64,
    pub rollback_secs: i64,
    pub repave_secs: i64,
    pub reset_secs: i64,
    /// How long an AgentReset keeps trying (at each tick) to get its result to the API server
    /// before it uninstalls anyway: longer than an API server's restart or a few minutes'
    /// outage (docs/reliability.md, "The API server away").
    pub publish_secs: i64,
    /// Delay of the transient restart timer that ends the old daemon: long enough for its
    /// last commit (the restart's outcome, under a millisecond natively); a restart that
    /// comes sooner is found by the new daemon's probe (src/exec/apply.rs), not repeated.
    pub restart_delay_ms: u64,
    /// The drain before a disruption (the configuration's `drain`).
    pub drain: super::drain::DrainPolicy,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            join_secs: 1800,
            reboot_secs: 600,
            stage_secs: 900,
            switch_secs: 120,
            handoff_secs: 300,
            rollback_secs: 300,
            repave_secs: 1800,
            reset_secs: 600,
            publish_secs: 600,
            restart_delay_ms: 100,
            drain: super::drain::DrainPolicy::default(),
        }
    }
}
