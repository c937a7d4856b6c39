//! The HTTPS server: one port, a path per webhook, hyper over rustls.
//!
//! What it answers besides a handler's review, so that bad input gets a
//! clear answer and nothing else:
//! - not a POST: 405; an unknown path: 404 naming the served ones; a body
//!   that is not `application/json`: 415; larger than the limit: 413; not
//!   an AdmissionReview: 400 with serde's reason. The API server applies
//!   the webhook's `failurePolicy` to each.
//! - a review whose object is not the handler's kind: a denial saying so.
//! - a handler that panics: a denial naming the panic (controller-runtime's
//!   default), or a 500 ([`OnPanic::Error`]) left to the `failurePolicy`;
//!   the server goes on either way.
//! - a handler, or its patch, slower than the call's timeout (the API
//!   server sends it as `?timeout=`, 10 s unless configured, at most
//!   30 s): a 504 a second (or a tenth of it) early, before the API server
//!   gives up, the handler dropped.
//! - a panic outside the handler (a type's own `Deserialize` or
//!   `Serialize`): a 500.
//! - a connection whose TLS handshake, or whose request head (from its
//!   first byte), takes more than 10 s: cut. A connection without a
//!   request, new or kept alive, is kept 120 s, longer than the API server
//!   keeps an idle one.
//! - an object nested deeper than serde_json reads (128 levels) is read
//!   as the API server stores it, up to its limit of 10 000 levels, on a
//!   stack of its own; a body nested deeper: 400.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use kube_core::Resource;
use kube_core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube_core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use kube_core::dynamic::DynamicObject;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, warn};

use crate::admission::{self, Body, Malformed, Review, Verdict};
use crate::connection::{Phase, Timed};
use crate::conversion::{self, Conversion};
use crate::nesting::{self, OnStack, Stack};
use crate::{CertFiles, WebhookError};

/// The largest request body read, by default: an AdmissionReview carries
/// the object and its old version, each at most etcd's 1.5 MiB request
/// limit (3 MiB with the API server's own), JSON-escaped.
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// The call timeout when a request says none: the API server's default
/// `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most a webhook configuration may set.
const MAX_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a connection may finish its request once the server stops.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// What a handler that panics is answered with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum OnPanic {
    /// A denial naming the panic (controller-runtime's default): the object
    /// is refused whatever the `failurePolicy`.
    #[default]
    Deny,
    /// An HTTP 500: the webhook's `failurePolicy` decides (`Ignore` admits).
    Error,
}

/// What a route made of a request body.
enum Outcome {
    Answered(Box<AdmissionReview<DynamicObject>>),
    /// A ConversionReview answered, already written: its objects are as
    /// deep as the request's, so written (and dropped) on the route's stack.
    Converted(Response<Full<Bytes>>),
    /// A panic outside a handler: answered 500.
    Failed(String),
    Malformed(String),
    Panicked {
        response: Box<AdmissionResponse>,
        message: String,
    },
}

type Route = Arc<dyn Fn(Bytes) -> BoxFuture<'static, Outcome> + Send + Sync>;

/// What the server reports of each request, for metrics (the controllers
/// crate's Manager counts them in its registry). `webhook` is the path
/// served, or `unknown` for any other (so that a scanner cannot make new
/// series).
pub trait Observer: Send + Sync {
    /// A request to `webhook` is being answered.
    fn started(&self, webhook: &str);
    /// It was answered `status` after `seconds`.
    fn finished(&self, webhook: &str, status: u16, seconds: f64);
}

/// The webhooks of one server, by path. See the crate docs.
#[derive(Clone, Default)]
pub struct Webhooks {
    routes: Vec<(String, Route)>,
    /// The custom resources converted, as (API group, plural).
    converts: Vec<(String, String)>,
    on_panic: OnPanic,
    max_body_bytes: Option<usize>,
    observer: Option<Arc<dyn Observer>>,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let paths: Vec<&str> = self.routes.iter().map(|(p, _)| p.as_str()).collect();
        f.debug_struct("Webhooks")
            .field("paths", &paths)
            .field("on_panic", &self.on_panic)
            .finish()
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}

/// Runs `make()` (the handler's call and its future) with panics caught.
async fn guarded<T, Fut>(make: impl FnOnce() -> Fut) -> Result<T, String>
where
    Fut: Future<Output = T>,
{
    let future =
        std::panic::catch_unwind(AssertUnwindSafe(make)).map_err(|p| panic_message(&*p))?;
    AssertUnwindSafe(future)
        .catch_unwind()
        .await
        .map_err(|p| panic_message(&*p))
}

