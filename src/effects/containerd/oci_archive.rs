//! An image from disk instead of a registry: an OCI image layout, as a directory or as one tar
//! of it (an OCI archive, what `image/build --archive` and `image/node` write). A pull reads
//! its blobs here first (`Registry::fetch`), so an air-gapped node provisions from it with no
//! registry reachable; every blob is verified against its digest as a registry's would be.
//! A tar is indexed once (each blob's offset and size) and read in place, never unpacked.

use super::fetched::{Body, Fetched};
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::Sha256Hex;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The layout's `index.json` is read whole; a bigger one is not a layout of a few images.
const MAX_INDEX: u64 = 1 << 20;
/// The annotation an OCI layout names its images' tags by.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Where each blob of the layout is.
#[derive(Debug)]
pub struct OciArchive {
    path: PathBuf,
    form: Form,
}

#[derive(Debug)]
enum Form {
    Dir,
    /// `sha256:hex` → (offset of its bytes in the tar, size).
    Tar(HashMap<String, (u64, u64)>, Vec<u8>),
}

impl OciArchive {
    /// Opens `path`: a directory holding `oci-layout`, `index.json` and `blobs/`, or a tar of
    /// one.
    pub fn open(path: &Path) -> EffectResult<Self> {
        let failed =
            |why: String| EffectError::Failed(format!("image archive {}: {why}", path.display()));
        let meta = std::fs::metadata(path).map_err(|e| failed(e.to_string()))?;
        if meta.is_dir() {
            if !path.join("index.json").is_file() {
                return Err(failed(
                    "a directory without index.json is not an OCI layout".into(),
                ));
            }
            return Ok(Self {
                path: path.to_path_buf(),
                form: Form::Dir,
            });
        }
        let file = std::fs::File::open(path).map_err(|e| failed(e.to_string()))?;
        let mut tar = tar::Archive::new(file);
        let mut blobs = HashMap::new();
        let mut index = None;
        // Seeking past each blob: the headers alone are read.
        for entry in tar.entries_with_seek().map_err(|e| failed(e.to_string()))? {
            let mut entry = entry.map_err(|e| failed(format!("not a tar: {e}")))?;
            if entry.header().entry_type() != tar::EntryType::Regular {
                continue;
            }
            let name = entry
                .path()
                .map_err(|e| failed(e.to_string()))?
                .to_string_lossy()
                .trim_start_matches("./")
                .to_string();
            if name == "index.json" {
                if entry.size() > MAX_INDEX {
                    return Err(failed("index.json is over 1 MiB".into()));
                }
                let mut bytes = Vec::new();
                entry
                    .read_to_end(&mut bytes)
                    .map_err(|e| failed(e.to_string()))?;
                index = Some(bytes);
            } else if let Some(hex) = name.strip_prefix("blobs/sha256/") {
                blobs.insert(
                    format!("sha256:{hex}"),
                    (entry.raw_file_position(), entry.size()),
                );
            }
        }
        let index = index.ok_or_else(|| failed("no index.json: not an OCI archive".into()))?;
        Ok(Self {
            path: path.to_path_buf(),
            form: Form::Tar(blobs, index),
        })
    }

    /// The archive at `path` if there is one there: an offline node's archives are per
    /// version, and a version without one comes from the registry. Opened off the runtime's
    /// threads (a tar's headers are read through the whole file).
    pub async fn at(path: Option<&Path>) -> EffectResult<Option<Self>> {
        let Some(path) = path.filter(|p| p.symlink_metadata().is_ok()) else {
            return Ok(None);
        };
        let path = path.to_path_buf();
        tokio::task::spawn_blocking(move || Self::open(&path))
            .await
            .map_err(|e| EffectError::Failed(format!("image archive: {e}")))?
            .map(Some)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The digest of the image the layout tags `tag` (its `ref.name`), or of its only image.
    pub fn digest_of(&self, tag: &str) -> EffectResult<Sha256Hex> {
        let failed = |why: String| {
            EffectError::Failed(format!("image archive {}: {why}", self.path.display()))
        };
        let bytes = match &self.form {
            Form::Tar(_, index) => std::borrow::Cow::Borrowed(index.as_slice()),
            Form::Dir => std::borrow::Cow::Owned(
                read_capped(&self.path.join("index.json"), MAX_INDEX)
                    .map_err(|e| failed(format!("index.json: {e}")))?,
            ),
        };
        let index: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| failed(format!("index.json: {e}")))?;
        let manifests = index
            .get("manifests")
            .and_then(|m| m.as_array())
            .ok_or_else(|| failed("index.json lists no manifests".into()))?;
        let named = |m: &&serde_json::Value| {
            m.pointer(&format!("/annotations/{}", REF_NAME.replace('/', "~1")))
                .and_then(|v| v.as_str())
                == Some(tag)
        };
        let chosen = match manifests.iter().find(named) {
            Some(m) => m,
            None if manifests.len() == 1 => &manifests[0],
            None => {
                return Err(failed(format!(
                    "{} images and none tagged {tag:?}",
                    manifests.len()
                )));
            }
        };
        chosen
            .get("digest")
            .and_then(|d| d.as_str())
            .and_then(|d| d.strip_prefix("sha256:"))
            .and_then(Sha256Hex::parse)
            .ok_or_else(|| failed("index.json names no sha256 digest".into()))
    }

