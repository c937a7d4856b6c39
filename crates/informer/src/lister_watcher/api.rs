//! [`ApiListerWatcher`]: lists and watches on kube-client, in protobuf
//! where the kind has it (the `kinformer-protobuf` crate) and JSON
//! otherwise, with the shard and selectors asked for, managedFields dropped
//! before decoding unless kept.

use std::fmt::Debug;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::StreamExt;
use futures::future::BoxFuture;
use kinformer_protobuf::{Call, Kind as ProtoKind};
use kube_client::api::{ListParams, VersionMatch};
use kube_client::core::Request;
use kube_client::{Client, Resource};
use serde::de::DeserializeOwned;

use super::sharding::{Shard, Sharding};
use super::{
    GroupResource, ListPage, ListRequest, ListerWatcher, ShardScope, WatchRequest, WatchStream,
    WireFormat, json,
};
use crate::{
    Detail, JsonShape, ListWatchError, ShardSelector, ShardStats, strip_managed_fields_json,
};

/// A [`ListerWatcher`] on kube-client: all objects of type `K` in one
/// namespace or in all, optionally narrowed by label and field selectors.
///
/// ```no_run
/// # fn demo(client: kube_client::Client) {
/// use k8s_openapi::api::core::v1::Pod;
/// use kinformer_informer::ApiListerWatcher;
/// use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};
///
/// let pods = ApiListerWatcher::<Pod>::namespaced(client.clone(), "web").labels("app=frontend");
/// // Metadata only: the server sends no spec or status.
/// let metas = ApiListerWatcher::<PartialObjectMeta<Pod>>::all(client.clone());
/// // Any kind, known at run time.
/// let gvk = GroupVersionKind::gvk("example.com", "v1", "Widget");
/// let widgets = ApiListerWatcher::<DynamicObject>::all_with(client, &ApiResource::from_gvk(&gvk));
/// # }
/// ```
pub struct ApiListerWatcher<K> {
    pub(super) client: Client,
    pub(super) url_path: String,
    plural: String,
    group: String,
    version: String,
    namespace: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    drop_managed_fields: bool,
    /// The built-in kind whose protobuf messages `K`'s are, when `K` takes protobuf.
    protobuf_kind: Option<&'static ProtoKind>,
    wire_format: WireFormat,
    /// The shard asked for, and how it went.
    pub(super) shard: Option<Sharding>,
    /// Bytes of response bodies received, shared by clones.
    received: Arc<AtomicU64>,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Debug for ApiListerWatcher<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiListerWatcher")
            .field("url_path", &self.url_path)
            .field("label_selector", &self.label_selector)
            .field("field_selector", &self.field_selector)
            .field("wire_format", &self.wire_format)
            .field("drop_managed_fields", &self.drop_managed_fields)
            .field("sharded", &self.shard.is_some())
            .field("received", &self.received.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl<K> Clone for ApiListerWatcher<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            url_path: self.url_path.clone(),
            plural: self.plural.clone(),
            group: self.group.clone(),
            version: self.version.clone(),
            namespace: self.namespace.clone(),
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            drop_managed_fields: self.drop_managed_fields,
            protobuf_kind: self.protobuf_kind,
            wire_format: self.wire_format,
            shard: self
                .shard
                .as_ref()
                .map(|s| Sharding::new(s.scope.clone(), Arc::clone(&s.stats))),
            received: Arc::clone(&self.received),
            _kind: PhantomData,
        }
    }
}

impl<K> ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    /// Objects in every namespace (or cluster-scoped objects).
    pub fn all(client: Client) -> Self {
        Self::new(client, None)
    }

    /// Objects in `namespace`.
    pub fn namespaced(client: Client, namespace: &str) -> Self {
        Self::new(client, Some(namespace))
    }

    /// Objects in `namespace`, or in all namespaces for `None`.
    pub fn new(client: Client, namespace: Option<&str>) -> Self {
        Self::new_with(client, namespace, &K::DynamicType::default())
    }
}

