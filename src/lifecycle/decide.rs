//! The repave decision table: what the Node and Machine ask of a resting node (the table in
//! docs/design.md, "The state machine").

use super::input::{GoalObservation, MachineObservation, NodeObservation};
use super::state::Goal;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GoalDecision {
    /// Row 1: deletion taint + Machine gone → reset the node and stop the daemon.
    ResetDelete,
    /// Row 2: tainted, Machine still there.
    WaitForMachineDelete,
    /// Rows 3 and 8: never wipe on a 404 alone; a changed goal waits for the Node to go.
    WaitForNodeSignal,
    /// Row 4: the read returned nothing.
    Noop,
    /// Rows 5 and 7: the goal is applied.
    Applied,
    /// Row 6: the goal changed and the Node is gone → repave to the other side.
    ApplyGoal(Goal),
}

pub fn decide(obs: &GoalObservation, applied: &Goal) -> GoalDecision {
    match (&obs.node, &obs.machine) {
        (_, MachineObservation::Unknown) => GoalDecision::Noop,
        (
            NodeObservation::Present {
                deletion_taint: true,
            },
            MachineObservation::Missing,
        ) => GoalDecision::ResetDelete,
        (
            NodeObservation::Present {
                deletion_taint: true,
            },
            MachineObservation::Present(_),
        ) => GoalDecision::WaitForMachineDelete,
        (
            NodeObservation::Absent
            | NodeObservation::Present {
                deletion_taint: false,
            },
            MachineObservation::Missing,
        ) => GoalDecision::WaitForNodeSignal,
        (node, MachineObservation::Present(goal)) => {
            let applied_now = goal.generation > 0 && goal.generation == applied.generation;
            match (node, applied_now) {
                (_, true) => GoalDecision::Applied,
                (NodeObservation::Absent, false) => GoalDecision::ApplyGoal(goal.clone()),
                (NodeObservation::Present { .. }, false) => GoalDecision::WaitForNodeSignal,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn goal(generation: i64) -> Goal {
        Goal::new(generation, "v1.34.2")
    }

    #[test]
    fn decision_table_rows() {
        use GoalDecision as D;
        use MachineObservation as M;
        use NodeObservation as N;
        let tainted = N::Present {
            deletion_taint: true,
        };
        let present = N::Present {
            deletion_taint: false,
        };
        let applied = goal(3);
        let rows: Vec<(u8, N, M, D)> = vec![
            (1, tainted, M::Missing, D::ResetDelete),
            (2, tainted, M::Present(goal(3)), D::WaitForMachineDelete),
            (2, tainted, M::Present(goal(4)), D::WaitForMachineDelete),
            (3, present, M::Missing, D::WaitForNodeSignal),
            (3, N::Absent, M::Missing, D::WaitForNodeSignal),
            (4, present, M::Unknown, D::Noop),
            (4, tainted, M::Unknown, D::Noop),
            (4, N::Absent, M::Unknown, D::Noop),
            (5, N::Absent, M::Present(goal(3)), D::Applied),
            (6, N::Absent, M::Present(goal(4)), D::ApplyGoal(goal(4))),
            (6, N::Absent, M::Present(goal(0)), D::ApplyGoal(goal(0))),
            (7, present, M::Present(goal(3)), D::Applied),
            (8, present, M::Present(goal(4)), D::WaitForNodeSignal),
        ];
        for (row, node, machine, want) in rows {
            let obs = GoalObservation { node, machine };
            assert_eq!(decide(&obs, &applied), want, "row {row}");
        }
    }
}
