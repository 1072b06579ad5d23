//! A pulled image unpacked into a directory — the tree an nspawn machine boots — layer by
//! layer from the content store, as OCI says: whiteouts (`.wh.NAME`) remove what a lower layer
//! put there, an opaque marker (`.wh..wh..opq`) empties its directory of the lower layers'
//! entries, owners, modes, times and xattrs (file capabilities) are kept. Nothing lands outside
//! the directory: the tar crate refuses `..` and links that lead out, and the paths whiteouts
//! name are resolved inside it. Each layer's bytes are checked against its digest and its
//! uncompressed stream against the config's diffID. containerd's own snapshots cannot be used
//! here: they are mounts of its snapshotter, and a machine's tree must be a directory of its own.

use super::container::PulledManifest;
use super::manifest::config_diff_ids;
use super::{GrpcContainerd, grpc_failed};
use crate::effects::archive::{Capped, hit_unpacked_cap};
use crate::effects::fs::{io_failed, remove_no_follow, remove_tree};
use crate::effects::host::resolve_in_root;
use crate::effects::{EffectError, EffectResult};
use crate::lifecycle::agent::Sha256Hex;
use crate::text::one_line;
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

/// Chunks in flight between the content stream and the unpacking thread.
const CHANNEL_DEPTH: usize = 16;
/// Most bytes an image's layers may unpack to, all of them together (a node image is a few
/// hundred MB): a small layer that inflates without end would fill the host's disk.
const MAX_TREE_BYTES: u64 = 16 << 30;
const OPAQUE: &str = ".wh..wh..opq";
const WHITEOUT: &str = ".wh.";

/// How a layer's tar stream is stored.
#[derive(Clone, Copy, Debug)]
pub enum Compression {
    None,
    Gzip,
}

impl Compression {
    /// From the layer's media type: tar or tar+gzip only.
    pub fn of(media_type: &str) -> EffectResult<Self> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Self::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(Self::Gzip),
            other => Err(EffectError::Failed(format!(
                "layer media type {other} is not supported for a machine's tree (tar or tar+gzip)"
            ))),
        }
    }
}

impl GrpcContainerd {
    /// Unpacks pulled image `digest` into `dir` (created if missing). Applying the same image
    /// again onto a partly unpacked `dir` finishes it: entries are overwritten.
    pub async fn unpack_image_into(&self, digest: &Sha256Hex, dir: &Path) -> EffectResult {
        let PulledManifest {
            manifest, config, ..
        } = self.pulled_manifest(digest).await?;
        let diff_ids = config_diff_ids(&config, &manifest.config.digest)?;
        if diff_ids.len() != manifest.layers.len() {
            return Err(EffectError::Failed(format!(
                "image {}: {} layers but {} diffIDs",
                digest.oci(),
                manifest.layers.len(),
                diff_ids.len()
            )));
        }
        std::fs::create_dir_all(dir).map_err(|e| io_failed("create", dir, &e))?;
        let mut left = MAX_TREE_BYTES;
        for (layer, diff_id) in manifest.layers.iter().zip(diff_ids) {
            let compression = Compression::of(&layer.media_type)?;
            let (tx, rx) = tokio::sync::mpsc::channel(CHANNEL_DEPTH);
            let target = dir.to_path_buf();
            let what = layer.digest.clone();
            let apply = tokio::task::spawn_blocking(move || {
                apply_layer(
                    ChannelReader::new(rx),
                    compression,
                    &target,
                    &what,
                    &diff_id,
                    left,
                )
            });
            let streamed = self.stream_layer(&layer.digest, tx).await;
            let applied = apply
                .await
                .map_err(|e| EffectError::Failed(format!("unpack {}: {e}", layer.digest)))?;
            // A stream error surfaces on both sides; the stream's own message says more.
            streamed?;
            left -= applied?;
        }
        Ok(())
    }

    /// Sends the blob's bytes to `tx`, checking them against `digest` on the way; the
    /// receiving side sees an error instead of the end when the bytes are wrong.
    async fn stream_layer(
        &self,
        digest: &str,
        tx: tokio::sync::mpsc::Sender<std::io::Result<Vec<u8>>>,
    ) -> EffectResult {
        let mut stream = self.content_stream(digest, None).await?;
        let mut hash = Sha256::new();
        loop {
            match stream.message().await {
                Ok(Some(msg)) => {
                    self.heartbeat.beat();
                    hash.update(&msg.data);
                    if tx.send(Ok(msg.data)).await.is_err() {
                        // The unpacking side stopped: its error is the one to report.
                        return Ok(());
                    }
                }
                Ok(None) => break,
                Err(s) => {
                    let e = grpc_failed(&format!("read layer {digest}"), &s);
                    let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
                    return Err(e);
                }
            }
        }
        let got = format!("sha256:{}", hex::encode(hash.finalize()));
        if got != digest {
            let e = EffectError::Failed(format!("layer {digest}: the content store holds {got}"));
            let _ = tx.send(Err(std::io::Error::other(e.to_string()))).await;
            return Err(e);
        }
        Ok(())
    }
}

