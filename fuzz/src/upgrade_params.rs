//! Target `upgrade_params`: AgentUpgrade parameters as the API server hands them over, through
//! the validation (`src/lifecycle/validate.rs`) and the pure core's claim and the steps after it
//! (`flexnode::lifecycle::step`): the journal lines, effects and published results.
//!
//! Input, one field a line: flags (`c` container install, `a` arm64, `u` an unsupported CPU,
//! `U` no downloadURL, `S` no sha256), downloadURL, sha256, an extra `key=value` parameter.

use crate::common::{MARKER, Outcome, assert_hidden, text};
use crate::oci_ref::check_image;
use flexnode::lifecycle::agent::{AgentBuild, Arch, InstallMode, Sha256Hex, Slot, UpgradeTarget};
use flexnode::lifecycle::input::{Claim, ClaimKind};
use flexnode::lifecycle::policy::Policy;
use flexnode::lifecycle::result::ResultReason;
use flexnode::lifecycle::state::{FinishedOps, Goal, NodeInfo, OpRef, Side};
use flexnode::lifecycle::validate::{InvalidParameter, PARAM_SHA256, PARAM_URL, validate_upgrade};
use flexnode::lifecycle::{Effect, Input, NodeState, Step, Timestamp, step};
use std::collections::BTreeMap;
use std::path::Path;

const INSTALLED: &str = "1111111111111111111111111111111111111111111111111111111111111111";

pub fn check(data: &[u8], _scratch: &Path) -> Outcome {
    let text = text(data);
    let mut fields = text.splitn(4, '\n');
    let flags = fields.next().unwrap_or_default();
    let url = fields.next().unwrap_or_default();
    let sha = fields.next().unwrap_or_default();
    let extra = fields.next().unwrap_or_default();
    let mode = if flags.contains('c') {
        InstallMode::Container
    } else {
        InstallMode::Host
    };
    let arch = if flags.contains('u') {
        Arch::Unsupported
    } else if flags.contains('a') {
        Arch::Arm64
    } else {
        Arch::Amd64
    };
    let mut params = BTreeMap::new();
    if !flags.contains('U') {
        params.insert(PARAM_URL.to_string(), url.to_string());
    }
    if !flags.contains('S') {
        params.insert(PARAM_SHA256.to_string(), sha.to_string());
    }
    if let Some((k, v)) = extra.split_once('=') {
        params.entry(k.to_string()).or_insert_with(|| v.to_string());
    }
    let url = params.get(PARAM_URL).cloned().unwrap_or_default();
    let result = validate_upgrade(mode, arch, &params);
    match &result {
        Err(e) => check_rejection(*e),
        Ok(target) => check_target(mode, &params, target),
    }
    run_claim(mode, arch, &params, &url, &result);
    Outcome::from(&result)
}

/// Every rejection is one of the fixed messages.
fn check_rejection(e: InvalidParameter) {
    let shown = format!("{e} {e:?}");
    assert!(!shown.contains(MARKER), "a rejection shows input: {shown}");
    assert_eq!(e.to_string(), e.message());
}

fn check_target(mode: InstallMode, params: &BTreeMap<String, String>, target: &UpgradeTarget) {
    let raw = params[PARAM_URL].as_str();
    let digest = Sha256Hex::parse(params[PARAM_SHA256].trim()).expect("an accepted digest parses");
    match target {
        UpgradeTarget::Archive { url, sha256 } => {
            assert_eq!(
                mode,
                InstallMode::Host,
                "an archive on the container install"
            );
            assert_eq!(*sha256, digest);
            let parsed = url::Url::parse(url.expose()).expect("an accepted URL parses");
            assert!(matches!(parsed.scheme(), "http" | "https"), "{parsed}");
            assert!(
                parsed.username().is_empty() && parsed.password().is_none(),
                "{parsed}"
            );
            assert!(parsed.fragment().is_none(), "{parsed}");
            assert!(parsed.host_str().is_some_and(|h| !h.is_empty()), "{parsed}");
            // Accepting the URL again gives the same URL (the store keeps the accepted form).
            let again = validate_upgrade(
                InstallMode::Host,
                Arch::Amd64,
                &BTreeMap::from([
                    (PARAM_URL.to_string(), url.expose().to_string()),
                    (PARAM_SHA256.to_string(), digest.as_str().to_string()),
                ]),
            );
            assert_eq!(again.as_ref(), Ok(target), "re-validating {raw:?}");
            assert_hidden(
                raw,
                &format!("{target} {target:?} {url} {url:?}"),
                "the target",
            );
        }
        UpgradeTarget::Image { image, digest: d } => {
            assert_eq!(mode, InstallMode::Container, "an image on the host install");
            assert_eq!(*d, digest);
            check_image(raw, image, d);
            assert_hidden(raw, &format!("{target} {target:?}"), "the target");
        }
    }
    // The store keeps the target as JSON: it reads back the same.
    let json = serde_json::to_string(target).expect("encode");
    let back: UpgradeTarget = serde_json::from_str(&json).expect("decode");
    assert_eq!(&back, target);
}