    /// Blob `digest` (`sha256:…`), if the layout holds it: its size and its bytes as they come.
    pub(super) async fn fetch(&self, digest: &str) -> EffectResult<Option<Fetched>> {
        let Some(hex) = digest.strip_prefix("sha256:").and_then(Sha256Hex::parse) else {
            return Ok(None);
        };
        let failed = |e: std::io::Error| {
            EffectError::Failed(format!(
                "blob {digest} from image archive {}: {e}",
                self.path.display()
            ))
        };
        let (file, offset, size) = match &self.form {
            Form::Dir => {
                let path = self.path.join("blobs/sha256").join(hex.as_str());
                let file = match tokio::fs::File::open(&path).await {
                    Ok(f) => f,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                    Err(e) => return Err(failed(e)),
                };
                let size = file.metadata().await.map_err(failed)?.len();
                (file, 0, size)
            }
            Form::Tar(blobs, _) => {
                let Some(&(offset, size)) = blobs.get(digest) else {
                    return Ok(None);
                };
                let file = tokio::fs::File::open(&self.path).await.map_err(failed)?;
                (file, offset, size)
            }
        };
        Ok(Some(Fetched {
            content_length: Some(size),
            content_type: None,
            body: Body::file(file, offset, size).await.map_err(failed)?,
        }))
    }
}

fn read_capped(path: &Path, cap: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(cap + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(std::io::Error::other(format!("over {cap} bytes")));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::OciArchive;

    /// A tar of `entries` (name, contents).
    fn tar(at: &std::path::Path, entries: &[(&str, &[u8])]) {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(data.len() as u64);
            b.append_data(&mut h, name, *data).expect("tar");
        }
        std::fs::write(at, b.into_inner().expect("tar")).expect("write");
    }

    fn index(tags: &[(&str, char)]) -> String {
        let manifests: Vec<String> = tags
            .iter()
            .map(|(tag, c)| {
                format!(
                    r#"{{"digest":"sha256:{}","annotations":{{"org.opencontainers.image.ref.name":"{tag}"}}}}"#,
                    c.to_string().repeat(64)
                )
            })
            .collect();
        format!(
            r#"{{"schemaVersion":2,"manifests":[{}]}}"#,
            manifests.join(",")
        )
    }

    #[test]
    fn one_archive_names_each_version_by_its_tag() {
        let dir = tempfile::tempdir().expect("tmp");
        let at = dir.path().join("nodes.oci.tar");
        let idx = index(&[("v1.34.12", 'a'), ("v1.35.0", 'b')]);
        tar(
            &at,
            &[("./oci-layout", b"{}"), ("./index.json", idx.as_bytes())],
        );
        let archive = OciArchive::open(&at).expect("open");
        assert_eq!(
            archive.digest_of("v1.35.0").expect("tagged").as_str(),
            "b".repeat(64)
        );
        let m = archive
            .digest_of("v1.36.0")
            .expect_err("untagged")
            .to_string();
        assert!(m.contains("2 images and none tagged \"v1.36.0\""), "{m}");
        // An archive of one image answers for any tag: the operator named it for the version.
        let one = dir.path().join("one.oci.tar");
        let idx = index(&[("lab", 'c')]);
        tar(&one, &[("index.json", idx.as_bytes())]);
        assert_eq!(
            OciArchive::open(&one)
                .expect("open")
                .digest_of("v1.34.12")
                .expect("the only image")
                .as_str(),
            "c".repeat(64)
        );
    }

    #[test]
    fn what_is_not_an_oci_archive_is_named() {
        let dir = tempfile::tempdir().expect("tmp");
        let no_index = dir.path().join("no-index.tar");
        tar(&no_index, &[("oci-layout", b"{}")]);
        let m = OciArchive::open(&no_index)
            .expect_err("no index")
            .to_string();
        assert!(
            m.contains("no-index.tar") && m.contains("no index.json"),
            "{m}"
        );
        let empty_dir = dir.path().join("layout");
        std::fs::create_dir(&empty_dir).expect("dir");
        let m = OciArchive::open(&empty_dir)
            .expect_err("no index")
            .to_string();
        assert!(m.contains("not an OCI layout"), "{m}");
        let absent = dir.path().join("absent.tar");
        assert!(OciArchive::open(&absent).is_err());
    }
}
