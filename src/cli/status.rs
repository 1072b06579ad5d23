//! `flexnode status` and `flexnode history`: read the store directly, so they work while the
//! daemon is stopped (and while it runs: the store has one writer and any number of readers).

use super::{EXIT_NO_STORE, Output, json, yaml};
use crate::report;
use crate::store::{StoreError, StoreReader};
use std::path::Path;
use std::process::ExitCode;

pub fn status(state: &Path, output: Output) -> ExitCode {
    read(state, |reader| {
        let report = report::build(reader)?;
        Ok(match output {
            Output::Human => report::render_human(&report),
            Output::Json => json(&report),
            Output::Yaml => yaml(&report),
        })
    })
}

pub fn history(state: &Path, limit: i64, output: Output) -> ExitCode {
    read(state, |reader| {
        let entries = reader.journal(limit.max(1))?;
        Ok(match output {
            Output::Human => entries
                .iter()
                .map(|e| report::journal_line(e) + "\n")
                .collect(),
            Output::Json => json(&entries),
            Output::Yaml => yaml(&entries),
        })
    })
}

fn read(path: &Path, render: impl FnOnce(&StoreReader) -> Result<String, StoreError>) -> ExitCode {
    let result = StoreReader::open(path).and_then(|reader| render(&reader));
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e @ StoreError::Missing(_)) => {
            eprintln!("flexnode: {e}");
            ExitCode::from(EXIT_NO_STORE)
        }
        Err(e) => {
            eprintln!("flexnode: {e}");
            ExitCode::FAILURE
        }
    }
}
