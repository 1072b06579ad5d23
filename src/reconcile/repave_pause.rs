//! The pace of repave retries. A repave that failed is tried again after a pause, not at the
//! next observation: with a registry away, or after a boot with containerd not up yet, the
//! daemon would otherwise start one, fail and remove the half-built side about once a
//! second (docs/reliability.md, "Power-cut soak"). The pause doubles with each failure of
//! the same goal up to [`MOST`]; a new goal (another Machine generation) is tried at once.
//!
//! It is kept by the daemon, not in the core's state: it paces a decision the core makes
//! and does not change it. A restarted daemon tries once at once, as an operator who
//! restarts it after fixing the cause would want.

use crate::exec::Fed;
use crate::lifecycle::NodeState;
use crate::lifecycle::input::{GoalObservation, MachineObservation, NodeObservation};
use std::time::{Duration, Instant};

/// The longest pause between two tries of one goal.
pub const MOST: Duration = Duration::from_secs(900);

#[derive(Debug)]
pub struct RepavePause {
    first: Duration,
    last: Option<Failed>,
}

#[derive(Debug)]
struct Failed {
    generation: i64,
    failures: u32,
    until: Instant,
}

impl RepavePause {
    /// `first`: the pause after a goal's first failure.
    pub fn new(first: Duration) -> Self {
        Self { first, last: None }
    }

    /// Whether a repave to `generation` must still wait at `now`.
    pub fn waits(&self, generation: i64, now: Instant) -> bool {
        self.last
            .as_ref()
            .is_some_and(|f| f.generation == generation && now < f.until)
    }

    /// A repave to `generation` failed at `now`: the goal's failures so far, and the pause
    /// before its next try.
    pub fn failed(&mut self, generation: i64, now: Instant) -> (u32, Duration) {
        let failures = match &self.last {
            Some(f) if f.generation == generation => f.failures.saturating_add(1),
            Some(_) | None => 1,
        };
        let pause = self
            .first
            .saturating_mul(1 << (failures - 1).min(16))
            .min(MOST);
        self.last = Some(Failed {
            generation,
            failures,
            until: now + pause,
        });
        (failures, pause)
    }

    /// The goal was applied.
    pub fn clear(&mut self) {
        self.last = None;
    }

    /// What became of an observation fed in `before` that starts a repave (the node at
    /// rest, its Node absent, a goal not applied): applied, or failed and paused.
    pub fn observed(
        &mut self,
        before: &NodeState,
        observed: &GoalObservation,
        fed: &Fed,
        node_name: &str,
    ) {
        let (NodeState::Ready { node }, NodeObservation::Absent, MachineObservation::Present(goal)) =
            (before, &observed.node, &observed.machine)
        else {
            return;
        };
        if goal.generation <= 0 || goal.generation == node.applied.generation {
            return;
        }
        let Fed::Accepted(after) = fed else {
            return;
        };
        match after.as_ref() {
            NodeState::Ready { node } if node.applied.generation == goal.generation => {
                self.clear();
            }
            NodeState::Ready { .. } => {
                let (failures, pause) = self.failed(goal.generation, Instant::now());
                tracing::warn!(
                    node = %node_name,
                    generation = goal.generation,
                    failures,
                    retry_secs = pause.as_secs(),
                    "the repave failed {failures} time(s) in a row; it is tried again in {} s \
                     (why: the Machine's NodeUpdated condition)",
                    pause.as_secs()
                );
            }
            // Still under way, or another state: nothing ended.
            NodeState::Unjoined { .. }
            | NodeState::Joining { .. }
            | NodeState::Rebooting { .. }
            | NodeState::Upgrading { .. }
            | NodeState::Repaving { .. }
            | NodeState::Resetting { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pause_doubles_per_failure_of_one_goal_up_to_the_most() {
        let mut p = RepavePause::new(Duration::from_secs(15));
        let t0 = Instant::now();
        assert!(!p.waits(4, t0), "nothing failed yet");
        assert_eq!(p.failed(4, t0), (1, Duration::from_secs(15)));
        assert!(p.waits(4, t0 + Duration::from_secs(14)));
        assert!(!p.waits(4, t0 + Duration::from_secs(15)));
        assert!(!p.waits(5, t0), "another goal is tried at once");
        assert_eq!(p.failed(4, t0).1, Duration::from_secs(30));
        assert_eq!(p.failed(4, t0).1, Duration::from_secs(60));
        for _ in 0..40 {
            p.failed(4, t0);
        }
        assert_eq!(p.failed(4, t0).1, MOST);
        // A new goal starts over; an applied one forgets.
        assert_eq!(p.failed(5, t0), (1, Duration::from_secs(15)));
        p.clear();
        assert!(!p.waits(5, t0));
    }
}
