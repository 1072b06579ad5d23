//! Target `archive_url`: a host install's download URL and the redirects a server answers
//! with: the validation (`src/lifecycle/validate.rs`), the one redaction (`redact_url` in
//! `src/lifecycle/agent.rs`, which `flexnode op get` applies to whatever the cluster holds), and
//! the redirect policy (`src/effects/http.rs:redirect_target`).
//!
//! Input: the URL, then (next line) a redirect's `Location`.

use crate::common::{MARKER, Outcome, assert_hidden, text};
use flexnode::api::MachineOperation;
use flexnode::api::machine_operation::{MachineOperationSpec, OperationKind};
use flexnode::cli::op::show::{human, redacted};
use flexnode::effects::http::redirect_target;
use flexnode::lifecycle::agent::{Arch, InstallMode, UpgradeTarget, redact_url};
use flexnode::lifecycle::validate::{PARAM_SHA256, PARAM_URL, validate_upgrade};
use std::collections::BTreeMap;
use std::path::Path;

const HEX: &str = "5d41402abc4b2a76b9719d911017c5925d41402abc4b2a76b9719d911017c592";

pub fn check(data: &[u8], _scratch: &Path) -> Outcome {
    let text = text(data);
    let (raw, location) = text.split_once('\n').unwrap_or((&text, ""));
    let params = BTreeMap::from([
        (PARAM_URL.to_string(), raw.to_string()),
        (PARAM_SHA256.to_string(), HEX.to_string()),
    ]);
    let result = validate_upgrade(InstallMode::Host, Arch::Amd64, &params);
    match &result {
        Err(e) => assert!(!format!("{e} {e:?}").contains(MARKER), "{e}"),
        Ok(UpgradeTarget::Archive { url, .. }) => {
            assert_hidden(raw, &format!("{url} {url:?}"), "an archive URL");
        }
        Ok(other) => panic!("the host install accepted {other:?}"),
    }
    // What the cluster holds is shown redacted, valid or not.
    assert_hidden(raw, &redact_url(raw), "redact_url");
    let op = MachineOperation::new(
        "op-fuzz",
        MachineOperationSpec {
            machine_ref: Some("node".into()),
            machine_selector: None,
            operation_kind: OperationKind::AgentUpgrade,
            parameters: Some(params),
            ttl_seconds_after_finished: None,
        },
    );
    let json = redacted(&op).map(|v| v.to_string()).unwrap_or_default();
    assert_hidden(raw, &format!("{json} {}", human(&op)), "flexnode op get");
    check_redirect(raw, location);
    Outcome::from(&result)
}

/// A redirect is followed only to http(s), never from https down to http, never to
/// credentials, never keeping a fragment.
fn check_redirect(raw: &str, location: &str) {
    let Ok(from) = url::Url::parse(raw) else {
        return;
    };
    if !matches!(from.scheme(), "http" | "https") {
        return;
    }
    let location = (!location.is_empty()).then_some(location);
    for followed in [0, 9, 10] {
        match redirect_target(&from, location, followed, 10) {
            Ok(next) => {
                assert!(followed < 10);
                assert!(matches!(next.scheme(), "http" | "https"), "{next}");
                assert!(
                    !(from.scheme() == "https" && next.scheme() == "http"),
                    "{from} -> {next}"
                );
                assert!(
                    next.username().is_empty() && next.password().is_none(),
                    "{next}"
                );
                assert!(next.fragment().is_none(), "{next}");
                assert!(next.host_str().is_some_and(|h| !h.is_empty()), "{next}");
            }
            Err(refusal) => {
                assert!(!refusal.to_string().contains(MARKER));
            }
        }
    }
}