/// The review answering with `verdict`.
fn answered(response: AdmissionResponse, verdict: Verdict) -> Outcome {
    Outcome::Answered(Box::new(admission::answer(response, verdict)))
}

/// The typed part of a route: read the review, answer what is not `K`.
/// A CONNECT (exec, attach, port-forward: its object is their options, not
/// a `K`) is admitted without a handler, as controller-runtime does. With
/// `raw`, the body is parsed once into a `Value` and the handler also gets
/// the object as the API server sent it (`Null` otherwise), and the stack
/// the body is answered on.
fn typed<K, F, Fut>(raw: bool, handle: F) -> Route
where
    K: Resource + DeserializeOwned + Send + 'static,
    F: Fn(AdmissionRequest<K>, Value, Stack) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let handle = Arc::new(handle);
    Arc::new(move |body: Bytes| {
        let handle = Arc::clone(&handle);
        measured("an AdmissionReview", body, move |body, stack| async move {
            let parsed = match raw.then(|| nesting::from_slice::<Value>(&body)) {
                None => None,
                Some(Ok(value)) => Some(value),
                Some(Err(e)) => return Outcome::Malformed(format!("not an AdmissionReview: {e}")),
            };
            let source = parsed.as_ref().map_or(Body::Bytes(&body), Body::Parsed);
            match admission::read::<K>(source) {
                Err(Malformed(why)) => Outcome::Malformed(why),
                Ok(Review::Unreadable(request, _)) if request.operation == Operation::Connect => {
                    answered((&*request).into(), Verdict::allow())
                }
                Ok(Review::Unreadable(request, why)) => {
                    Outcome::Answered(Box::new(admission::unreadable(&request, why)))
                }
                Ok(Review::Typed(request)) if request.operation == Operation::Connect => {
                    answered((&*request).into(), Verdict::allow())
                }
                Ok(Review::Typed(request)) => {
                    let object = parsed
                        .map(|mut review| review["request"]["object"].take())
                        .unwrap_or_default();
                    handle(*request, object, stack).await
                }
            }
        })
    })
}

/// The review answering a defaulting handler that made `before` into
/// `after`: its patch to `raw`, found on a blocking thread (on `stack`),
/// work in proportion to the object kept off the threads that read
/// sockets, and awaited where the call's timeout runs (a 504, not a 200
/// the API server no longer waits for).
async fn patched<K>(
    stack: Stack,
    response: AdmissionResponse,
    raw: Value,
    before: K,
    after: K,
) -> Outcome
where
    K: Serialize + Send + 'static,
{
    let found = tokio::task::spawn_blocking(move || {
        stack.run(
            move || match admission::defaulted(response.clone(), &raw, &before, &after) {
                Ok(review) => Outcome::Answered(Box::new(review)),
                Err(why) => answered(response, Verdict::deny(why)),
            },
        )
    });
    // A panic in the type's own `Serialize`: a 500, as one outside a handler.
    found
        .await
        .unwrap_or_else(|error| match error.try_into_panic() {
            Ok(panic) => Outcome::Failed(panic_message(&*panic)),
            Err(cancelled) => Outcome::Failed(cancelled.to_string()),
        })
}

/// `answer(body, stack)`, on `stack`, deep enough for `body` (see
/// [`nesting`]), or `body` refused as not `review` when it nests deeper
/// than the API server sends.
fn measured<Fut>(
    review: &'static str,
    body: Bytes,
    answer: impl FnOnce(Bytes, Stack) -> Fut,
) -> BoxFuture<'static, Outcome>
where
    Fut: Future<Output = Outcome> + Send + 'static,
{
    match nesting::depth(&body) {
        Ok(depth) => {
            let stack = Stack::for_depth(depth);
            OnStack::new(stack, answer(body, stack).boxed()).boxed()
        }
        Err(too_deep) => {
            futures::future::ready(Outcome::Malformed(format!("not {review}: {too_deep}"))).boxed()
        }
    }
}

impl Webhooks {
    /// No webhooks yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The custom resources these webhooks convert, as (API group,
    /// plural): listing them in a version other than their storage
    /// version needs this server.
    pub fn converted(&self) -> impl Iterator<Item = (&str, &str)> {
        self.converts.iter().map(|(g, r)| (g.as_str(), r.as_str()))
    }

