//! A TLS-terminating proxy in front of kube-apiserver that can answer every
//! request itself with an error status for a while: the API server "answering
//! 429 or 503", as an overloaded or restarting server does.
//!
//! Clients connect to it with the envtest CA (it presents the API server's
//! serving certificate); it reaches the API server as the envtest admin.
//! What it forwards, it forwards unchanged (unless told to rewrite); the error
//! mode applies to every connection opened while it is on, and turning it on
//! closes the open ones, so that clients reconnect into it.
//!
//! It can also delay what the API server answers to watches, and only to
//! them ([`AnsweringProxy::delay_watches`]): writes and lists pass at once,
//! so a client's watch lags its own writes as on a busy server.
//!
//! For [fault runs](crate::FaultRun) it reads each request (HTTP/1.1, one at
//! a time per connection as the Kubernetes clients send them, never
//! pipelined; bodies framed by `Content-Length`; a chunked body, an upgrade
//! or an `Expect` header turns the rest of that connection into plain
//! forwarding, which faults do not reach)
//! and decides its fate ([`faults`]): forwarded, answered with an error it
//! never passes on (409, 5xx), a watch answered 410 Gone, a watch held while
//! the watches are blind, or, once the controller has "crashed", the
//! connection closed unanswered. Each request and what became of it is
//! logged for the run's report.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::{EnvtestError, TestEnv};

pub(crate) mod faults;
use faults::{Decision, Faults};

/// See the module docs. Must be started inside a Tokio runtime; stops on drop.
pub struct AnsweringProxy {
    port: u16,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

struct State {
    /// 0: forward; otherwise the status to answer with.
    status: AtomicU16,
    /// While set, every occurrence of `.0` in what the API server sends is
    /// replaced by `.1` (same length, so framing is unchanged).
    rewrite: Mutex<Option<(Vec<u8>, Vec<u8>)>>,
    answered: AtomicU64,
    cut: watch::Sender<u64>,
    /// How long watch answers are held back, in milliseconds (0: not at all).
    watch_delay_ms: AtomicU64,
    /// What fault runs do to single requests, and their log.
    faults: Faults,
}

impl std::fmt::Debug for AnsweringProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnsweringProxy")
            .field("port", &self.port)
            .finish()
    }
}

fn tls_error(e: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> EnvtestError {
    EnvtestError::failed("the answering proxy's TLS setup failed", e)
}

impl AnsweringProxy {
    /// A proxy in front of `env`'s kube-apiserver, on a free loopback port.
    pub async fn start(env: &TestEnv) -> Result<Self, EnvtestError> {
        let dir = env.dir();
        let read = |name: &str| {
            std::fs::read(dir.join(name))
                .map_err(|e| EnvtestError::io("reading", dir.join(name), e))
        };
        let certs = |pem: &[u8]| -> Result<Vec<CertificateDer<'static>>, EnvtestError> {
            CertificateDer::pem_slice_iter(pem)
                .collect::<Result<_, _>>()
                .map_err(tls_error)
        };
        let server = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                certs(&read("serving.crt")?)?,
                PrivateKeyDer::from_pem_slice(&read("serving.key")?).map_err(tls_error)?,
            )
            .map_err(tls_error)?;
        let mut roots = RootCertStore::empty();
        for cert in certs(&read("ca.crt")?)? {
            roots.add(cert).map_err(tls_error)?;
        }
        let client = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(
                certs(&read("admin.crt")?)?,
                PrivateKeyDer::from_pem_slice(&read("admin.key")?).map_err(tls_error)?,
            )
            .map_err(tls_error)?;
        let (listener, port) = crate::proxy::bind_loopback().await?;
        let state = Arc::new(State {
            status: AtomicU16::new(0),
            rewrite: Mutex::new(None),
            answered: AtomicU64::new(0),
            cut: watch::channel(0).0,
            watch_delay_ms: AtomicU64::new(0),
            faults: Faults::default(),
        });
        let accept = tokio::spawn(accept_loop(
            listener,
            TlsAcceptor::from(Arc::new(server)),
            TlsConnector::from(Arc::new(client)),
            env.api_port(),
            Arc::clone(&state),
        ));
        Ok(Self {
            port,
            state,
            accept,
        })
    }

    /// The port to connect to (`https://127.0.0.1:<port>`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Answers every request with `status` (429, 503, ...) until
    /// [`forward`](Self::forward); open connections are closed.
    pub fn answer(&self, status: u16) {
        self.state.status.store(status, Ordering::SeqCst);
        self.state.cut.send_modify(|g| *g += 1);
    }

    /// Forwards to the API server again; connections that were being
    /// answered are closed, so that clients reconnect and get through.
    pub fn forward(&self) {
        self.state.status.store(0, Ordering::SeqCst);
        self.state.cut.send_modify(|g| *g += 1);
    }

    /// Replaces `from` by `to` (which must have the same length) in every
    /// response from now on: the way to make one object undecodable while
    /// the JSON and the HTTP framing stay valid.
    pub fn rewrite(&self, from: &str, to: &str) -> Result<(), EnvtestError> {
        if from.len() != to.len() || from.is_empty() {
            return Err(EnvtestError::Client(format!(
                "rewrite needs two non-empty strings of one length, got {from:?} and {to:?}"
            )));
        }
        let rewrite = Some((from.as_bytes().to_vec(), to.as_bytes().to_vec()));
        *self.state.rewrite.lock().unwrap_or_else(|e| e.into_inner()) = rewrite;
        Ok(())
    }

    /// Holds back every byte the API server sends in answer to a watch
    /// (a request whose query has `watch=true` or `watch=1`) for `delay`
    /// before passing it on, in order; other answers pass at once. Applies
    /// to bytes read from now on; `Duration::ZERO` turns it off.
    pub fn delay_watches(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.watch_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Requests answered with an error status so far.
    pub fn answered(&self) -> u64 {
        self.state.answered.load(Ordering::SeqCst)
    }

    pub(crate) fn faults(&self) -> &Faults {
        &self.state.faults
    }
}