fn ready(mode: InstallMode, arch: Arch) -> NodeState {
    NodeState::Ready {
        node: NodeInfo {
            name: "fuzz-node".into(),
            mode,
            arch,
            active: Side::Kube1,
            applied: Goal::new(1, "v1.34.2"),
            previous: None,
            agent: match mode {
                InstallMode::Host => AgentBuild::Slot { slot: Slot::Blue },
                InstallMode::Container => AgentBuild::Image {
                    digest: Sha256Hex::parse(INSTALLED).expect("hex"),
                },
            },
            last_good: None,
            finished: FinishedOps::default(),
        },
    }
}

/// The claim on a Ready node, then a failed download, and (separately) the steps of an
/// upgrade that succeeds: no journal line, effect, state or published message shows the
/// secret; rejected parameters finish the operation at once as InvalidParameters.
fn run_claim(
    mode: InstallMode,
    arch: Arch,
    params: &BTreeMap<String, String>,
    url: &str,
    validated: &Result<UpgradeTarget, InvalidParameter>,
) {
    let policy = Policy::default();
    let now = Timestamp::from_millis(1_785_578_400_000);
    let state = ready(mode, arch);
    let claim = Input::OperationClaimed(Claim {
        op: OpRef {
            name: "op-fuzz".into(),
            uid: "uid-fuzz".into(),
        },
        kind: ClaimKind::AgentUpgrade {
            parameters: params.clone(),
        },
        machine_generation: 1,
    });
    assert!(
        !claim.to_string().contains(MARKER),
        "the journal's input line: {claim}"
    );
    let first = step(&state, &claim, &policy, now).expect("a Ready node takes a claim");
    shown_step(url, &state, &claim, &first);
    let published: Vec<_> = published(&first);
    match validated {
        Err(e) => {
            assert_eq!(published.len(), 1, "{:?}", first.effects);
            assert_eq!(published[0].0, ResultReason::InvalidParameters);
            assert_eq!(published[0].1, e.message());
        }
        Ok(target) => {
            assert!(published.is_empty(), "{:?}", first.effects);
            let failed = Input::EffectsFailed {
                message: format!("download of {target} failed: HTTP 404"),
            };
            let mut at = now;
            for inputs in [
                vec![failed],
                vec![
                    Input::EffectsDone,
                    Input::EffectsDone,
                    Input::DaemonStarted {
                        running: candidate(&first.next),
                        selected: Some(candidate(&first.next)),
                    },
                    Input::EffectsDone,
                    Input::EffectsDone,
                ],
            ] {
                let mut state = first.next.clone();
                for input in inputs {
                    at = at.plus_secs(1);
                    if let Ok(next) = step(&state, &input, &policy, at) {
                        shown_step(url, &state, &input, &next);
                        state = next.next;
                    }
                }
            }
        }
    }
}

fn candidate(state: &NodeState) -> AgentBuild {
    match state {
        NodeState::Upgrading { candidate, .. } => candidate.clone(),
        other => panic!("an accepted upgrade stages: {other}"),
    }
}

fn published(s: &Step) -> Vec<(ResultReason, String)> {
    s.effects
        .iter()
        .filter_map(|e| match e {
            Effect::PublishResult { result, .. } => Some((result.reason, result.message.clone())),
            _ => None,
        })
        .collect()
}

/// What the store's journal and the logs show of one step, and what it publishes.
fn shown_step(url: &str, from: &NodeState, input: &Input, s: &Step) {
    let mut shown = format!("{from} --{input}--> {} {:?}", s.next, s.next);
    // Debug shows every field, the messages to publish included.
    for e in &s.effects {
        shown.push_str(&format!(" {e} {e:?}"));
    }
    assert_hidden(url, &shown, "a step");
}
