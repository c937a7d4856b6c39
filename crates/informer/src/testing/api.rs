//! [`FakeApiServer`]: a kube `Client` over an in-memory tower service.
//!
//! Requests are read as kube-apiserver's `RequestInfoFactory` reads them
//! (`/api/v1/namespaces/{ns}/{resource}/{name}/{subresource}`, and
//! `/apis/{group}/{version}/...`), so that the verb, resource, namespace
//! and name of each are known, and answered from one store of JSON objects
//! with one resource version counter, as etcd behind one API server would.
//! The store's lock is held for one request's answer, never across an
//! `.await`: a held write waits before it takes the lock.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode, Uri};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use kube_client::Client;
use kube_client::client::Body;
use parking_lot::Mutex;
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, watch};

use super::INITIAL_EVENTS_END;
use crate::GroupResource;

type AnswerBody = UnsyncBoxBody<Bytes, Infallible>;

/// An in-process API server for unit tests: [`client`](Self::client) is a
/// kube [`Client`] whose requests it answers from its own store of JSON
/// objects, without a socket.
///
/// What it serves, as kube-apiserver would:
/// - `get`, `list` (every object in one page; label selectors `k=v`,
///   `k!=v`, `k`, `!k` and field selectors on `metadata.name` and
///   `metadata.namespace`), `watch` (a streaming list's ADDED events and
///   end bookmark; from a resource version, every change after it; from
///   none or `"0"`, ADDED for each object first; then each change as it
///   happens, until the client drops it);
/// - `create` (409 AlreadyExists for a name taken; `generateName`),
///   `update` (409 Conflict for a stale resourceVersion), `patch` (merge,
///   strategic merge, which it treats as a merge, and apply, which creates),
///   `delete` and `deletecollection`, each giving the object the next
///   resource version (one counter for the store) and a `uid` when it has
///   none; writes to the `status` subresource change only `status`.
///
/// What it does not: defaulting, validation, finalizers (a delete removes
/// at once), watch timeouts, paging, JSON patch (415), discovery (404).
/// Answers are JSON whatever the client accepts (the informers read JSON
/// when that is what comes).
///
/// What the test steers: [`refuse`](Self::refuse) (any status, by verb and
/// resource), [`hold_writes`](Self::hold_writes); what it reads:
/// [`requests`](Self::requests) and the store. Clones share the store.
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_informer::kube::Api;
/// use kinformer_informer::kube::api::PostParams;
/// use kinformer_informer::testing::FakeApiServer;
/// use serde_json::json;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let server = FakeApiServer::new();
/// server.insert("configmaps", json!({"metadata": {"namespace": "ns", "name": "a"}}));
/// let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
/// assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 1);
///
/// server.refuse("create", "configmaps", 403);
/// let b = serde_json::from_value(json!({"metadata": {"name": "b"}})).unwrap();
/// assert!(api.create(&PostParams::default(), &b).await.is_err());
/// let verbs: Vec<_> = server.requests().iter().map(|r| r.verb).collect();
/// assert_eq!(verbs, ["list", "create"]);
/// # }
/// ```
#[derive(Clone, Default)]
pub struct FakeApiServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.state.lock();
        let objects: usize = state.objects.values().map(BTreeMap::len).sum();
        f.debug_struct("FakeApiServer")
            .field("resource_version", &state.version)
            .field("objects", &objects)
            .field("watches", &state.watchers.len())
            .field("requests", &state.requests.len())
            .finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<State>,
    /// Requests received so far.
    arrived: watch::Sender<usize>,
    /// Whether writes are answered (`false`: held).
    writes_open: watch::Sender<bool>,
    writes_in_flight: AtomicUsize,
    max_writes_in_flight: AtomicUsize,
}

impl Default for Shared {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                version: 1,
                ..State::default()
            }),
            arrived: watch::Sender::new(0),
            writes_open: watch::Sender::new(true),
            writes_in_flight: AtomicUsize::new(0),
            max_writes_in_flight: AtomicUsize::new(0),
        }
    }
}

/// The store: objects by resource, then by (namespace or "", name).
#[derive(Default)]
struct State {
    version: u64,
    objects: BTreeMap<GroupResource, BTreeMap<(String, String), Value>>,
    /// Every change, for watches from an older version.
    history: Vec<Change>,
    watchers: Vec<Watcher>,
    refusals: Vec<Refusal>,
    requests: Vec<ApiRequest>,
    uids: u64,
}

