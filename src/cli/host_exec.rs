//! `flexnode host-exec`: the child half of `src/effects/host/exec.rs`. It runs before any
//! runtime or thread exists (`main` parses, then dispatches here), so `chroot` changes the root
//! of the only thread, and `exec` replaces this process: the program inherits nothing of the
//! agent but its arguments, stdio and a fixed `PATH`.

use crate::effects::host::CHECK_PATH;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::ExitCode;

/// As a shell reports them: the program could not be run, or was not found.
const EXIT_CANNOT_RUN: u8 = 126;
const EXIT_NOT_FOUND: u8 = 127;

/// `command`: the program, then its arguments (clap requires at least the program).
pub fn run(root: &Path, command: &[OsString]) -> ExitCode {
    let Some((program, args)) = command.split_first() else {
        return ExitCode::from(EXIT_CANNOT_RUN);
    };
    let program = Path::new(program);
    if !program.is_absolute() {
        eprintln!(
            "flexnode host-exec: {} is not an absolute path",
            program.display()
        );
        return ExitCode::from(EXIT_CANNOT_RUN);
    }
    if let Err(e) = std::os::unix::fs::chroot(root).and_then(|()| std::env::set_current_dir("/")) {
        eprintln!("flexnode host-exec: chroot {}: {e}", root.display());
        return ExitCode::from(EXIT_CANNOT_RUN);
    }
    let e = std::process::Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", CHECK_PATH)
        .exec();
    eprintln!("flexnode host-exec: {}: {e}", program.display());
    ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
        EXIT_NOT_FOUND
    } else {
        EXIT_CANNOT_RUN
    })
}
