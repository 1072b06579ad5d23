//! A fetched manifest or blob: its bytes as they come, from a registry's response (through
//! oci-client) or from an image archive's file (`oci_archive.rs`), in chunks for containerd's
//! content writes.

use crate::effects::http::describe;
use futures::StreamExt;
use futures::stream::{BoxStream, Fuse};

/// A fetched manifest or blob: its declared length and its bytes as they come.
pub(super) struct Fetched {
    pub(super) content_length: Option<u64>,
    pub(super) content_type: Option<String>,
    pub(super) body: Body,
}

pub(super) enum Body {
    Bytes(Vec<u8>),
    /// The stream (fused: oci-client's verifying stream checks the digest again, and fails,
    /// when polled after its end), and what is left of its last item.
    Stream(
        Fuse<BoxStream<'static, std::io::Result<bytes::Bytes>>>,
        bytes::Bytes,
    ),
    /// A blob in an image archive (`oci_archive.rs`): the file, positioned, and what is left.
    File(tokio::io::Take<tokio::fs::File>),
}

impl Body {
    /// `size` bytes of `file` from `offset`.
    pub(super) async fn file(
        mut file: tokio::fs::File,
        offset: u64,
        size: u64,
    ) -> std::io::Result<Self> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        file.seek(std::io::SeekFrom::Start(offset)).await?;
        Ok(Self::File(file.take(size)))
    }

    /// The next `max` bytes (fewer only at the end); `None` at the end. A stream ends with an error when the
    /// blob's digest does not match (oci-client checks it as the bytes pass).
    pub(super) async fn next_chunk(&mut self, max: usize) -> Result<Option<Vec<u8>>, String> {
        match self {
            Self::Bytes(b) => {
                if b.is_empty() {
                    return Ok(None);
                }
                let n = max.min(b.len());
                Ok(Some(b.drain(..n).collect()))
            }
            // Network reads are small (kilobytes); they are gathered into chunks of `max`,
            // so that containerd gets few, large writes.
            Self::Stream(s, rest) => {
                let mut chunk = Vec::with_capacity(max);
                while chunk.len() < max {
                    if rest.is_empty() {
                        match s.next().await {
                            None => break,
                            Some(Ok(item)) => *rest = item,
                            Some(Err(e)) => return Err(stream_error(&e)),
                        }
                        continue;
                    }
                    let n = (max - chunk.len()).min(rest.len());
                    chunk.extend_from_slice(&rest.split_to(n));
                }
                Ok((!chunk.is_empty()).then_some(chunk))
            }
            Self::File(file) => {
                use tokio::io::AsyncReadExt;
                let mut chunk = vec![0; max];
                let mut filled = 0;
                while filled < max {
                    match file.read(&mut chunk[filled..]).await {
                        Ok(0) => break,
                        Ok(n) => filled += n,
                        Err(e) => return Err(describe(&e)),
                    }
                }
                chunk.truncate(filled);
                Ok((!chunk.is_empty()).then_some(chunk))
            }
        }
    }
}

fn stream_error(e: &std::io::Error) -> String {
    let text = e.to_string();
    if text.contains("Digest") || text.contains("digest") {
        "sha256 verification failed while streaming".into()
    } else {
        describe(e)
    }
}