struct Change {
    version: u64,
    resource: GroupResource,
    kind: &'static str,
    object: Value,
}

struct Watcher {
    resource: GroupResource,
    namespace: Option<String>,
    selector: Selector,
    frames: mpsc::UnboundedSender<Bytes>,
}

struct Refusal {
    verb: String,
    resource: String,
    code: u16,
}

impl FakeApiServer {
    /// An empty server, at resource version 1.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client of this server, default namespace `default`; made inside a
    /// Tokio runtime (kube's client spawns its buffer's worker).
    pub fn client(&self) -> Client {
        Client::new(Service(Arc::clone(&self.shared)), "default")
    }

    /// Stores `object` as a `resource` (`configmaps`; with its group when
    /// it has one, as kubectl writes it: `deployments.apps`), replacing any
    /// of the same namespace and name, and tells the watches. An object
    /// with a resourceVersion keeps it (the store's version is then at
    /// least that); one without is given the next.
    ///
    /// # Panics
    ///
    /// If `object`, or its `metadata`, is not a JSON object.
    pub fn insert(&self, resource: &str, mut object: Value) -> &Self {
        assert!(
            object.is_object() && object.get("metadata").is_none_or(Value::is_object),
            "a stored object is a JSON object with object metadata: {object}"
        );
        let resource = parse_resource(resource);
        let mut state = self.shared.state.lock();
        let version = match object["metadata"]["resourceVersion"].as_str() {
            Some(v) => v.parse().unwrap_or(state.version),
            None => {
                let next = state.version + 1;
                object["metadata"]["resourceVersion"] = json!(next.to_string());
                next
            }
        };
        state.version = state.version.max(version);
        let key = key_of(&object);
        let store = state.objects.entry(resource.clone()).or_default();
        let kind = if store.insert(key, object.clone()).is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        state.changed(Change {
            version,
            resource,
            kind,
            object,
        });
        self
    }

    /// The stored `resource` object `name` in `namespace` (`None`: a
    /// cluster-scoped one).
    pub fn get(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let state = self.shared.state.lock();
        let key = (namespace.unwrap_or_default().to_owned(), name.to_owned());
        state
            .objects
            .get(&parse_resource(resource))?
            .get(&key)
            .cloned()
    }

    /// Every stored `resource` object, by namespace and name.
    pub fn list(&self, resource: &str) -> Vec<Value> {
        let state = self.shared.state.lock();
        let objects = state.objects.get(&parse_resource(resource));
        objects
            .into_iter()
            .flat_map(|o| o.values().cloned())
            .collect()
    }

    /// Removes a stored object, as a delete would (the watches are told).
    pub fn remove(&self, resource: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let key = (namespace.unwrap_or_default().to_owned(), name.to_owned());
        self.shared
            .state
            .lock()
            .delete(&parse_resource(resource), &key)
    }

    /// Removes every stored `resource` object.
    pub fn clear(&self, resource: &str) {
        let resource = parse_resource(resource);
        let mut state = self.shared.state.lock();
        let keys: Vec<_> = state
            .objects
            .get(&resource)
            .into_iter()
            .flat_map(|o| o.keys().cloned())
            .collect();
        for key in keys {
            state.delete(&resource, &key);
        }
    }

    /// The store's resource version: that of its last change.
    pub fn resource_version(&self) -> String {
        self.shared.state.lock().version.to_string()
    }

    /// Answers each request for `verb` (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`, `deletecollection`; `*` for any) of
    /// `resource` (as in [`insert`](Self::insert), with `/subresource` for
    /// one only; `*` for any) with a Status of `code` (403, 410, 429,
    /// 500...), until [`clear_refusals`](Self::clear_refusals). The first
    /// refusal that matches wins.
    pub fn refuse(&self, verb: &str, resource: &str, code: u16) -> &Self {
        self.shared.state.lock().refusals.push(Refusal {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            code,
        });
        self
    }

    /// Refuses nothing any more.
    pub fn clear_refusals(&self) {
        self.shared.state.lock().refusals.clear();
    }

    /// Holds each write (create, update, patch, delete) that comes from now
    /// on unanswered, until [`release_writes`](Self::release_writes); reads
    /// are answered.
    pub fn hold_writes(&self) {
        self.shared.writes_open.send_replace(false);
    }

