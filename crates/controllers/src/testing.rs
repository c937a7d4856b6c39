//! An in-process API server for deterministic unit tests: a kube
//! [`Client`] over a tower service that serves lists and watches of fixed
//! objects, no socket, so that tests run under Tokio's paused time. The
//! real-server suites (tests/) cover the same behaviour across the wire.
//!
//! Lists answer every object of the resource (and namespace) asked for, in
//! JSON; a streaming list sends them as ADDED events and its end bookmark; a
//! watch then stays open with nothing more.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use kube_client::Client;
use kube_client::client::Body;
use parking_lot::Mutex;
use serde_json::{Value, json};

/// The objects served, by resource (plural: `configmaps`).
#[derive(Default)]
pub(crate) struct FakeApi {
    objects: Mutex<BTreeMap<String, Vec<Value>>>,
}

impl FakeApi {
    /// Serves `object` (its `metadata.namespace` set) as a `resource`.
    pub(crate) fn serve(&self, resource: &str, object: Value) -> &Self {
        self.objects
            .lock()
            .entry(resource.to_owned())
            .or_default()
            .push(object);
        self
    }

    /// A client of this API, default namespace `ns`.
    pub(crate) fn client(self: &Arc<Self>) -> Client {
        Client::new(Service(Arc::clone(self)), "ns")
    }

    fn answer(&self, request: &Request<Body>) -> Response<BoxBody<Bytes, Infallible>> {
        let path = request.uri().path();
        let query = request.uri().query().unwrap_or("");
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let resource = segments.last().copied().unwrap_or_default();
        let namespace = segments
            .iter()
            .position(|s| *s == "namespaces")
            .and_then(|i| segments.get(i + 1))
            .filter(|_| segments.len() > 4);
        let items: Vec<Value> = self
            .objects
            .lock()
            .get(resource)
            .into_iter()
            .flatten()
            .filter(|o| namespace.is_none_or(|ns| o["metadata"]["namespace"] == **ns))
            .cloned()
            .collect();
        let has = |param: &str| query.split('&').any(|p| p == param);
        if !has("watch=true") && !has("watch=1") {
            let list = json!({
                "apiVersion": "v1",
                "kind": "List",
                "metadata": {"resourceVersion": "1"},
                "items": items,
            });
            return Self::body(Bytes::from(list.to_string()), false);
        }
        let mut frames = Vec::new();
        if has("sendInitialEvents=true") {
            for item in items {
                frames.push(json!({"type": "ADDED", "object": item}));
            }
            frames.push(json!({"type": "BOOKMARK", "object": {
                "apiVersion": "v1",
                "kind": "Status",
                "metadata": {
                    "resourceVersion": "1",
                    "annotations": {"k8s.io/initial-events-end": "true"},
                },
            }}));
        }
        let mut bytes = Vec::new();
        for frame in frames {
            bytes.extend_from_slice(frame.to_string().as_bytes());
            bytes.push(b'\n');
        }
        Self::body(Bytes::from(bytes), true)
    }

    /// A JSON answer; `stay_open`: its body never ends (a watch).
    fn body(bytes: Bytes, stay_open: bool) -> Response<BoxBody<Bytes, Infallible>> {
        let first = futures::stream::iter([Ok::<_, Infallible>(Frame::data(bytes))]);
        let body = if stay_open {
            BodyExt::boxed(StreamBody::new(first.chain(futures::stream::pending())))
        } else {
            BodyExt::boxed(StreamBody::new(first))
        };
        Response::builder()
            .header("content-type", "application/json")
            .body(body)
            .expect("a valid response")
    }
}

struct Service(Arc<FakeApi>);

impl tower_service::Service<Request<Body>> for Service {
    type Response = Response<BoxBody<Bytes, Infallible>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let response = self.0.answer(&request);
        Box::pin(async move { Ok(response) })
    }
}
