//! The exhaustive crash simulation's parts: actions on a simulated node
//! (`action.rs`), scenarios found from the transition table (`explore.rs`), and runs with
//! planned deaths judged against the run without (`crashes.rs`).

pub mod action;
pub mod crashes;
pub mod explore;