    /// Answers the writes held, and those to come.
    pub fn release_writes(&self) {
        self.shared.writes_open.send_replace(true);
    }

    /// The most writes that were in flight (received, not yet answered) at
    /// once.
    pub fn max_writes_in_flight(&self) -> usize {
        self.shared.max_writes_in_flight.load(Ordering::SeqCst)
    }

    /// Every request received, oldest first, held ones included.
    pub fn requests(&self) -> Vec<ApiRequest> {
        self.shared.state.lock().requests.clone()
    }

    /// Waits until at least `count` requests have been received.
    pub async fn wait_for_requests(&self, count: usize) {
        let mut arrived = self.shared.arrived.subscribe();
        // The sender lives as long as `self`: this cannot fail.
        let _ = arrived.wait_for(|n| *n >= count).await;
    }
}

/// One request as the fake server read it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ApiRequest {
    /// The API verb: `get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection` (for a path that names no resource,
    /// the method in lower case).
    pub verb: &'static str,
    /// The resource, if the path names one.
    pub resource: Option<GroupResource>,
    /// The subresource (`status`, `scale`...), if any.
    pub subresource: Option<String>,
    /// The namespace of the path, if any.
    pub namespace: Option<String>,
    /// The object's name, if the path names one.
    pub name: Option<String>,
    /// The HTTP method.
    pub method: Method,
    /// Path and query.
    pub uri: Uri,
    /// The `Content-Type` header (a patch's type), if any.
    pub content_type: Option<String>,
    /// The body.
    pub body: Bytes,
}

impl ApiRequest {
    fn read(method: Method, uri: Uri, content_type: Option<String>, body: Bytes) -> Self {
        let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segments.as_slice() {
            ["api", _version, rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => ("", &[][..]),
        };
        let mut rest = rest;
        let mut namespace = None;
        if rest.first() == Some(&"namespaces") && rest.len() > 1 {
            namespace = Some(rest[1].to_owned());
            // As RequestInfoFactory: a namespace's own subresources stay.
            if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
                rest = &rest[2..];
            }
        }
        let resource = rest.first().map(|r| GroupResource::new(group, *r));
        if resource
            .as_ref()
            .is_some_and(|r| r.resource == "namespaces")
        {
            namespace = None;
        }
        let name = rest.get(1).map(|n| (*n).to_owned());
        let subresource = rest.get(2).map(|s| (*s).to_owned());
        let watching = query_param(&uri, "watch").is_some_and(|w| w == "true" || w == "1");
        let verb = match (&method, resource.is_some(), name.is_some()) {
            (&Method::GET, true, true) => "get",
            (&Method::GET, true, false) if watching => "watch",
            (&Method::GET, true, false) => "list",
            (&Method::POST, true, _) => "create",
            (&Method::PUT, true, _) => "update",
            (&Method::PATCH, true, _) => "patch",
            (&Method::DELETE, true, true) => "delete",
            (&Method::DELETE, true, false) => "deletecollection",
            (&Method::GET, false, _) => "get",
            (&Method::POST, false, _) => "post",
            (&Method::PUT, false, _) => "put",
            (&Method::PATCH, false, _) => "patch",
            (&Method::DELETE, false, _) => "delete",
            _ => "unknown",
        };
        Self {
            verb,
            resource,
            subresource,
            namespace,
            name,
            method,
            uri,
            content_type,
            body,
        }
    }

    /// The body as JSON, if it is.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The query parameter `name`, decoded, if present.
    pub fn query(&self, name: &str) -> Option<String> {
        query_param(&self.uri, name)
    }