impl<K> ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Objects of the kind `dyntype` names (an `ApiResource` for
    /// `DynamicObject`) in every namespace, or cluster-scoped ones.
    pub fn all_with(client: Client, dyntype: &K::DynamicType) -> Self {
        Self::new_with(client, None, dyntype)
    }

    /// Objects of the kind `dyntype` names in `namespace`.
    pub fn namespaced_with(client: Client, namespace: &str, dyntype: &K::DynamicType) -> Self {
        Self::new_with(client, Some(namespace), dyntype)
    }

    /// Objects of the kind `dyntype` names in `namespace`, or in all
    /// namespaces for `None`.
    pub fn new_with(client: Client, namespace: Option<&str>, dyntype: &K::DynamicType) -> Self {
        Self {
            client,
            url_path: K::url_path(dyntype, namespace),
            plural: K::plural(dyntype).into_owned(),
            group: K::group(dyntype).into_owned(),
            version: K::version(dyntype).into_owned(),
            namespace: namespace.map(str::to_owned),
            label_selector: None,
            field_selector: None,
            drop_managed_fields: true,
            protobuf_kind: kinformer_protobuf::kind_of::<K>(dyntype),
            wire_format: WireFormat::default(),
            shard: None,
            received: Arc::default(),
            _kind: PhantomData,
        }
    }

    /// Only the objects of one shard (see [`ShardSelector`]): lists, watches
    /// and the streaming list send it as `shardSelector`, and objects
    /// outside it are dropped here too, for a server that ignores it
    /// ([`shard_stats`](Self::shard_stats) says which).
    #[must_use]
    pub fn shard(self, selector: ShardSelector) -> Self {
        self.shard_scope(ShardScope::new(selector))
    }

    /// Only the objects of `scope`'s shard, as it is when each list
    /// starts: as [`shard`](Self::shard), and when the scope changes the
    /// watch ends with [`ListWatchError::Rescoped`] so that the Reflector
    /// lists the new shard at once.
    #[must_use]
    pub fn shard_scope(mut self, scope: ShardScope) -> Self {
        self.shard = Some(Sharding::new(scope, Arc::default()));
        self
    }

    /// Bytes of list and watch response bodies this lister-watcher and its
    /// clones have received (as the client hands them over: after any
    /// decompression): what a shard saves in traffic, measured.
    pub fn bytes_received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// The shard asked for now, if any.
    pub fn shard_selector(&self) -> Option<ShardSelector> {
        self.shard.as_ref().map(|s| s.scope.selector())
    }

    /// How sharding goes: whether the server applies the selector and how
    /// many objects the client dropped; `None` when not sharded. Clones of
    /// this lister-watcher share them.
    pub fn shard_stats(&self) -> Option<Arc<ShardStats>> {
        self.shard.as_ref().map(|s| Arc::clone(&s.stats))
    }

    /// How objects travel from the server ([`WireFormat::Auto`] by default).
    #[must_use]
    pub fn wire_format(mut self, format: WireFormat) -> Self {
        self.wire_format = format;
        self
    }

    /// Whether lists and watches ask for protobuf: `K` is a built-in kind
    /// or metadata only (`PartialObjectMeta<K>`, as
    /// `PartialObjectMetadata`), not `DynamicObject`, and the format is `Auto`.
    pub fn uses_protobuf(&self) -> bool {
        self.protobuf().is_some()
    }

    fn protobuf(&self) -> Option<&'static ProtoKind> {
        self.protobuf_kind
            .filter(|_| self.wire_format == WireFormat::Auto)
    }

    /// Sends `request` accepting protobuf, JSON as the fallback: the
    /// response and whether it is protobuf.
    async fn send_protobuf(
        &self,
        call: Call,
        request: http::Request<Vec<u8>>,
    ) -> Result<(http::Response<kube_client::client::Body>, bool), ListWatchError> {
        let accept = kinformer_protobuf::accept::<K>(call, true);
        let response = kinformer_protobuf::send(&self.client, request, &accept)
            .await
            .map_err(|e| self.explain(e.into()))?;
        let protobuf = kinformer_protobuf::is_protobuf(&response);
        Ok((response, protobuf))
    }

    async fn list_protobuf(
        &self,
        kind: &'static ProtoKind,
        request: http::Request<Vec<u8>>,
    ) -> Result<ListPage<K>, ListWatchError> {
        let (response, protobuf) = self.send_protobuf(Call::List, request).await?;
        let body = kinformer_protobuf::body_bytes(response).await?;
        self.received
            .fetch_add(body.len() as u64, Ordering::Relaxed);
        let drop_managed_fields = self.drop_managed_fields;
        if !protobuf {
            return off_runtime(move || decode_json_list(&body, drop_managed_fields)).await?;
        }
        let list = off_runtime(move || {
            kinformer_protobuf::decode_list_of::<K>(&body, kind, drop_managed_fields)
        })
        .await?
        .map_err(|e| ListWatchError::Decode(Detail::caused("the list", e)))?;
        let mut page = ListPage {
            items: Vec::with_capacity(list.items.len()),
            resource_version: list.resource_version.unwrap_or_default(),
            continue_token: list.continue_token,
            skipped: Vec::new(),
            shard_selector: list.shard_selector,
        };
        for item in list.items {
            match item {
                Ok(obj) => page.items.push(obj),
                Err(why) => page.skipped.push(why),
            }
        }
        Ok(page)
    }

    async fn watch_protobuf(
        &self,
        kind: &'static ProtoKind,
        request: http::Request<Vec<u8>>,
    ) -> Result<WatchStream<K>, ListWatchError> {
        let (response, protobuf) = self.send_protobuf(Call::Watch, request).await?;
        let body = kinformer_protobuf::body_reader(response);
        let received = Arc::clone(&self.received);
        if !protobuf {
            return Ok(json::events::<K>(body, self.drop_managed_fields, received));
        }
        let events =
            kinformer_protobuf::events::<K>(body, kind, self.drop_managed_fields, Some(received));
        Ok(events
            .map(|event| event.map_err(ListWatchError::from))
            .boxed())
    }

    /// Only objects whose labels match `selector` (`app=web,tier!=db`).
    #[must_use]
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_owned()).filter(|s| !s.is_empty());
        self
    }

    /// Only objects whose fields match `selector` (`status.phase=Running`).
    #[must_use]
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_owned()).filter(|s| !s.is_empty());
        self
    }

    /// Keeps `metadata.managedFields`. By default they are dropped before
    /// decoding (skipped in protobuf, cut from JSON by
    /// [`strip_managed_fields_json`](crate::strip_managed_fields_json)):
    /// the same result as the [`strip_managed_fields`](crate::strip_managed_fields)
    /// transform, without paying to decode what is thrown away. Few
    /// controllers read them (field ownership is server-side apply's
    /// business); they are often half of an object's size. client-go keeps
    /// them unless a transform drops them.
    #[must_use]
    pub fn keep_managed_fields(mut self) -> Self {
        self.drop_managed_fields = false;
        self
    }

    /// Whether `metadata.managedFields` are kept (see
    /// [`keep_managed_fields`](Self::keep_managed_fields)).
    pub fn keeps_managed_fields(&self) -> bool {
        !self.drop_managed_fields
    }

    /// The label selector, if any.
    pub fn label_selector(&self) -> Option<&str> {
        self.label_selector.as_deref()
    }

    /// The field selector, if any.
    pub fn field_selector(&self) -> Option<&str> {
        self.field_selector.as_deref()
    }

    /// A 404 names what is not served: typically a custom resource whose
    /// CustomResourceDefinition is not (or no longer) installed.
    fn explain(&self, e: ListWatchError) -> ListWatchError {
        match e {
            ListWatchError::Api {
                code: 404,
                reason,
                message,
                causes,
            } => ListWatchError::Api {
                code: 404,
                reason,
                causes,
                message: format!(
                    "{message}: the server does not serve {} (for a custom resource: is its CustomResourceDefinition installed and Established, and are the group, version and plural right? For a cluster-scoped kind, list it without a namespace)",
                    self.url_path
                ),
            },
            e => e,
        }
    }

    fn watch_request(
        &self,
        req: &WatchRequest,
        shard: Option<&Shard>,
    ) -> Result<http::Request<Vec<u8>>, ListWatchError> {
        // Built by hand rather than with kube's WatchParams, which caps the
        // server-side timeout below 295 s; client-go uses 5-10 minutes.
        let mut qp = form_urlencoded::Serializer::new(format!("{}?", self.url_path));
        qp.append_pair("watch", "true");
        qp.append_pair("timeoutSeconds", &req.timeout.as_secs().max(1).to_string());
        if req.allow_bookmarks {
            qp.append_pair("allowWatchBookmarks", "true");
        }
        if let Some(l) = &self.label_selector {
            qp.append_pair("labelSelector", l);
        }
        if let Some(f) = &self.field_selector {
            qp.append_pair("fieldSelector", f);
        }
        if let Some(shard) = shard {
            qp.append_pair("shardSelector", &shard.printed);
        }
        if req.send_initial_events {
            qp.append_pair("sendInitialEvents", "true");
            qp.append_pair("resourceVersionMatch", "NotOlderThan");
        }
        qp.append_pair("resourceVersion", &req.resource_version);
        // Servers since 1.37 gzip a watch one member per event, which the
        // client's decompression layer cannot follow past the first: ask for
        // no compression, as kube-client's own watch does.
        let mut request =
            http::Request::get(qp.finish()).header(http::header::ACCEPT_ENCODING, "identity");
        if K::metadata_api() {
            request = request.header(http::header::ACCEPT, json::METADATA_MIME);
        }
        request
            .body(Vec::new())
            .map_err(|e| ListWatchError::Connect(Detail::caused("building the watch request", e)))
    }
}

