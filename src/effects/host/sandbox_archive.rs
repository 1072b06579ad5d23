//! An offline node's pod sandbox image (`sandboxImageArchive`): the archive is copied into
//! each machine and imported into the machine's containerd before its kubelet starts, under
//! the names the CRI looks `sandboxImage` up by, so no pod sandbox ever needs a registry.
//! The machine's own `ctr` imports it: its containerd listens inside the machine only, so
//! there is no socket of it for the agent to reach.

use crate::effects::containerd::OciArchive;
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::validate::parse_pinned_image;
use std::io::Read;
use std::path::Path;

/// Where the archive is in the machine's tree.
pub const SANDBOX_ARCHIVE: &str = "var/lib/flexnode/sandbox-image.oci.tar";
/// The kubelet unit's drop-in that imports it.
pub const SANDBOX_IMPORT_DROP_IN: &str =
    "etc/systemd/system/kubelet.service.d/10-flexnode-sandbox-image.conf";
/// A pause image is a few hundred KiB; an archive far over that is not one.
const MAX_SANDBOX_ARCHIVE: u64 = 64 << 20;

/// The archive at `archive` (checked to hold `sandbox_image`, pinned by digest) and the
/// drop-in that imports it: each file's place in the machine's tree and its contents.
pub fn sandbox_archive_files(
    archive: &Path,
    sandbox_image: &str,
) -> EffectResult<[(&'static str, Vec<u8>); 2]> {
    let failed = |why: String| {
        EffectError::Failed(format!("sandboxImageArchive {}: {why}", archive.display()))
    };
    let (image, digest) = parse_pinned_image(sandbox_image)
        .map_err(|_| failed(format!("sandboxImage {sandbox_image:?} is not pinned")))?;
    let held = OciArchive::open(archive)?.digest_of(image.tag.as_deref().unwrap_or_default())?;
    if held != digest {
        return Err(failed(format!(
            "holds {}, not the sandboxImage's {}",
            held.oci(),
            digest.oci()
        )));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(archive)
        .and_then(|f| f.take(MAX_SANDBOX_ARCHIVE + 1).read_to_end(&mut bytes))
        .map_err(|e| failed(e.to_string()))?;
    if bytes.len() as u64 > MAX_SANDBOX_ARCHIVE {
        return Err(failed(format!(
            "over {} MiB: give an archive of the sandbox image alone (an OCI archive; a \
             directory is not copied into machines)",
            MAX_SANDBOX_ARCHIVE >> 20
        )));
    }
    // `--digests` names it REGISTRY/REPOSITORY@sha256:…, which the CRI finds the pinned
    // sandboxImage by; `--base-name` keeps only the archive's images of that repository.
    let drop_in = format!(
        "# flexnode: the pod sandbox image from the node's archive, before the kubelet runs.\n\
         [Service]\nExecStartPre=/usr/bin/ctr --namespace k8s.io images import --digests \
         --base-name {}/{} /{SANDBOX_ARCHIVE}\n",
        image.registry, image.repository
    );
    Ok([
        (SANDBOX_ARCHIVE, bytes),
        (SANDBOX_IMPORT_DROP_IN, drop_in.into_bytes()),
    ])
}