    fn is_write(&self) -> bool {
        matches!(
            self.verb,
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }
}

fn query_param(uri: &Uri, name: &str) -> Option<String> {
    form_urlencoded::parse(uri.query()?.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// `configmaps` or `deployments.apps`.
fn parse_resource(resource: &str) -> GroupResource {
    match resource.split_once('.') {
        Some((resource, group)) => GroupResource::new(group, resource),
        None => GroupResource::new("", resource),
    }
}

/// Where an object is stored: its namespace (or "") and name.
fn key_of(object: &Value) -> (String, String) {
    let field = |f: &str| {
        object["metadata"][f]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    (field("namespace"), field("name"))
}

struct Service(Arc<Shared>);

impl tower_service::Service<Request<Body>> for Service {
    type Response = Response<AnswerBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<AnswerBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let shared = Arc::clone(&self.0);
        Box::pin(async move { Ok(shared.serve(request).await) })
    }
}

impl Shared {
    async fn serve(&self, request: Request<Body>) -> Response<AnswerBody> {
        let (parts, body) = request.into_parts();
        let body = match body.collect().await {
            Ok(body) => body.to_bytes(),
            Err(e) => return status(400, "BadRequest", &format!("unreadable body: {e}")),
        };
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let request = ApiRequest::read(parts.method, parts.uri, content_type, body);
        self.state.lock().requests.push(request.clone());
        self.arrived.send_modify(|n| *n += 1);
        if !request.is_write() {
            return self.state.lock().answer(&request);
        }
        let now = self.writes_in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_writes_in_flight.fetch_max(now, Ordering::SeqCst);
        // The sender lives in `self`: this cannot fail.
        let _ = self.writes_open.subscribe().wait_for(|open| *open).await;
        let answer = self.state.lock().answer(&request);
        self.writes_in_flight.fetch_sub(1, Ordering::SeqCst);
        answer
    }
}

impl State {
    fn answer(&mut self, request: &ApiRequest) -> Response<AnswerBody> {
        let Some(resource) = request.resource.clone() else {
            return status(
                404,
                "NotFound",
                "the server could not find the requested resource",
            );
        };
        if let Some(code) = self.refusal(request.verb, &resource, request.subresource.as_deref()) {
            let message = format!("{} {resource} refused by the test", request.verb);
            return status(code, reason(code), &message);
        }
        if request
            .subresource
            .as_deref()
            .is_some_and(|s| s != "status")
        {
            let message = format!("{resource} subresources other than status are not served");
            return status(405, "MethodNotAllowed", &message);
        }
        if request.is_write()
            && !request
                .json()
                .is_none_or(|b| b.get("metadata").is_none_or(Value::is_object))
        {
            return status(400, "BadRequest", "metadata is not a JSON object");
        }
        let namespace = request.namespace.clone();
        let selector = match Selector::read(request) {
            Ok(selector) => selector,
            Err(message) => return status(400, "BadRequest", &message),
        };
        let key = (
            namespace.clone().unwrap_or_default(),
            request.name.clone().unwrap_or_default(),
        );
        match request.verb {
            "get" => match self.objects.get(&resource).and_then(|o| o.get(&key)) {
                Some(object) => ok(200, object),
                None => not_found(&resource, &key.1),
            },
            "list" => {
                let items = self.matching(&resource, namespace.as_deref(), &selector);
                ok(200, &self.list_of(items))
            }
            "watch" => self.watch(request, resource, namespace, selector),
            "create" => self.create(request, &resource, namespace),
            "update" | "patch" => self.update(request, &resource, &key),
            "delete" => match self.delete(&resource, &key) {
                Some(object) => ok(200, &object),
                None => not_found(&resource, &key.1),
            },
            "deletecollection" => {
                let gone = self.matching(&resource, namespace.as_deref(), &selector);
                for object in &gone {
                    self.delete(&resource, &key_of(object));
                }
                ok(200, &self.list_of(gone))
            }
            verb => status(405, "MethodNotAllowed", &format!("{verb} is not served")),
        }
    }

    fn refusal(&self, verb: &str, resource: &GroupResource, sub: Option<&str>) -> Option<u16> {
        let name = resource.to_string();
        let named = |r: &str| match (r.split_once('/'), sub) {
            (Some((r, s)), Some(sub)) => r == name && s == sub,
            (Some(_), None) => false,
            (None, _) => r == name,
        };
        self.refusals
            .iter()
            .find(|r| {
                (r.verb == "*" || r.verb == verb) && (r.resource == "*" || named(&r.resource))
            })
            .map(|r| r.code)
    }

    fn matching(
        &self,
        resource: &GroupResource,
        namespace: Option<&str>,
        selector: &Selector,
    ) -> Vec<Value> {
        let objects = self
            .objects
            .get(resource)
            .into_iter()
            .flat_map(|o| o.values());
        objects
            .filter(|o| selector.matches(namespace, o))
            .cloned()
            .collect()
    }

    fn list_of(&self, items: Vec<Value>) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": self.version.to_string()},
            "items": items,
        })
    }

