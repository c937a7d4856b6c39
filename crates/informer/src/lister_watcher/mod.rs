//! The seam between the Reflector and the API server.
//!
//! [`ListerWatcher`] lists one page or opens one watch; [`ApiListerWatcher`]
//! implements it on kube-client for any [`Resource`](kube_client::Resource):
//! k8s-openapi types, `#[derive(CustomResource)]` types, `DynamicObject`
//! (with its `ApiResource`) and `PartialObjectMeta<K>` (metadata only: the
//! server is asked for `PartialObjectMetadataList` and
//! `PartialObjectMetadata`, as kube-client does), namespaced or
//! cluster-scoped, with label and field selectors. Tests drive the
//! Reflector with an in-memory implementation instead (with the `testing`
//! feature, `testing::ScriptedListerWatcher`).
//!
//! One idea a file:
//! - this file: the trait and what crosses it (requests, pages, events);
//! - `api.rs`: [`ApiListerWatcher`]: the requests it sends, and which wire
//!   format it asks for (protobuf through the `kinformer-protobuf` crate,
//!   JSON otherwise);
//! - `json.rs`: JSON lists and watch events, decoded object by object so
//!   that one bad object is named and skipped, and managedFields dropped
//!   before decoding;
//! - `sharding.rs`: [`ShardScope`], the shard a lister-watcher asks for and
//!   how a change of it ends the watch;
//! - `served.rs`: waiting for a custom resource that is not served, by
//!   watching its CustomResourceDefinition.

mod api;
mod json;
pub(crate) mod served;
mod sharding;

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use kube_client::core::WatchEvent;

use crate::ListWatchError;

pub use api::ApiListerWatcher;
pub use kinformer_protobuf::Undecodable;
pub use sharding::ShardScope;

/// One list call: a page of at most `limit` items (no limit when `None`),
/// continuing from `continue_token`, as of `resource_version`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListRequest {
    /// Page size; `None` lists everything at once.
    pub limit: Option<u32>,
    /// The token of the previous page.
    pub continue_token: Option<String>,
    /// `"0"`: any version (the watch cache); a version: not older than it
    /// (with `NotOlderThan`); `None`: the latest (a quorum read).
    pub resource_version: Option<String>,
}

/// One page of a list.
#[derive(Debug, Clone)]
pub struct ListPage<K> {
    /// The objects.
    pub items: Vec<K>,
    /// The list's resource version.
    pub resource_version: String,
    /// The token for the next page, if there is one.
    pub continue_token: Option<String>,
    /// Objects of the page that could not be decoded: left out and
    /// reported, the rest kept; the Reflector keeps the version cached
    /// under each one's key (it is not taken for deleted).
    pub skipped: Vec<Undecodable>,
    /// The shard selector the server says it applied
    /// (`ListMeta.shardInfo.selector`), if any.
    pub shard_selector: Option<String>,
}

/// One watch call, from `resource_version`, ended by the server after
/// `timeout` (client-go randomises 5-10 minutes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRequest {
    /// Where to start.
    pub resource_version: String,
    /// Server-side timeout.
    pub timeout: Duration,
    /// Ask for BOOKMARK events.
    pub allow_bookmarks: bool,
    /// Streaming initial list: the server first sends the current state as
    /// ADDED events, then a bookmark annotated `k8s.io/initial-events-end`.
    pub send_initial_events: bool,
}

/// The events of one watch.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ListWatchError>>;

/// How objects travel from the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WireFormat {
    /// Kubernetes protobuf for the built-in kinds and for metadata-only
    /// informers of any kind (lists, watches and the streaming list; what
    /// client-go's typed and metadata clients ask for), JSON for custom
    /// resources and `DynamicObject`, and whenever the server answers in
    /// JSON instead. The default.
    #[default]
    Auto,
    /// JSON always.
    Json,
}

/// Lists and watches one kind of object: client-go's `ListerWatcher`.
pub trait ListerWatcher<K>: Send + Sync + 'static {
    /// Lists one page.
    fn list(&self, request: ListRequest) -> BoxFuture<'_, Result<ListPage<K>, ListWatchError>>;
    /// Opens a watch.
    fn watch(&self, request: WatchRequest)
    -> BoxFuture<'_, Result<WatchStream<K>, ListWatchError>>;
    /// What is listed, for logs: for example `pods in namespace "web"`.
    fn describe(&self) -> String;
    /// The API resource listed, when there is one: what relates the
    /// informer to writes answered by the API server (`None` by default,
    /// for a lister-watcher of one's own).
    fn resource(&self) -> Option<GroupResource> {
        None
    }
    /// The one namespace listed, if it lists only one (`None`: every
    /// namespace, or a cluster-scoped kind, or it does not say).
    fn namespace(&self) -> Option<&str> {
        None
    }
    /// For a resource that may come and go (a custom resource, whose CRD
    /// may be installed or deleted at any time): a future that resolves
    /// once the resource, found not served (a list or watch answered 404),
    /// may be served again. The Reflector then waits for it instead of
    /// failing (see its module docs), and lists at once when the future
    /// resolves rather than at the end of its backoff. `None`, the
    /// default: a 404 is a failure like any other. [`ApiListerWatcher`]
    /// gives one for custom resources, which lists and watches their
    /// CustomResourceDefinition.
    fn until_served(&self) -> Option<BoxFuture<'static, ()>> {
        None
    }
}

/// An API group and resource (apimachinery's `schema.GroupResource`):
/// resourceVersions are ordered within one, whatever the version served.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupResource {
    /// The API group, "" for the core group.
    pub group: String,
    /// The resource (plural), for example `configmaps`.
    pub resource: String,
}

impl GroupResource {
    /// `resource` of `group` ("" for the core group).
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            resource: resource.into(),
        }
    }
}

impl std::fmt::Display for GroupResource {
    /// As apimachinery writes it: `deployments.apps`, `configmaps`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}