/// The blocking half: decompress, hash, apply. At most `left` uncompressed bytes; returns
/// how many there were. Public for the fuzz targets (`fuzz/`): a layer is a registry's bytes.
/// A failure's message quotes the layer (its paths; a tar error quotes header bytes), so it is
/// made one line of bounded length: it reaches the Machine's status and the journal.
pub fn apply_layer(
    src: impl Read,
    compression: Compression,
    dir: &Path,
    layer: &str,
    diff_id: &str,
    left: u64,
) -> EffectResult<u64> {
    apply_layer_entries(src, compression, dir, layer, diff_id, left).map_err(|e| match e {
        EffectError::Failed(message) => EffectError::Failed(one_line(&message)),
        other => other,
    })
}

fn apply_layer_entries(
    src: impl Read,
    compression: Compression,
    dir: &Path,
    layer: &str,
    diff_id: &str,
    left: u64,
) -> EffectResult<u64> {
    let stream: Box<dyn Read> = match compression {
        Compression::None => Box::new(src),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(src)),
    };
    let mut archive = tar::Archive::new(Hashing::new(Capped {
        inner: stream,
        left,
    }));
    archive.set_preserve_permissions(true);
    archive.set_preserve_ownerships(true);
    archive.set_preserve_mtime(true);
    archive.set_unpack_xattrs(true);
    archive.set_overwrite(true);
    let failed = |e: std::io::Error| {
        if hit_unpacked_cap(&e) {
            return EffectError::Failed(format!(
                "layer {layer}: the image unpacks to more than {} GiB",
                MAX_TREE_BYTES >> 30
            ));
        }
        EffectError::Failed(format!("layer {layer}: {}", chain(&e)))
    };
    // What this layer put in place: an opaque marker keeps it.
    let mut own: HashSet<PathBuf> = HashSet::new();
    for entry in archive.entries().map_err(failed)? {
        let mut entry = entry.map_err(failed)?;
        let path = entry.path().map_err(failed)?.into_owned();
        let rel = relative(&path).ok_or_else(|| {
            EffectError::Failed(format!(
                "layer {layer}: entry {} leaves the tree",
                path.display()
            ))
        })?;
        let Some(name) = rel.file_name().and_then(OsStr::to_str) else {
            continue;
        };
        let parent = rel.parent().unwrap_or(Path::new(""));
        if name == OPAQUE {
            empty_dir(dir, parent, &own)?;
        } else if let Some(hidden) = name.strip_prefix(WHITEOUT) {
            // The entry it names, not what a link there points to (as containerd resolves only
            // the parent); never the directory itself or its parent.
            if matches!(hidden, "" | "." | "..") {
                return Err(EffectError::Failed(format!(
                    "layer {layer}: whiteout {:?} names no entry",
                    rel.display()
                )));
            }
            let parent = resolve_in_root(dir, parent)
                .map_err(|e| io_failed("resolve", &dir.join(parent), &e))?;
            remove_tree(&parent.join(hidden))?;
        } else {
            // Unpacked again after a crash: a link cannot be made over what is there.
            if !entry.header().entry_type().is_dir() {
                let parent = resolve_in_root(dir, parent)
                    .map_err(|e| io_failed("resolve", &dir.join(parent), &e))?;
                let at = parent.join(name);
                if std::fs::symlink_metadata(&at).is_ok_and(|m| !m.is_dir()) {
                    remove_no_follow(&at)?;
                }
            }
            entry.unpack_in(dir).map_err(failed)?;
            own.insert(rel);
        }
    }
    let mut rest = archive.into_inner();
    std::io::copy(&mut rest, &mut std::io::sink()).map_err(failed)?;
    let unpacked = left - rest.inner.left;
    let got = rest.digest();
    if got != diff_id {
        return Err(EffectError::Failed(format!(
            "layer {layer}: its uncompressed bytes are {got}, not the config's diffID {diff_id}"
        )));
    }
    Ok(unpacked)
}

/// An error and its sources: the tar crate puts the cause in the source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// `path` as a relative path of normal components; `None` if it climbs with `..`.
fn relative(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            Component::ParentDir => return None,
        }
    }
    Some(out)
}

/// Removes what the lower layers left in `parent` (inside `dir`); this layer's own entries stay.
fn empty_dir(dir: &Path, parent: &Path, own: &HashSet<PathBuf>) -> EffectResult {
    let target = resolve_in_root(dir, parent).map_err(|e| io_failed("resolve", parent, &e))?;
    let children = match std::fs::read_dir(&target) {
        Ok(children) => children,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_failed("list", &target, &e)),
    };
    for child in children {
        let child = child.map_err(|e| io_failed("list", &target, &e))?;
        if !own.contains(&parent.join(child.file_name())) {
            remove_tree(&child.path())?;
        }
    }
    Ok(())
}

/// The receiving end of the content stream as a `Read`.
struct ChannelReader {
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    chunk: Vec<u8>,
    at: usize,
}