    fn watch(
        &mut self,
        request: &ApiRequest,
        resource: GroupResource,
        namespace: Option<String>,
        selector: Selector,
    ) -> Response<AnswerBody> {
        let from = request.query("resourceVersion").unwrap_or_default();
        let mut frames = Vec::new();
        let streaming = request.query("sendInitialEvents").as_deref() == Some("true");
        if streaming || from.is_empty() || from == "0" {
            for object in self.matching(&resource, namespace.as_deref(), &selector) {
                frames.push(frame("ADDED", object));
            }
        } else {
            let Ok(from) = from.parse::<u64>() else {
                return status(400, "BadRequest", &format!("resourceVersion {from:?}"));
            };
            for change in &self.history {
                if change.version > from
                    && change.resource == resource
                    && selector.matches(namespace.as_deref(), &change.object)
                {
                    frames.push(frame(change.kind, change.object.clone()));
                }
            }
        }
        if streaming {
            let end = json!({"apiVersion": "v1", "kind": "Status", "metadata": {
                "resourceVersion": self.version.to_string(),
                "annotations": {INITIAL_EVENTS_END: "true"},
            }});
            frames.push(frame("BOOKMARK", end));
        }
        let (sender, mut receiver) = mpsc::unbounded_channel();
        self.watchers.push(Watcher {
            resource,
            namespace,
            selector,
            frames: sender,
        });
        let first = futures::stream::iter([Bytes::from(frames.concat())]);
        let rest = futures::stream::poll_fn(move |cx| receiver.poll_recv(cx));
        let frames = first
            .chain(rest)
            .map(|b| Ok::<_, Infallible>(Frame::data(b)));
        respond(200, StreamBody::new(frames).boxed_unsync())
    }

    fn create(
        &mut self,
        request: &ApiRequest,
        resource: &GroupResource,
        namespace: Option<String>,
    ) -> Response<AnswerBody> {
        let Some(mut object) = request.json().filter(Value::is_object) else {
            return status(400, "BadRequest", "the body is not a JSON object");
        };
        let meta = &mut object["metadata"];
        if meta["name"].as_str().is_none_or(str::is_empty) {
            let Some(prefix) = meta["generateName"].as_str().filter(|p| !p.is_empty()) else {
                return status(422, "Invalid", "name or generateName is required");
            };
            meta["name"] = json!(format!("{prefix}{:05}", self.uids + 1));
        }
        if let Some(ns) = namespace {
            if meta["namespace"].as_str().is_some_and(|own| own != ns) {
                let message = "the namespace of the object does not match the request's";
                return status(400, "BadRequest", message);
            }
            meta["namespace"] = json!(ns);
        }
        let key = key_of(&object);
        if self
            .objects
            .get(resource)
            .is_some_and(|o| o.contains_key(&key))
        {
            let message = format!("{resource} {:?} already exists", key.1);
            return status(409, "AlreadyExists", &message);
        }
        self.store(resource, key, object, "ADDED", 201)
    }

    fn update(
        &mut self,
        request: &ApiRequest,
        resource: &GroupResource,
        key: &(String, String),
    ) -> Response<AnswerBody> {
        let Some(body) = request.json().filter(Value::is_object) else {
            return status(400, "BadRequest", "the body is not a JSON object");
        };
        let apply = request.content_type.as_deref() == Some("application/apply-patch+yaml");
        if request.verb == "patch"
            && !apply
            && !matches!(
                request.content_type.as_deref(),
                Some("application/merge-patch+json" | "application/strategic-merge-patch+json")
            )
        {
            let message = format!("patch type {:?} is not served", request.content_type);
            return status(415, "UnsupportedMediaType", &message);
        }
        let stored = self.objects.get(resource).and_then(|o| o.get(key)).cloned();
        let Some(mut object) = stored else {
            if apply {
                let mut object = body;
                object["metadata"]["name"] = json!(key.1);
                if !key.0.is_empty() {
                    object["metadata"]["namespace"] = json!(key.0);
                }
                return self.store(resource, key.clone(), object, "ADDED", 201);
            }
            return not_found(resource, &key.1);
        };
        let wanted = body["metadata"]["resourceVersion"].as_str();
        if wanted.is_some_and(|v| Some(v) != object["metadata"]["resourceVersion"].as_str()) {
            let message = format!(
                "{resource} {:?}: the object has been modified; please apply your changes to the latest version and try again",
                key.1
            );
            return status(409, "Conflict", &message);
        }
        let status_only = request.subresource.as_deref() == Some("status");
        match (request.verb, status_only) {
            ("update", true) => object["status"] = body["status"].clone(),
            ("update", false) => {
                let old = std::mem::replace(&mut object, body);
                for kept in ["uid", "creationTimestamp"] {
                    if let Some(value) = old["metadata"].get(kept) {
                        object["metadata"][kept] = value.clone();
                    }
                }
            }
            (_, true) => merge(&mut object["status"], &body["status"]),
            (_, false) => merge(&mut object, &body),
        }
        object["metadata"]["name"] = json!(key.1);
        if !key.0.is_empty() {
            object["metadata"]["namespace"] = json!(key.0);
        }
        self.store(resource, key.clone(), object, "MODIFIED", 200)
    }

