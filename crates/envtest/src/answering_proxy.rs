//! A TLS-terminating proxy in front of kube-apiserver that can answer every
//! request itself with an error status for a while: the API server "answering
//! 429 or 503", as an overloaded or restarting server does.
//!
//! Clients connect to it with the envtest CA (it presents the API server's
//! serving certificate); it reaches the API server as the envtest admin.
//! Forwarding is byte for byte once a connection is established; the error
//! mode applies to every connection opened while it is on, and turning it on
//! closes the open ones, so that clients reconnect into it.
//!
//! It can also delay what the API server answers to watches, and only to
//! them ([`AnsweringProxy::delay_watches`]): writes and lists pass at once,
//! so a client's watch lags its own writes as on a busy server.

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
            let watching = AtomicBool::new(false);
            let (held, mut release) = mpsc::unbounded_channel();
            // What the API server sent before closing is still delivered.
            let answers = async {
                copy_rewriting(&mut upstream_read, &held, &state, &watching).await;
                drop(held);
            };
            tokio::select! {
                _ = cut.changed() => {}
                _ = copy_requests(&mut client_read, &mut upstream_write, &watching) => {}
                _ = async { tokio::join!(answers, deliver(&mut release, &mut client_write)) } => {}
            }
        });
    }
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

/// Copies the client's bytes to the API server, noting whether the request
/// last begun is a watch. HTTP/1.1 without pipelining: a request is sent
/// once the answer to the one before has been received, so the answer
/// being read is that of the last request line seen. A request line is
/// recognised at the start of a read (the clients write a request's head
/// apart from its body).
async fn copy_requests<R, W>(from: &mut R, to: &mut W, watching: &AtomicBool)
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(is_watch) = request_is_watch(&buf[..n]) {
            watching.store(is_watch, Ordering::SeqCst);
        }
        if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
            return;
        }
    }
}

/// Whether `bytes`, if they start with an HTTP request line, ask for a watch.
fn request_is_watch(bytes: &[u8]) -> Option<bool> {
    let line = &bytes[..find(bytes, b"\r\n")?];
    let line = std::str::from_utf8(line).ok()?;
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if !version.starts_with("HTTP/") || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let query = target.split_once('?').map_or("", |(_, q)| q);
    Some(
        query
            .split('&')
            .any(|p| p == "watch=true" || p == "watch=1"),
    )
}

/// Writes what [`copy_rewriting`] passes on, each piece at its time.
async fn deliver<W: AsyncWriteExt + Unpin>(
    from: &mut mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    to: &mut W,
) {
    while let Some((at, bytes)) = from.recv().await {
        tokio::time::sleep_until(at).await;
        if to.write_all(&bytes).await.is_err() || to.flush().await.is_err() {
            return;
        }
    }
}

/// Passes the API server's bytes on to [`deliver`], applying the rewrite,
/// and holding back watch answers while a delay is set.
async fn copy_rewriting<R>(
    from: &mut R,
    to: &mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    state: &State,
    watching: &AtomicBool,
) where
    R: AsyncReadExt + Unpin,
{
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = match state.watch_delay_ms.load(Ordering::SeqCst) {
            ms if ms > 0 && watching.load(Ordering::SeqCst) => Duration::from_millis(ms),
            _ => Duration::ZERO,
        };
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
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::request_is_watch;

    #[test]
    fn a_watch_is_told_from_its_request_line() {
        let line = |l: &str| request_is_watch(format!("{l}\r\nHost: x\r\n\r\n").as_bytes());
        assert_eq!(
            line("GET /api/v1/configmaps?watch=true&resourceVersion=5 HTTP/1.1"),
            Some(true)
        );
        assert_eq!(
            line("GET /api/v1/pods?labelSelector=a&watch=1 HTTP/1.1"),
            Some(true)
        );
        assert_eq!(
            line("GET /api/v1/configmaps?limit=500 HTTP/1.1"),
            Some(false)
        );
        assert_eq!(
            line("POST /api/v1/namespaces/a/configmaps HTTP/1.1"),
            Some(false)
        );
        // A field selector naming "watch" is not a watch.
        assert_eq!(
            line("GET /api/v1/configmaps?fieldSelector=metadata.name%3Dwatch=true HTTP/1.1"),
            Some(false)
        );
        assert_eq!(request_is_watch(b"{\"kind\":\"ConfigMap\"}"), None);
        assert_eq!(
            request_is_watch(b"GET /api/v1/pods?watch=true HTTP/1.1"),
            None
        );
    }
}
