//! A loopback TCP proxy that a test controls, for faults on the wire: cut
//! every connection, refuse new ones, or stop forwarding while keeping the
//! sockets open (a half-open connection, as after a silent network failure).
//! TLS passes through untouched.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::EnvtestError;

/// A TCP proxy from a free loopback port to `127.0.0.1:<target>`.
///
/// Must be started inside a Tokio runtime; it stops when dropped.
pub struct Proxy {
    port: u16,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

struct State {
    target: u16,
    refuse: AtomicBool,
    blackhole: AtomicBool,
    accepted: AtomicU64,
    cut: watch::Sender<u64>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("port", &self.port)
            .field("target", &self.state.target)
            .finish()
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: u16) -> Result<Self, EnvtestError> {
        let (listener, port) = bind_loopback().await?;
        let (cut, _) = watch::channel(0);
        let state = Arc::new(State {
            target,
            refuse: AtomicBool::new(false),
            blackhole: AtomicBool::new(false),
            accepted: AtomicU64::new(0),
            cut,
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&state)));
        Ok(Self {
            port,
            state,
            accept,
        })
    }

    /// The port to connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Closes every open connection now.
    pub fn cut_all(&self) {
        self.state.cut.send_modify(|g| *g += 1);
    }

    /// While on, new connections are closed as soon as they are accepted.
    pub fn refuse(&self, on: bool) {
        self.state.refuse.store(on, Ordering::SeqCst);
    }

    /// While on, nothing is forwarded in either direction, but every socket
    /// stays open: the peers see a silent, half-open connection.
    pub fn blackhole(&self, on: bool) {
        self.state.blackhole.store(on, Ordering::SeqCst);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut_all();
    }
}

/// A listener on a free loopback port, and the port.
pub(crate) async fn bind_loopback() -> Result<(TcpListener, u16), EnvtestError> {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| EnvtestError::io("binding the proxy on", "127.0.0.1", e))?;
    let port = listener
        .local_addr()
        .map_err(|e| EnvtestError::io("reading the proxy address", "127.0.0.1", e))?
        .port();
    Ok((listener, port))
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    while let Ok((client, _)) = listener.accept().await {
        state.accepted.fetch_add(1, Ordering::SeqCst);
        if state.refuse.load(Ordering::SeqCst) {
            drop(client);
            continue;
        }
        let state = Arc::clone(&state);
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(("127.0.0.1", state.target)).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            let up = tokio::spawn(pipe(cr, sw, Arc::clone(&state)));
            let down = tokio::spawn(pipe(sr, cw, Arc::clone(&state)));
            let _ = tokio::join!(up, down);
        });
    }
}

/// Copies `from` to `to` until either side closes or the connection is cut.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, state: Arc<State>) {
    let mut cut = state.cut.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = tokio::select! {
            _ = cut.changed() => return,
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
        };
        while state.blackhole.load(Ordering::SeqCst) {
            tokio::select! {
                _ = cut.changed() => return,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
