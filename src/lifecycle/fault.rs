//! A bad environment, named once: what the agent found (a damaged, missing or newer store, a
//! configuration it cannot read, a full or read-only filesystem), the one reason every channel
//! reports it under (the Machine's `NodeUpdated` condition and Event, the log, systemd's
//! STATUS, `flexnode status`), what to do about it, and who can end it: an operator (the
//! daemon exits 78, which its unit does not restart) or time (the daemon waits, reporting, and
//! resumes by itself). Finding one is the store's (src/store/fault.rs); holding and clearing one, the daemon's
//! (src/reconcile/fault.rs).

use serde::Serialize;
use std::fmt;
use std::path::{Path, PathBuf};

/// The reason of the Machine's Event when a fault is over.
pub const FAULT_CLEARED: &str = "FaultCleared";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A host with the agent's units but no store: never started afresh (that would forget
    /// the node and every operation it ran).
    StoreMissing,
    /// The store fails SQLite's check, has no schema, or holds a state that does not decode.
    StoreCorrupt,
    /// The store was migrated by a newer flexnode than this one.
    StoreSchemaTooNew,
    StoreDirectoryInsecure,
    /// No space left where the store is: its writes fail, so no step can start.
    DiskFull,
    StoreReadOnly,
    StoreIOError,
    ConfigMissing,
    ConfigUnreadable,
    ConfigInvalid,
    /// `/etc` cannot be written: units, machine settings and runtime files live there.
    EtcReadOnly,
    /// The agent's certificate expired (the node was off past its renewal) and the bootstrap
    /// token could not replace it.
    CertificateExpired,
}

impl FaultKind {
    pub const ALL: [Self; 12] = [
        Self::StoreMissing,
        Self::StoreCorrupt,
        Self::StoreSchemaTooNew,
        Self::StoreDirectoryInsecure,
        Self::DiskFull,
        Self::StoreReadOnly,
        Self::StoreIOError,
        Self::ConfigMissing,
        Self::ConfigUnreadable,
        Self::ConfigInvalid,
        Self::EtcReadOnly,
        Self::CertificateExpired,
    ];

    /// The reason of the Machine's condition and Event, the log's `reason=` and STATUS's
    /// first word.
    pub fn reason(self) -> &'static str {
        match self {
            Self::StoreMissing => "StoreMissing",
            Self::StoreCorrupt => "StoreCorrupt",
            Self::StoreSchemaTooNew => "StoreSchemaTooNew",
            Self::StoreDirectoryInsecure => "StoreDirectoryInsecure",
            Self::DiskFull => "DiskFull",
            Self::StoreReadOnly => "StoreReadOnly",
            Self::StoreIOError => "StoreIOError",
            Self::ConfigMissing => "ConfigMissing",
            Self::ConfigUnreadable => "ConfigUnreadable",
            Self::ConfigInvalid => "ConfigInvalid",
            Self::EtcReadOnly => "EtcReadOnly",
            Self::CertificateExpired => "CertificateExpired",
        }
    }

    /// The kind `reason` wrote, or `None` for any other text.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.reason() == s)
    }

    /// Only an operator can end it: the daemon exits 78 (EX_CONFIG), which its unit does not
    /// restart. The others can pass without one (space freed, a filesystem remounted, a
    /// transient I/O error): the daemon waits and resumes.
    pub fn needs_operator(self) -> bool {
        match self {
            Self::StoreMissing
            | Self::StoreCorrupt
            | Self::StoreSchemaTooNew
            | Self::StoreDirectoryInsecure
            | Self::ConfigMissing
            | Self::ConfigUnreadable
            | Self::ConfigInvalid
            | Self::CertificateExpired => true,
            Self::DiskFull | Self::StoreReadOnly | Self::StoreIOError | Self::EtcReadOnly => false,
        }
    }
}

impl Serialize for FaultKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.reason())
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.reason())
    }
}

/// One bad environment: its kind, the file or directory concerned, and what was found (an
/// error's text, never a file's contents).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    pub path: PathBuf,
    pub detail: String,
}

/// A fault as `flexnode status -o json` carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Problem {
    pub reason: FaultKind,
    pub message: String,
    pub remedy: String,
    /// True when the agent waits for it to pass by itself.
    pub transient: bool,
}

impl Fault {
    /// `detail` becomes one line (SQLite's integrity report has one per damaged page): each
    /// channel carries a fault as one line.
    pub fn new(kind: FaultKind, path: &Path, detail: impl Into<String>) -> Self {
        let detail: String = detail.into();
        Self {
            kind,
            path: path.to_path_buf(),
            detail: detail
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; "),
        }
    }