impl Drop for AnsweringProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.state.cut.send_modify(|g| *g += 1);
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    connector: TlsConnector,
    target: u16,
    state: Arc<State>,
) {
    while let Ok((tcp, _)) = listener.accept().await {
        let (acceptor, connector, state) =
            (acceptor.clone(), connector.clone(), Arc::clone(&state));
        tokio::spawn(async move {
            let Ok(mut client) = acceptor.accept(tcp).await else {
                return;
            };
            let status = state.status.load(Ordering::SeqCst);
            if status != 0 {
                let mut cut = state.cut.subscribe();
                tokio::select! {
                    _ = cut.changed() => {}
                    _ = answer_all(&mut client, status, &state) => {}
                }
                return;
            }
            let Ok(upstream_tcp) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let Ok(name) = ServerName::try_from("127.0.0.1") else {
                return;
            };
            let Ok(upstream) = connector.connect(name, upstream_tcp).await else {
                return;
            };
            let mut cut = state.cut.subscribe();
            let (mut client_read, mut client_write) = tokio::io::split(client);
            let (mut upstream_read, mut upstream_write) = tokio::io::split(upstream);
            let conn = Conn::default();
            let (held, mut release) = mpsc::unbounded_channel();
            tokio::select! {
                _ = cut.changed() => {}
                _ = watch_cut(&state, &conn) => {}
                _ = copy_requests(&mut client_read, &mut upstream_write, &held, &state, &conn) => {}
                // What the API server sent before closing is still delivered.
                _ = async { tokio::join!(
                    copy_rewriting(&mut upstream_read, &held, &state, &conn),
                    deliver(&mut release, &mut client_write),
                ) } => {}
            }
            // A crash point whose answer never came (the connection ended
            // first): the write was sent, so the crash happens now rather
            // than never.
            let unanswered = conn
                .awaiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some((entry, true)) = unanswered {
                state.faults.responded(entry, None, true);
            }
        });
    }
}

/// One proxied connection's request state.
#[derive(Default)]
struct Conn {
    /// The request last forwarded is a watch.
    watching: AtomicBool,
    /// The request whose answer has not begun yet: its log entry, and
    /// whether the controller crashes once it arrives.
    awaiting: Mutex<Option<(Option<usize>, bool)>>,
    /// How long the fault plan holds back the answer to the request last
    /// forwarded, in milliseconds.
    delay_ms: AtomicU64,
}

/// Bytes for [`deliver`] and when to write them; `None` ends the connection.
type Held = mpsc::UnboundedSender<(Instant, Option<Vec<u8>>)>;

/// Returns when the watches are cut while this connection serves one.
async fn watch_cut(state: &State, conn: &Conn) {
    let mut cuts = state.faults.watch_cuts();
    while cuts.changed().await.is_ok() {
        if conn.watching.load(Ordering::SeqCst) {
            state.faults.watch_closed();
            return;
        }
    }
    std::future::pending().await
}

