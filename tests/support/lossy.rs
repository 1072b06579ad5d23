//! A loopback TCP relay in front of a real server that can lose requests on their way: told
//! to lose `n`, it takes the next `n` writes of any client (a request on a kept-alive
//! connection, or a new connection's TLS hello) and closes that connection without passing
//! them on or answering, as a server closing an idle connection just as a request goes out
//! does. Told to hold `n`, it takes them and keeps the connection open without an answer, as a
//! hung server does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub struct LossyRelay {
    pub addr: SocketAddr,
    faults: Arc<Faults>,
    task: tokio::task::JoinHandle<()>,
}

/// Writes still to lose or hold, how many were, and the connections accepted.
#[derive(Default)]
struct Faults {
    accepted: AtomicUsize,
    to_lose: AtomicUsize,
    to_hold: AtomicUsize,
    lost: AtomicUsize,
    held: AtomicUsize,
}

/// Takes one from `left` if any is left, counting it in `done`.
fn take(left: &AtomicUsize, done: &AtomicUsize) -> bool {
    let taken = left
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |k| k.checked_sub(1))
        .is_ok();
    if taken {
        done.fetch_add(1, Ordering::SeqCst);
    }
    taken
}

impl LossyRelay {
    /// Relays 127.0.0.1:<a free port> to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let faults = Arc::new(Faults::default());
        let f = faults.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                f.accepted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(relay(client, upstream, f.clone()));
            }
        });
        Self { addr, faults, task }
    }

    /// The next `n` client writes are lost.
    pub fn lose(&self, n: usize) {
        self.faults.to_lose.store(n, Ordering::SeqCst);
    }

    /// The next `n` client writes are held, never answered.
    pub fn hold(&self, n: usize) {
        self.faults.to_hold.store(n, Ordering::SeqCst);
    }

    /// How many connections were accepted so far.
    pub fn accepted(&self) -> usize {
        self.faults.accepted.load(Ordering::SeqCst)
    }

    /// How many writes were lost so far.
    pub fn lost(&self) -> usize {
        self.faults.lost.load(Ordering::SeqCst)
    }

    /// How many writes were held so far.
    pub fn held(&self) -> usize {
        self.faults.held.load(Ordering::SeqCst)
    }
}

impl Drop for LossyRelay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, faults: Arc<Faults>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut from_server, mut to_server) = server.into_split();
    let (mut from_client, mut to_client) = client.split();
    let down = async {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    };
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from_client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if take(&faults.to_lose, &faults.lost) {
                return;
            }
            if take(&faults.to_hold, &faults.held) {
                // Nothing more passes either way until the client gives up.
                while let Ok(1..) = from_client.read(&mut buf).await {}
                return;
            }
            if to_server.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Whichever half ends first ends the connection: a lost write closes it unanswered.
    tokio::select! {
        () = down => {},
        () = up => {},
    }
}