    /// A validating webhook for kind `K` at `path`: `validate` gets each
    /// request (its operation, `object`, `old_object` for an update, the
    /// user) and answers a [`Verdict`].
    #[must_use]
    pub fn validate<K, F, Fut>(mut self, path: &str, validate: F) -> Self
    where
        K: Resource + DeserializeOwned + Send + 'static,
        F: Fn(AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Verdict> + Send + 'static,
    {
        let validate = Arc::new(validate);
        let route = typed(false, move |request: AdmissionRequest<K>, _, _| {
            let validate = Arc::clone(&validate);
            async move {
                let response = AdmissionResponse::from(&request);
                match guarded(|| validate(request)).await {
                    Ok(verdict) => answered(response, verdict),
                    Err(message) => Outcome::Panicked {
                        response: Box::new(response),
                        message,
                    },
                }
            }
        });
        self.routes.push((path.to_owned(), route));
        self
    }

    /// A defaulting (mutating) webhook for kind `K` at `path`: `default`
    /// gets the object and the request, and returns the object as it
    /// should be stored, or a denial; the JSON patch is computed from the
    /// two objects. A request without an object (a delete) is admitted
    /// without calling it.
    #[must_use]
    pub fn defaulting<K, F, Fut>(mut self, path: &str, default: F) -> Self
    where
        K: Resource + DeserializeOwned + Serialize + Clone + Send + Sync + 'static,
        F: Fn(K, AdmissionRequest<K>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<K, Verdict>> + Send + 'static,
    {
        let default = Arc::new(default);
        let route = typed(true, move |request: AdmissionRequest<K>, raw, stack| {
            let default = Arc::clone(&default);
            async move {
                let response = AdmissionResponse::from(&request);
                let before = match &request.object {
                    Some(object) if request.operation != Operation::Delete => object.clone(),
                    _ => return answered(response, Verdict::allow()),
                };
                // `raw`, the object as the API server sent it: the patch is to it.
                let object = before.clone();
                match guarded(|| default(object, request)).await {
                    Ok(Ok(after)) => patched(stack, response, raw, before, after).await,
                    Ok(Err(verdict)) => answered(response, verdict),
                    Err(message) => Outcome::Panicked {
                        response: Box::new(response),
                        message,
                    },
                }
            }
        });
        self.routes.push((path.to_owned(), route));
        self
    }

    /// The conversion webhook of a custom resource at `path` (the CRD's
    /// `spec.conversion.webhook.clientConfig`), hub and spoke: see
    /// [`Conversion`]. A conversion that panics fails its review with a
    /// message naming the panic.
    #[must_use]
    pub fn convert<H>(mut self, path: &str, conversion: Conversion<H>) -> Self
    where
        H: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Send + Sync + 'static,
    {
        self.converts
            .push((H::group(&()).into_owned(), H::plural(&()).into_owned()));
        let conversion = Arc::new(conversion);
        let route: Route = Arc::new(move |body: Bytes| {
            let conversion = Arc::clone(&conversion);
            measured("a ConversionReview", body, move |body, _| async move {
                let sent = match nesting::from_slice::<ConversionReview>(&body) {
                    Ok(sent) => sent,
                    Err(e) => return Outcome::Malformed(format!("not a ConversionReview: {e}")),
                };
                let request = match ConversionRequest::try_from(sent) {
                    Ok(request) => request,
                    Err(e) => {
                        return Outcome::Malformed(format!(
                            "a ConversionReview without a request: {e}"
                        ));
                    }
                };
                let skeleton = ConversionResponse::for_request(ConversionRequest {
                    types: request.types.clone(),
                    uid: request.uid.clone(),
                    desired_api_version: request.desired_api_version.clone(),
                    objects: Vec::new(),
                });
                let converted = guarded(|| async { conversion.review(request) }).await;
                Outcome::Converted(review(&match converted {
                    Ok(review) => review,
                    Err(message) => conversion::panicked(skeleton, &message),
                }))
            })
        });
        self.routes.push((path.to_owned(), route));
        self
    }

    /// What a handler that panics is answered with ([`OnPanic::Deny`] by
    /// default).
    #[must_use]
    pub fn on_panic(mut self, on_panic: OnPanic) -> Self {
        self.on_panic = on_panic;
        self
    }

    /// Reports every request to `observer` (metrics).
    #[must_use]
    pub fn observe(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The largest request body read ([`DEFAULT_MAX_BODY_BYTES`] by
    /// default); a larger one is answered 413.
    #[must_use]
    pub fn max_body_bytes(mut self, bytes: usize) -> Self {
        self.max_body_bytes = Some(bytes);
        self
    }

    /// Binds `addr` (port 0: a free one) to serve these webhooks with the
    /// certificate of `tls`. Fails on a path given twice, or one that does
    /// not start with `/`.
    pub async fn bind(self, addr: SocketAddr, tls: Arc<CertFiles>) -> Result<Server, WebhookError> {
        let mut routes = HashMap::new();
        for (path, route) in self.routes {
            if !path.starts_with('/') {
                return Err(WebhookError::Path(format!(
                    "{path:?} does not start with /"
                )));
            }
            if routes.insert(path.clone(), route).is_some() {
                return Err(WebhookError::Path(format!("{path:?} is given twice")));
            }
        }
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| WebhookError::Bind { addr, source })?;
        let local_addr = listener
            .local_addr()
            .map_err(|source| WebhookError::Bind { addr, source })?;
        Ok(Server {
            listener,
            local_addr,
            acceptor: TlsAcceptor::from(tls.server_config()?),
            routes: Arc::new(Routes {
                routes,
                observer: self.observer,
                on_panic: self.on_panic,
                max_body_bytes: self.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES),
            }),
        })
    }
}

struct Routes {
    routes: HashMap<String, Route>,
    observer: Option<Arc<dyn Observer>>,
    on_panic: OnPanic,
    max_body_bytes: usize,
}

/// A bound webhook server; [`run`](Self::run) serves it.
pub struct Server {
    listener: TcpListener,
    local_addr: SocketAddr,
    acceptor: TlsAcceptor,
    routes: Arc<Routes>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl Server {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` is cancelled, then stops accepting (new
    /// connections are refused), lets the requests in flight finish, at
    /// most 10 s, and returns.
    pub async fn run(self, shutdown: CancellationToken) {
        let connections = TaskTracker::new();
        loop {
            let accepted = tokio::select! {
                _ = shutdown.cancelled() => break,
                accepted = self.listener.accept() => accepted,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: not fatal.
                    warn!(%error, "accepting a webhook connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // A review's answer goes out as soon as it is written, not held
            // back for the peer's acknowledgement of the last segment
            // (Nagle), as Go's servers (controller-runtime's) do by default.
            if let Err(error) = tcp.set_nodelay(true) {
                debug!(%error, "TCP_NODELAY not set on a webhook connection");
            }
            let (acceptor, routes, shutdown) = (
                self.acceptor.clone(),
                Arc::clone(&self.routes),
                shutdown.clone(),
            );
            connections.spawn(async move {
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(error)) => {
                        debug!(%peer, %error, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
                let phase = Phase::new();
                let service = service_fn({
                    let phase = phase.clone();
                    move |request| {
                        phase.answering();
                        let (routes, phase) = (Arc::clone(&routes), phase.clone());
                        async move {
                            let response = routes.answer(request).await;
                            phase.answered();
                            Ok::<_, Infallible>(response)
                        }
                    }
                });
                // A request's head is timed from its first byte, an idle
                // connection kept long (see `connection`): not hyper's
                // header timeout, which runs while idle.
                let connection = http1::Builder::new()
                    .header_read_timeout(None)
                    .serve_connection(TokioIo::new(Timed::new(tls, phase)), service);
                tokio::pin!(connection);
                tokio::select! {
                    _ = connection.as_mut() => {}
                    _ = shutdown.cancelled() => {
                        // Idle keep-alive connections close at once; a
                        // request in flight gets DRAIN_TIMEOUT.
                        connection.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(DRAIN_TIMEOUT, connection).await;
                    }
                }
            });
        }
        drop(self.listener);
        connections.close();
        connections.wait().await;
    }
}

fn plain(status: StatusCode, message: impl Into<String>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message.into())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn review<T: Serialize>(review: &T) -> Response<Full<Bytes>> {
    match serde_json::to_vec(review) {
        Ok(body) => {
            let mut response = Response::new(Full::new(Bytes::from(body)));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                header::HeaderValue::from_static("application/json"),
            );
            response
        }
        Err(error) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot write the review: {error}"),
        ),
    }
}

/// The `timeout` query parameter the API server sends (Go's duration
/// format: `10s`, `1m0s`, `500ms`), if there is one that reads.
fn timeout_of(query: Option<&str>) -> Option<Duration> {
    let value = query?
        .split('&')
        .find_map(|pair| pair.strip_prefix("timeout="))?;
    go_duration(value)
}

/// Go's `time.Duration` string: a sequence of decimal numbers, each with a
/// unit (`h`, `m`, `s`, `ms`, `us`, `µs`, `ns`).
fn go_duration(mut s: &str) -> Option<Duration> {
    if s.is_empty() {
        return None;
    }
    let mut total = Duration::ZERO;
    while !s.is_empty() {
        let digits = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = s[..digits].parse().ok()?;
        s = &s[digits..];
        let unit = s.find(|c: char| c.is_ascii_digit()).unwrap_or(s.len());
        let seconds = match &s[..unit] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += Duration::try_from_secs_f64(number * seconds).ok()?;
        s = &s[unit..];
    }
    Some(total)
}

/// A request being answered: reported finished when dropped, as 499 (the
/// client went away, nginx's code) if no answer was made.
struct InFlight {
    observer: Arc<dyn Observer>,
    webhook: String,
    started: std::time::Instant,
    status: Option<u16>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.observer
            .finished(&self.webhook, self.status.unwrap_or(499), seconds);
    }
}

impl Routes {
    /// [`answer_unobserved`](Self::answer_unobserved), reported to the observer.
    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let Some(observer) = &self.observer else {
            return self.answer_unobserved(request).await;
        };
        let webhook = match request.uri().path() {
            path if self.routes.contains_key(path) => path.to_owned(),
            _ => "unknown".to_owned(),
        };
        observer.started(&webhook);
        let mut in_flight = InFlight {
            observer: Arc::clone(observer),
            webhook,
            started: std::time::Instant::now(),
            status: None,
        };
        let response = self.answer_unobserved(request).await;
        in_flight.status = Some(response.status().as_u16());
        response
    }

    async fn answer_unobserved(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "webhooks take POST");
        }
        let path = request.uri().path().to_owned();
        let Some(route) = self.routes.get(&path) else {
            let mut served: Vec<&str> = self.routes.keys().map(String::as_str).collect();
            served.sort_unstable();
            return plain(
                StatusCode::NOT_FOUND,
                format!("no webhook at {path}; served: {}", served.join(", ")),
            );
        };
        let json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| {
                v.split(';')
                    .next()
                    .is_some_and(|t| t.trim() == "application/json")
            });
        if !json {
            return plain(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "an AdmissionReview is sent as Content-Type: application/json",
            );
        }
        let timeout = timeout_of(request.uri().query())
            .unwrap_or(DEFAULT_TIMEOUT)
            .min(MAX_TIMEOUT);
        let too_large = || {
            plain(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {} bytes", self.max_body_bytes),
            )
        };
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body_bytes as u64) {
            return too_large();
        }
        let (route, on_panic) = (Arc::clone(route), self.on_panic);
        let body = Limited::new(request.into_body(), self.max_body_bytes);
        // The API server rounds its remaining time up to whole seconds
        // when it sends it: answer a second (or a tenth) early.
        let bound = timeout.saturating_sub((timeout / 10).max(Duration::from_millis(500)));
        let answered = tokio::time::timeout(bound, async move {
            let body = match body.collect().await {
                Ok(body) => body.to_bytes(),
                Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                    return Err(too_large());
                }
                Err(error) => {
                    return Err(plain(
                        StatusCode::BAD_REQUEST,
                        format!("reading the body: {error}"),
                    ));
                }
            };
            // A panic outside the handler (a type's own Deserialize or
            // Serialize): a 500, and the server goes on.
            Ok(AssertUnwindSafe(route(body))
                .catch_unwind()
                .await
                .unwrap_or_else(|p| Outcome::Failed(panic_message(&*p))))
        })
        .await;
        match answered {
            Err(_) => plain(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the webhook did not answer within {bound:?} (the call's timeout is {timeout:?})"
                ),
            ),
            Ok(Err(response)) => response,
            Ok(Ok(Outcome::Answered(answer))) => review(&*answer),
            Ok(Ok(Outcome::Converted(answer))) => answer,
            Ok(Ok(Outcome::Malformed(why))) => plain(StatusCode::BAD_REQUEST, why),
            Ok(Ok(Outcome::Failed(panic))) => {
                warn!(path, panic = %panic, "a webhook panicked outside its handler");
                plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the webhook panicked: {panic}"),
                )
            }
            Ok(Ok(Outcome::Panicked { response, message })) => {
                warn!(path, panic = %message, "a webhook handler panicked");
                let why = format!("the webhook's handler panicked: {message}");
                match on_panic {
                    OnPanic::Deny => review(&admission::answer(*response, Verdict::deny(why))),
                    OnPanic::Error => plain(StatusCode::INTERNAL_SERVER_ERROR, why),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_read_as_the_api_server_writes_them() {
        assert_eq!(go_duration("10s"), Some(Duration::from_secs(10)));
        assert_eq!(go_duration("1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(go_duration("1m30s"), Some(Duration::from_secs(90)));
        assert_eq!(go_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(go_duration("1.5s"), Some(Duration::from_millis(1500)));
        for bad in ["", "10", "s", "10x", "-1s", "1e400s"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
        assert_eq!(
            timeout_of(Some("a=b&timeout=2s")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(timeout_of(Some("timeout=junk")), None);
        assert_eq!(timeout_of(None), None);
    }
}