impl ChannelReader {
    fn new(rx: tokio::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>) -> Self {
        Self {
            rx,
            chunk: Vec::new(),
            at: 0,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.chunk.len() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(chunk) => {
                    self.chunk = chunk?;
                    self.at = 0;
                }
            }
        }
        let n = buf.len().min(self.chunk.len() - self.at);
        buf[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
}

impl<R: Read> Hashing<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
        }
    }

    fn digest(self) -> String {
        format!("sha256:{}", hex::encode(self.hash.finalize()))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_that_climb_are_refused() {
        assert_eq!(relative(Path::new("./etc/x")), Some(PathBuf::from("etc/x")));
        assert_eq!(relative(Path::new("/etc/x")), Some(PathBuf::from("etc/x")));
        assert_eq!(relative(Path::new("etc/../../x")), None);
    }

    /// A layer that inflates past what is left of the cap stops with a message naming the
    /// cap (the test's cap is small; the real one is `MAX_TREE_BYTES`).
    #[test]
    fn a_layer_larger_than_the_cap_is_refused() {
        let mut tar = tar::Builder::new(Vec::new());
        let data = vec![0u8; 64 << 10];
        let dir = tempfile::tempdir().expect("tmp");
        let owner = std::fs::metadata(dir.path()).expect("stat");
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_uid(u64::from(std::os::unix::fs::MetadataExt::uid(&owner)));
        header.set_gid(u64::from(std::os::unix::fs::MetadataExt::gid(&owner)));
        header.set_mtime(0);
        header.set_cksum();
        tar.append_data(&mut header, "big", data.as_slice())
            .expect("append");
        let bytes = tar.into_inner().expect("tar");
        let e = apply_layer(
            bytes.as_slice(),
            Compression::None,
            dir.path(),
            "l",
            "d",
            4096,
        )
        .expect_err("over the cap");
        assert!(e.to_string().contains("unpacks to more than"), "{e}");
        let wrong = apply_layer(
            bytes.as_slice(),
            Compression::None,
            dir.path(),
            "l",
            "sha256:x",
            1 << 20,
        )
        .expect_err("wrong diffID");
        assert!(
            wrong.to_string().contains("not the config's diffID"),
            "{wrong}"
        );
    }

    /// One empty regular entry named `name`: a whiteout.
    fn whiteout_layer(name: &str) -> Vec<u8> {
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(0);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_cksum();
        tar.append_data(&mut header, name, std::io::empty())
            .expect("append");
        tar.into_inner().expect("tar")
    }

    /// A whiteout removes the entry it names: a link there, not the directory it points to
    /// (fuzz target `layer`); one naming `..` is refused, not the tree removed.
    #[test]
    fn a_whiteout_removes_the_link_not_its_target() {
        let dir = tempfile::tempdir().expect("tmp");
        let tree = dir.path();
        std::fs::create_dir_all(tree.join("usr/lib")).expect("mkdir");
        std::fs::write(tree.join("usr/lib/libx.so"), "x").expect("write");
        std::os::unix::fs::symlink("usr/lib", tree.join("lib")).expect("link");
        let apply = |name: &str| {
            let bytes = whiteout_layer(name);
            let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
            apply_layer(
                bytes.as_slice(),
                Compression::None,
                tree,
                "l",
                &diff_id,
                1 << 20,
            )
        };
        apply(".wh.lib").expect("whiteout");
        assert!(
            std::fs::symlink_metadata(tree.join("lib")).is_err(),
            "the link stays"
        );
        assert!(tree.join("usr/lib/libx.so").exists(), "its target went");
        let e = apply("usr/.wh...").expect_err("a whiteout of ..");
        assert!(e.to_string().contains("names no entry"), "{e}");
        assert!(tree.join("usr/lib/libx.so").exists());
    }

    /// A message that quotes the layer (here an entry's name) stays one short line (fuzz
    /// target `layer`: a tar error quoting header bytes spanned lines).
    #[test]
    fn a_failure_is_one_short_line() {
        let mut header = tar::Header::new_gnu();
        let name = b"a\nb\r/../../x";
        header.as_old_mut().name[..name.len()].copy_from_slice(name);
        header.set_size(0);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 1024]);
        let dir = tempfile::tempdir().expect("tmp");
        let e = apply_layer(
            bytes.as_slice(),
            Compression::None,
            dir.path(),
            "l",
            "d",
            1 << 20,
        )
        .expect_err("it climbs");
        let text = e.to_string();
        assert!(text.contains("leaves the tree"), "{text:?}");
        assert!(!text.contains(['\n', '\r']), "{text:?}");
    }

    #[test]
    fn only_tar_and_gzip_layers() {
        assert!(Compression::of("application/vnd.oci.image.layer.v1.tar+gzip").is_ok());
        assert!(Compression::of("application/vnd.oci.image.layer.v1.tar").is_ok());
        let e = Compression::of("application/vnd.oci.image.layer.v1.tar+zstd").expect_err("zstd");
        assert!(e.to_string().contains("not supported"), "{e}");
    }
}