/// Answers each request on the connection with `status`, keeping it open
/// as HTTP/1.1 allows, until the client closes it.
async fn answer_all<S: AsyncReadExt + AsyncWriteExt + Unpin>(
    conn: &mut S,
    status: u16,
    state: &State,
) {
    let reason = match status {
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","message":"answered by the envtest proxy","reason":"{}","code":{status}}}"#,
        reason.replace(' ', "")
    );
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        // Requests from the Kubernetes clients carry no body on GET, and
        // those that do carry a Content-Length: skip it.
        let Some(head_end) = find(&buf, b"\r\n\r\n") else {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let body_len: usize = head
            .lines()
            .find_map(|l| {
                l.strip_prefix("content-length:")
                    .map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0);
        let total = head_end + 4 + body_len;
        while buf.len() < total {
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..total);
        state.answered.fetch_add(1, Ordering::SeqCst);
        let response = format!(
            "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nRetry-After: 1\r\n\r\n{body}",
            body.len()
        );
        if conn.write_all(response.as_bytes()).await.is_err() || conn.flush().await.is_err() {
            return;
        }
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A request head longer than this is not framed: the connection is
/// forwarded as it comes from there on.
const MAX_HEAD: usize = 64 * 1024;

/// Copies the client's requests to the API server one by one, each as its
/// fault plan decides (see the module docs). HTTP/1.1 without pipelining:
/// a request is sent once the answer to the one before has been received,
/// so the answer being read is that of the last request forwarded. What
/// cannot be framed (not HTTP, a chunked body, an upgrade) is forwarded as
/// it comes, to the end of the connection.
async fn copy_requests<R, W>(from: &mut R, to: &mut W, held: &Held, state: &State, conn: &Conn)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let head = loop {
            match faults::parse_head(&buf) {
                faults::Parsed::Head(head) if !head.unframed => break Some(head),
                faults::Parsed::Incomplete if buf.len() <= MAX_HEAD => {}
                _ => break None,
            }
            match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let Some(head) = head else {
            if to.write_all(&buf).await.is_ok() {
                let _ = tokio::io::copy(from, to).await;
            }
            return;
        };
        let total = head.len.saturating_add(head.content_length);
        while buf.len() < total {
            match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let request: Vec<u8> = buf.drain(..total).collect();
        // Noted before the decision, so that watches made blind while it
        // is being decided still close this one.
        conn.watching
            .store(faults::is_watch(&head.target), Ordering::SeqCst);
        match state.faults.decide(&head).await {
            Decision::Forward {
                entry,
                delay,
                crash_point,
            } => {
                let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
                conn.delay_ms.store(ms, Ordering::SeqCst);
                *conn.awaiting.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((entry, crash_point));
                if to.write_all(&request).await.is_err() || to.flush().await.is_err() {
                    return;
                }
            }
            Decision::Answer(bytes) => {
                if held.send((Instant::now(), Some(bytes))).is_err() {
                    return;
                }
            }
            Decision::Close => return,
        }
    }
}

/// Writes what [`copy_rewriting`] and [`copy_requests`] pass on, each piece
/// at its time, until told the connection ends.
async fn deliver<W: AsyncWriteExt + Unpin>(
    from: &mut mpsc::UnboundedReceiver<(Instant, Option<Vec<u8>>)>,
    to: &mut W,
) {
    while let Some((at, Some(bytes))) = from.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&bytes).await.is_err() || to.flush().await.is_err() {
            return;
        }
    }
}

/// Passes the API server's bytes on to [`deliver`], applying the rewrite,
/// and holding back watch answers while a delay is set; notes the status
/// each answer begins with in the fault log.
async fn copy_rewriting<R>(from: &mut R, to: &Held, state: &State, conn: &Conn)
where
    R: AsyncReadExt + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let entry = conn
            .awaiting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((entry, crash_point)) = entry {
            let status = faults::response_status(&buf[..n]);
            state.faults.responded(entry, status, crash_point);
        }
        let delay = match state.watch_delay_ms.load(Ordering::SeqCst) {
            ms if ms > 0 && conn.watching.load(Ordering::SeqCst) => ms,
            _ => 0,
        };
        let delay = Duration::from_millis(delay.max(conn.delay_ms.load(Ordering::SeqCst)));
        if let Some((pattern, replacement)) =
            &*state.rewrite.lock().unwrap_or_else(|e| e.into_inner())
        {
            let mut i = 0;
            while let Some(at) = find(&buf[i..n], pattern) {
                let start = i + at;
                buf[start..start + pattern.len()].copy_from_slice(replacement);
                i = start + pattern.len();
            }
        }
        if to
            .send((Instant::now() + delay, Some(buf[..n].to_vec())))
            .is_err()
        {
            return;
        }
    }
    let _ = to.send((Instant::now(), None));
}
