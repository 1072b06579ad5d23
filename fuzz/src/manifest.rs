//! Target `manifest`: what a registry answers for a pinned image, as a pull resolves it
//! (`src/effects/containerd/manifest.rs`): the media type, an index narrowed to the platform,
//! the image manifest, the config's diffIDs; and a registry credentials file
//! (`basic_credentials` in `src/effects/containerd/registry.rs`). What is accepted is well
//! formed; a refusal is one short line (a registry must not write pages into a status).
//!
//! Input: one byte choosing the registry's Content-Type, then the document.

use crate::common::{Outcome, assert_short_line};
use flexnode::effects::containerd::manifest::{
    Manifest, config_diff_ids, is_index, media_type_of, pick_platform,
};
use flexnode::effects::containerd::{
    MEDIA_DOCKER_LIST, MEDIA_DOCKER_MANIFEST, MEDIA_OCI_INDEX, MEDIA_OCI_MANIFEST,
    basic_credentials,
};
use flexnode::lifecycle::agent::Sha256Hex;
use std::path::Path;

const DIGEST: &str = "sha256:abababababababababababababababababababababababababababababababab";
const MAX_MESSAGE: usize = 400;

pub fn check(data: &[u8], _scratch: &Path) -> Outcome {
    let Some((&choice, doc)) = data.split_first() else {
        return Outcome::Rejected;
    };
    let content_type = [
        None,
        Some(MEDIA_OCI_INDEX),
        Some(MEDIA_OCI_MANIFEST),
        Some(MEDIA_DOCKER_LIST),
        Some(MEDIA_DOCKER_MANIFEST),
        Some("application/json; charset=utf-8"),
    ][usize::from(choice) % 6];
    let mut outcome = Outcome::Rejected;
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(doc) {
        let media_type = media_type_of(&json, content_type);
        if is_index(&media_type) {
            match pick_platform(&json, DIGEST, "linux", "amd64") {
                Ok((pos, desc)) => {
                    let entry = &json["manifests"][pos];
                    assert_eq!(entry["platform"]["os"], "linux");
                    assert_eq!(entry["platform"]["architecture"], "amd64");
                    let first = json["manifests"].as_array().and_then(|m| {
                        m.iter().position(|e| {
                            e["platform"]["os"] == "linux"
                                && e["platform"]["architecture"] == "amd64"
                        })
                    });
                    assert_eq!(first, Some(pos), "not the first matching entry");
                    assert!(!is_index(&desc.media_type));
                    check_descriptor(&desc.digest, desc.size);
                    outcome = Outcome::Accepted;
                }
                Err(e) => assert_short_line(&e.to_string(), MAX_MESSAGE, "pick_platform"),
            }
        }
    }
    match Manifest::parse(doc, DIGEST) {
        Ok(m) => {
            check_descriptor(&m.config.digest, m.config.size);
            assert!(!m.layers.is_empty());
            for l in &m.layers {
                check_descriptor(&l.digest, l.size);
            }
            outcome = Outcome::Accepted;
        }
        Err(e) => assert_short_line(&e.to_string(), MAX_MESSAGE, "Manifest::parse"),
    }
    match config_diff_ids(doc, DIGEST) {
        Ok(ids) => {
            for id in ids {
                check_descriptor(&id, 0);
            }
        }
        Err(e) => assert_short_line(&e.to_string(), MAX_MESSAGE, "config_diff_ids"),
    }
    let text = String::from_utf8_lossy(doc);
    match basic_credentials(&text, "r.example") {
        Ok(Some((user, _))) => assert!(!user.is_empty() || text.contains("auth")),
        Ok(None) => {}
        Err(why) => assert_short_line(why, 80, "basic_credentials"),
    }
    outcome
}

fn check_descriptor(digest: &str, size: i64) {
    assert!(size >= 0, "size {size}");
    let hex = digest.strip_prefix("sha256:").expect("a sha256: digest");
    assert_eq!(
        Sha256Hex::parse(hex).map(|h| h.oci()).as_deref(),
        Some(digest)
    );
    assert_eq!(hex, hex.to_ascii_lowercase());
}