    /// Stores `object` at the next version, with a uid if it has none.
    fn store(
        &mut self,
        resource: &GroupResource,
        key: (String, String),
        mut object: Value,
        kind: &'static str,
        code: u16,
    ) -> Response<AnswerBody> {
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        if object["metadata"]["uid"].as_str().is_none() {
            self.uids += 1;
            object["metadata"]["uid"] = json!(format!("00000000-0000-0000-0000-{:012}", self.uids));
        }
        let objects = self.objects.entry(resource.clone()).or_default();
        objects.insert(key, object.clone());
        self.changed(Change {
            version: self.version,
            resource: resource.clone(),
            kind,
            object: object.clone(),
        });
        ok(code, &object)
    }

    /// Removes an object at the next version; the watches see it go.
    fn delete(&mut self, resource: &GroupResource, key: &(String, String)) -> Option<Value> {
        let mut object = self.objects.get_mut(resource)?.remove(key)?;
        self.version += 1;
        object["metadata"]["resourceVersion"] = json!(self.version.to_string());
        self.changed(Change {
            version: self.version,
            resource: resource.clone(),
            kind: "DELETED",
            object: object.clone(),
        });
        Some(object)
    }

    /// Records a change and sends it to the watches it concerns; those
    /// whose client is gone are dropped.
    fn changed(&mut self, change: Change) {
        self.watchers.retain(|w| {
            if w.resource != change.resource
                || !w.selector.matches(w.namespace.as_deref(), &change.object)
            {
                return !w.frames.is_closed();
            }
            w.frames
                .send(Bytes::from(frame(change.kind, change.object.clone())))
                .is_ok()
        });
        self.history.push(change);
    }
}

/// A label and field selector, as far as the fake reads them.
#[derive(Default)]
struct Selector {
    labels: Vec<Requirement>,
    fields: Vec<Requirement>,
}

enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
}

impl Requirement {
    fn read(term: &str) -> Result<Self, String> {
        let term = term.trim();
        if term.contains(['(', ')']) {
            return Err(format!(
                "selector {term:?}: set-based requirements are not served"
            ));
        }
        Ok(if let Some((k, v)) = term.split_once("!=") {
            Self::NotEquals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
            Self::Equals(k.trim().to_owned(), v.trim().to_owned())
        } else if let Some(k) = term.strip_prefix('!') {
            Self::NotExists(k.trim().to_owned())
        } else {
            Self::Exists(term.to_owned())
        })
    }

    fn matches(&self, value: impl Fn(&str) -> Option<String>) -> bool {
        match self {
            Self::Equals(k, v) => value(k).as_ref() == Some(v),
            Self::NotEquals(k, v) => value(k).as_ref() != Some(v),
            Self::Exists(k) => value(k).is_some(),
            Self::NotExists(k) => value(k).is_none(),
        }
    }
}

impl Selector {
    fn read(request: &ApiRequest) -> Result<Self, String> {
        let terms = |param: &str| -> Result<Vec<Requirement>, String> {
            let selector = request.query(param).unwrap_or_default();
            let terms = selector.split(',').filter(|t| !t.trim().is_empty());
            terms.map(Requirement::read).collect()
        };
        let fields = terms("fieldSelector")?;
        for field in &fields {
            let (Requirement::Equals(k, _) | Requirement::NotEquals(k, _)) = field else {
                return Err("a field selector compares a field with = or !=".to_owned());
            };
            if k != "metadata.name" && k != "metadata.namespace" {
                return Err(format!("field label not supported: {k}"));
            }
        }
        Ok(Self {
            labels: terms("labelSelector")?,
            fields,
        })
    }