    /// What is wrong, in one sentence.
    pub fn message(&self) -> String {
        let p = self.path.display();
        let d = &self.detail;
        let with = |s: String| {
            if d.is_empty() {
                s
            } else {
                format!("{s} ({d})")
            }
        };
        match self.kind {
            FaultKind::StoreMissing => format!(
                "the node's store {p} is missing, but the agent is installed; a new store \
                 would forget the node and the operations it ran"
            ),
            FaultKind::StoreCorrupt => with(format!(
                "the node's store {p} is damaged; the agent does not guess at damaged state"
            )),
            FaultKind::StoreSchemaTooNew => with(format!(
                "the node's store {p} was written by a newer flexnode than this one"
            )),
            FaultKind::StoreDirectoryInsecure => format!(
                "the store's directory {p} is accessible by group or others, or not owned by \
                 the agent's user"
            ),
            FaultKind::DiskFull => with(format!(
                "no space left on the filesystem of {p}: the store cannot be written, so no \
                 step starts"
            )),
            FaultKind::StoreReadOnly => with(format!(
                "the filesystem of {p} is read-only: the store cannot be written, so no step \
                 starts"
            )),
            FaultKind::StoreIOError => with(format!("the store {p} cannot be written")),
            FaultKind::ConfigMissing => format!("the configuration {p} is missing"),
            FaultKind::ConfigUnreadable => with(format!("the configuration {p} cannot be read")),
            FaultKind::ConfigInvalid => with(format!(
                "the configuration {p} has a setting that cannot work"
            )),
            FaultKind::EtcReadOnly => format!(
                "{p} is read-only: the agent cannot write its units, machine settings and \
                 runtime files, so it starts no new work"
            ),
            FaultKind::CertificateExpired => with(format!(
                "the agent's certificate in {p} expired and the bootstrap token did not replace \
                 it"
            )),
        }
    }

    /// What to do next.
    pub fn remedy(&self) -> String {
        let p = self.path.display();
        let restart =
            "then `systemctl reset-failed flexnode-agent; systemctl start flexnode-agent`";
        let reset = "or run `flexnode reset --yes` (it sets the store aside and removes the \
                     machines, units and links) and join again with `flexnode join --config FILE`";
        match self.kind {
            FaultKind::StoreMissing => format!(
                "if {p} lives on a filesystem that is not mounted, mount it, {restart}; \
                 otherwise restore it from a backup, {restart}; {reset}"
            ),
            FaultKind::StoreCorrupt => {
                format!("with the agent stopped, restore {p} from a backup, {restart}; {reset}")
            }
            FaultKind::StoreSchemaTooNew => format!(
                "run the flexnode build that wrote it or a newer one (`/opt/flexnode/lib` \
                 keeps the installed builds; `flexnode join --config FILE` run from it \
                 converges), or restore {p} from a backup taken before that build ran, {restart}"
            ),
            FaultKind::StoreDirectoryInsecure => {
                format!("`chown root: {p}` and `chmod 700 {p}`, {restart}")
            }
            FaultKind::DiskFull => {
                format!("free space on the filesystem of {p}; the agent resumes by itself")
            }
            FaultKind::StoreReadOnly => format!(
                "remount the filesystem of {p} read-write (`dmesg` tells whether errors made \
                 the kernel remount it read-only); the agent resumes by itself"
            ),
            FaultKind::StoreIOError => {
                "check the disk (`dmesg`); the agent retries by itself".to_string()
            }
            FaultKind::ConfigMissing | FaultKind::ConfigUnreadable => format!(
                "reinstall it: run `flexnode join --config FILE` with the node's join \
                 configuration (on a joined host it converges: it rewrites {p} and starts the \
                 agent)"
            ),
            FaultKind::ConfigInvalid => format!(
                "fix the setting named (docs/config.md) and run `flexnode join --config FILE` \
                 again, which rewrites {p} and starts the agent"
            ),
            FaultKind::EtcReadOnly => {
                format!("remount {p} read-write; operations wait as Pending and run once it is")
            }
            FaultKind::CertificateExpired => format!(
                "put a bootstrap token bound to this node (auth-extra-groups \
                 system:bootstrappers:flexnode:<node>, docs/config.md) in \
                 /etc/flexnode/bootstrap-token (0600), {restart}; or run `flexnode join \
                 --config FILE` with a valid credential, which rewrites {p}"
            ),
        }
    }

    pub fn problem(&self) -> Problem {
        Problem {
            reason: self.kind,
            message: self.message(),
            remedy: self.remedy(),
            transient: !self.kind.needs_operator(),
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind, self.message())
    }
}

impl std::error::Error for Fault {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_back_exactly_and_are_condition_reasons() {
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::parse(k.reason()), Some(k));
            // metav1.Condition's reason: ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$
            assert!(k.reason().chars().all(|c| c.is_ascii_alphanumeric()));
            let f = Fault::new(k, Path::new("/x"), "");
            assert!(!f.message().is_empty() && !f.remedy().is_empty());
        }
        assert_eq!(FaultKind::parse("storecorrupt"), None);
        assert_eq!(FaultKind::parse(FAULT_CLEARED), None);
    }

    #[test]
    fn only_operator_faults_end_the_daemon() {
        let waited: Vec<_> = FaultKind::ALL
            .into_iter()
            .filter(|k| !k.needs_operator())
            .collect();
        assert_eq!(
            waited,
            [
                FaultKind::DiskFull,
                FaultKind::StoreReadOnly,
                FaultKind::StoreIOError,
                FaultKind::EtcReadOnly
            ]
        );
    }

    #[test]
    fn a_damaged_store_says_how_to_recover() {
        let f = Fault::new(
            FaultKind::StoreCorrupt,
            Path::new("/var/lib/flexnode/state.db"),
            "database disk image is malformed",
        );
        assert!(f.message().contains("malformed"), "{}", f.message());
        assert!(f.remedy().contains("backup"), "{}", f.remedy());
        assert!(
            f.remedy().contains("flexnode reset --yes"),
            "{}",
            f.remedy()
        );
        assert!(f.to_string().starts_with("StoreCorrupt: "));
        let f = Fault::new(
            FaultKind::StoreCorrupt,
            Path::new("/s"),
            "*** in database main ***\nTree 2 page 2: bad\n",
        );
        assert_eq!(f.detail, "*** in database main ***; Tree 2 page 2: bad");
    }
}