impl<K> ListerWatcher<K> for ApiListerWatcher<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>> {
        Box::pin(async move {
            let continuing = request.continue_token.is_some();
            let mut lp = ListParams::default();
            if let Some(l) = &self.label_selector {
                lp = lp.labels(l);
            }
            if let Some(f) = &self.field_selector {
                lp = lp.fields(f);
            }
            if let Some(limit) = request.limit {
                lp = lp.limit(limit);
            }
            if let Some(token) = &request.continue_token {
                lp = lp.continue_token(token);
            } else if let Some(rv) = &request.resource_version {
                lp = match rv.as_str() {
                    "0" => lp.match_any(),
                    rv => lp.at(rv).matching(VersionMatch::NotOlderThan),
                };
            }
            let request = Request::new(&self.url_path);
            let req = if K::metadata_api() {
                request.list_metadata(&lp)
            } else {
                request.list(&lp)
            };
            let mut req = req.map_err(|e| {
                ListWatchError::Connect(Detail::caused("building the list request", e))
            })?;
            let shard = self.shard.as_ref().map(|s| s.for_list(continuing));
            if let Some(shard) = &shard {
                // kube's ListParams has no shardSelector: appended to its query.
                let sep = if req.uri().query().is_some() {
                    '&'
                } else {
                    '?'
                };
                let param = form_urlencoded::Serializer::new(String::new())
                    .append_pair("shardSelector", &shard.printed)
                    .finish();
                let uri = format!("{}{sep}{param}", req.uri());
                *req.uri_mut() = uri.parse().map_err(|e| {
                    ListWatchError::Connect(Detail::caused("building the list request", e))
                })?;
            }
            let page = if let Some(kind) = self.protobuf() {
                self.list_protobuf(kind, req).await?
            } else {
                let text = self
                    .client
                    .request_text(req)
                    .await
                    .map_err(|e| self.explain(e.into()))?;
                self.received
                    .fetch_add(text.len() as u64, Ordering::Relaxed);
                let drop_managed_fields = self.drop_managed_fields;
                off_runtime(move || decode_json_list(text.as_bytes(), drop_managed_fields))
                    .await??
            };
            Ok(self.shard_page(page, shard.as_deref()))
        })
    }

    fn watch(
        &self,
        request: WatchRequest,
    ) -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>> {
        Box::pin(async move {
            let shard = match &self.shard {
                // The streaming list is a list.
                Some(s) if request.send_initial_events => Some(s.for_list(false)),
                Some(s) => Some(s.for_watch()?),
                None => None,
            };
            let req = self.watch_request(&request, shard.as_deref())?;
            if let Some(kind) = self.protobuf() {
                let events = self.watch_protobuf(kind, req).await?;
                return Ok(self.shard_events(events, shard));
            }
            // One JSON event a line, decoded here rather than by kube-client,
            // so that an event that does not decode is named, and so that
            // managedFields can be dropped before decoding.
            let body = self
                .client
                .request_stream(req)
                .await
                .map_err(|e| self.explain(e.into()))?;
            let received = Arc::clone(&self.received);
            let events = json::events::<K>(body, self.drop_managed_fields, received);
            Ok(self.shard_events(events, shard))
        })
    }

    fn resource(&self) -> Option<GroupResource> {
        Some(GroupResource::new(&self.group, &self.plural))
    }

    fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// For a custom resource, until its CRD is established and serves
    /// the version listed (by listing and watching that one CRD); `None`
    /// for a built-in one.
    fn until_served(&self) -> Option<BoxFuture<'static, ()>> {
        let crd = super::served::crd_name(&self.group, &self.plural)?;
        Some(Box::pin(super::served::crd_serves(
            self.client.clone(),
            crd,
            self.version.clone(),
        )))
    }

    fn describe(&self) -> String {
        let mut s = self.plural.clone();
        if K::metadata_api() {
            s.push_str(" (metadata only)");
        }
        match &self.namespace {
            Some(ns) => s.push_str(&format!(" in namespace {ns:?}")),
            None => s.push_str(" in all namespaces"),
        }
        if let Some(l) = &self.label_selector {
            s.push_str(&format!(" with labels {l:?}"));
        }
        if let Some(f) = &self.field_selector {
            s.push_str(&format!(" with fields {f:?}"));
        }
        if let Some(shard) = &self.shard {
            s.push_str(&format!(" in shard {}", shard.scope.current().printed));
        }
        s
    }
}

/// A JSON list, its managedFields dropped before decoding unless kept.
fn decode_json_list<K: DeserializeOwned>(
    json: &[u8],
    drop_managed_fields: bool,
) -> Result<ListPage<K>, ListWatchError> {
    if drop_managed_fields {
        let stripped = strip_managed_fields_json(json, JsonShape::List);
        json::decode_stripped(json, stripped, json::decode_list::<K>)
    } else {
        json::decode_list::<K>(json)
    }
}

/// Decodes a list on the blocking pool rather than on a runtime worker: a
/// relist at a version comes as one page, and decoding tens of thousands
/// of objects would hold the worker for hundreds of milliseconds (a lease
/// renewal or a webhook answer waiting behind it). A panic of the decode
/// unwinds here, as it did inline.
async fn off_runtime<T: Send + 'static>(
    decode: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ListWatchError> {
    match tokio::task::spawn_blocking(decode).await {
        Ok(decoded) => Ok(decoded),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Err(ListWatchError::Connect(
                "the runtime shut down while a list was decoded".into(),
            )),
        },
    }
}