    /// Whether `object` is in `namespace` (any when `None`) and selected.
    fn matches(&self, namespace: Option<&str>, object: &Value) -> bool {
        let meta = &object["metadata"];
        let own = meta["namespace"].as_str().unwrap_or_default();
        if namespace.is_some_and(|ns| ns != own) {
            return false;
        }
        let label = |k: &str| meta["labels"][k].as_str().map(str::to_owned);
        let field = |k: &str| {
            let f = k.strip_prefix("metadata.").unwrap_or(k);
            Some(meta[f].as_str().unwrap_or_default().to_owned())
        };
        self.labels.iter().all(|r| r.matches(label)) && self.fields.iter().all(|r| r.matches(field))
    }
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (k, v) in patch {
            if v.is_null() {
                target.remove(k);
            } else {
                merge(target.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// One line of a watch's body.
fn frame(kind: &str, object: Value) -> Vec<u8> {
    let mut line = json!({"type": kind, "object": object})
        .to_string()
        .into_bytes();
    line.push(b'\n');
    line
}

fn respond(code: u16, body: AnswerBody) -> Response<AnswerBody> {
    let mut response = Response::new(body);
    *response.status_mut() =
        StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn ok(code: u16, object: &Value) -> Response<AnswerBody> {
    let body = http_body_util::Full::new(Bytes::from(object.to_string()));
    respond(code, body.map_err(|never| match never {}).boxed_unsync())
}

/// A failure Status.
fn status(code: u16, reason: &str, message: &str) -> Response<AnswerBody> {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    ok(code, &status)
}

fn not_found(resource: &GroupResource, name: &str) -> Response<AnswerBody> {
    status(404, "NotFound", &format!("{resource} {name:?} not found"))
}

/// The Status reason kube-apiserver gives with `code`.
fn reason(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "Unknown",
    }
}

#[cfg(test)]
mod tests {
    //! The fake itself, through kube's typed `Api` and through an informer.

    use std::time::Duration;

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::Api;
    use kube_client::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

    use super::*;
    use crate::{CancellationToken, SharedInformerFactory};

    fn cm(namespace: &str, name: &str, labels: Value) -> Value {
        json!({"metadata": {"namespace": namespace, "name": name, "labels": labels}})
    }

    fn code(error: kube_client::Error) -> u16 {
        match error {
            kube_client::Error::Api(status) => status.code,
            other => panic!("not an API error: {other}"),
        }
    }

    #[tokio::test]
    async fn lists_answer_the_stored_objects_of_the_namespace_and_selectors_asked_for() {
        let server = FakeApiServer::new();
        server
            .insert("configmaps", cm("ns", "a", json!({"app": "web"})))
            .insert("configmaps", cm("ns", "b", json!({"app": "db"})))
            .insert("configmaps", cm("other", "c", json!({"app": "web"})))
            .insert("secrets", cm("ns", "s", json!({})));
        let names = |list: kube_client::core::ObjectList<ConfigMap>| -> Vec<String> {
            list.items
                .into_iter()
                .filter_map(|c| c.metadata.name)
                .collect()
        };
        let ns: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
        let all: Api<ConfigMap> = Api::all(server.client());
        assert_eq!(
            names(ns.list(&ListParams::default()).await.unwrap()),
            ["a", "b"]
        );
        let web = ListParams::default().labels("app=web");
        assert_eq!(names(all.list(&web).await.unwrap()), ["a", "c"]);
        let not_a = ListParams::default().fields("metadata.name!=a");
        assert_eq!(names(ns.list(&not_a).await.unwrap()), ["b"]);
        let set_based = ListParams::default().labels("app in (web)");
        assert_eq!(code(ns.list(&set_based).await.unwrap_err()), 400);
        let request = &server.requests()[0];
        assert_eq!(
            (request.verb, request.namespace.as_deref()),
            ("list", Some("ns"))
        );
        assert_eq!(request.resource, Some(GroupResource::new("", "configmaps")));
    }

    #[tokio::test]
    async fn writes_are_answered_as_the_api_server_answers_them() {
        let server = FakeApiServer::new();
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
        let a: ConfigMap = serde_json::from_value(cm("ns", "a", json!({}))).unwrap();
        let created = api.create(&PostParams::default(), &a).await.unwrap();
        assert_eq!(created.metadata.resource_version.as_deref(), Some("2"));
        assert!(created.metadata.uid.is_some());
        let taken = api.create(&PostParams::default(), &a).await.unwrap_err();
        assert_eq!(code(taken), 409);

        let patch = json!({"data": {"k": "v"}});
        let patched = api
            .patch("a", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        assert_eq!(patched.data.unwrap()["k"], "v");
        assert_eq!(patched.metadata.uid, created.metadata.uid);
        let stale = api.replace("a", &PostParams::default(), &created).await;
        assert_eq!(code(stale.unwrap_err()), 409, "written at 2, now at 3");

        api.delete("a", &DeleteParams::default()).await.unwrap();
        assert_eq!(code(api.get("a").await.unwrap_err()), 404);
        assert!(server.get("configmaps", Some("ns"), "a").is_none());
        assert_eq!(server.resource_version(), "4");
        let verbs: Vec<_> = server.requests().iter().map(|r| r.verb).collect();
        assert_eq!(
            verbs,
            ["create", "create", "patch", "update", "delete", "get"]
        );
    }

    #[tokio::test]
    async fn a_refusal_answers_its_verb_and_resource_with_its_status_until_cleared() {
        let server = FakeApiServer::new();
        server.insert("configmaps", cm("ns", "a", json!({})));
        server.refuse("get", "configmaps", 403);
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
        assert_eq!(code(api.get("a").await.unwrap_err()), 403);
        assert!(
            api.list(&ListParams::default()).await.is_ok(),
            "a list is not a get"
        );
        server.clear_refusals();
        assert!(api.get("a").await.is_ok());
    }

    #[tokio::test]
    async fn held_writes_wait_for_the_release_while_reads_are_answered() {
        let server = FakeApiServer::new();
        server.hold_writes();
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
        let writes: Vec<_> = ["a", "b"]
            .into_iter()
            .map(|name| {
                let api = api.clone();
                let object: ConfigMap = serde_json::from_value(cm("ns", name, json!({}))).unwrap();
                tokio::spawn(async move { api.create(&PostParams::default(), &object).await })
            })
            .collect();
        server.wait_for_requests(2).await;
        assert!(
            api.list(&ListParams::default())
                .await
                .unwrap()
                .items
                .is_empty()
        );
        assert_eq!(server.max_writes_in_flight(), 2);
        server.release_writes();
        for write in writes {
            write.await.unwrap().unwrap();
        }
        assert_eq!(server.list("configmaps").len(), 2);
    }

    // Real time: the informer applies changes off the runtime's threads,
    // which paused time would not wait for.
    #[tokio::test]
    async fn an_informer_over_its_client_sees_the_stored_objects_then_each_write() {
        let server = FakeApiServer::new();
        server.insert("configmaps", cm("ns", "a", json!({})));
        let factory = SharedInformerFactory::new(server.client());
        let informer = factory.informer::<ConfigMap>();
        let shutdown = CancellationToken::new();
        factory.start(&shutdown);
        let synced = factory.wait_for_cache_sync(&shutdown).await;
        assert!(synced.iter().all(|(_, synced)| *synced));

        let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
        let b: ConfigMap = serde_json::from_value(cm("ns", "b", json!({}))).unwrap();
        api.create(&PostParams::default(), &b).await.unwrap();
        server.remove("configmaps", Some("ns"), "a");
        let mut keys = Vec::new();
        for _ in 0..500 {
            keys = informer.indexer().list_keys();
            if keys == ["ns/b"] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(keys, ["ns/b"]);
        shutdown.cancel();
    }

    #[tokio::test]
    async fn a_watch_from_a_version_replays_the_changes_after_it() {
        let server = FakeApiServer::new();
        server
            .insert("configmaps", cm("ns", "a", json!({})))
            .insert("configmaps", cm("ns", "b", json!({})));
        server.remove("configmaps", Some("ns"), "a");
        let api: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
        let params = kube_client::api::WatchParams::default();
        let watch = api.watch(&params, "2").await.unwrap();
        let events = watch
            .take(2)
            .map(|e| match e.unwrap() {
                kube_client::core::WatchEvent::Added(c) => format!("added {:?}", c.metadata.name),
                kube_client::core::WatchEvent::Deleted(c) => {
                    format!("deleted {:?}", c.metadata.name)
                }
                _ => "other".to_owned(),
            })
            .collect::<Vec<_>>();
        let events = tokio::time::timeout(Duration::from_secs(10), events)
            .await
            .expect("two changes after 2");
        assert_eq!(events, ["added Some(\"b\")", "deleted Some(\"a\")"]);
    }
}
