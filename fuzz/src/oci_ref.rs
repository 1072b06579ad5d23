//! Target `oci_ref`: `oci://` references as AgentUpgrade and the configuration name images
//! (`src/lifecycle/validate.rs:parse_oci_url`). What the validation accepts, the pull must
//! accept as the same image (`RegistryRef::parse` and oci-client's reference in
//! `src/effects/containerd/registry.rs`), and its rendering reads back as itself.
//!
//! Input: the reference; without an `oci://` prefix it is tried with one too.

use crate::common::{MARKER, Outcome, assert_hidden, text};
use flexnode::effects::containerd::registry::{RegistryRef, reference};
use flexnode::lifecycle::agent::{ImageRef, Sha256Hex};
use flexnode::lifecycle::validate::parse_oci_url;
use std::path::Path;

const DIGEST: &str = "abababababababababababababababababababababababababababababababab";

pub fn check(data: &[u8], _scratch: &Path) -> Outcome {
    let raw = text(data);
    let digest = Sha256Hex::parse(DIGEST).expect("hex");
    let mut outcome = Outcome::Rejected;
    let prefixed = format!("oci://{raw}");
    for candidate in [raw.as_str(), prefixed.as_str()] {
        match parse_oci_url(candidate) {
            Ok(image) => {
                check_image(candidate, &image, &digest);
                outcome = Outcome::Accepted;
            }
            Err(e) => {
                let shown = format!("{e} {e:?}");
                assert!(!shown.contains(MARKER), "a rejection shows input: {shown}");
            }
        }
    }
    outcome
}

/// An accepted image: well formed, shown without secrets, read back as itself, and pulled as
/// the same registry and repository.
pub fn check_image(raw: &str, image: &ImageRef, digest: &Sha256Hex) {
    let shown = image.to_string();
    assert_hidden(raw, &format!("{shown} {image:?}"), "an image reference");
    assert!(
        !shown[6..].contains(['@', '?', '#', ' ', '\\']) && !shown.chars().any(char::is_control),
        "{shown:?}"
    );
    assert!(
        !image.registry.is_empty() && !image.repository.is_empty(),
        "{image:?}"
    );
    assert_eq!(
        parse_oci_url(&shown).as_ref(),
        Ok(image),
        "{shown} reads back"
    );
    let pinned = image.pinned(digest);
    let rr = RegistryRef::parse(&pinned, digest)
        .unwrap_or_else(|e| panic!("the pull refuses {pinned:?} ({raw:?}): {e}"));
    assert_eq!(
        (rr.registry.as_str(), rr.repository.as_str()),
        (image.registry.as_str(), image.repository.as_str())
    );
    assert_eq!(rr.pinned(), pinned);
    let r = reference(&pinned).unwrap_or_else(|e| panic!("oci-client refuses {pinned:?}: {e}"));
    assert_eq!(
        r.registry(),
        image.registry,
        "oci-client's registry of {pinned}"
    );
    assert_eq!(
        r.repository(),
        image.repository,
        "oci-client's repository of {pinned}"
    );
    assert_eq!(r.digest(), Some(digest.oci().as_str()));
}
