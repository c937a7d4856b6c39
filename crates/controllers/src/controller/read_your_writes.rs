//! Read your own writes: a controller of a [`Manager`](crate::Manager)
//! never reconciles from a cache that is behind the Manager's own writes to
//! what it reads.
//!
//! - **Writes are remembered** by the Manager's client
//!   ([`Manager::client`](crate::Manager::client)): a Kubernetes client on
//!   a tower service that passes every request through and, for a write
//!   (POST, PUT, PATCH, DELETE without `dryRun`) the server accepted, reads
//!   `kind` and `metadata` from the answer before handing it back
//!   unchanged: the object's key, uid, resourceVersion and controller
//!   ownerReference, or for a delete answered by a `Status` (ConfigMaps,
//!   Secrets, custom resources) its uid. Only resources some controller's
//!   informer lists are remembered; POSTs to a subresource (eviction,
//!   binding, token) and deletes of a collection are not. A write made
//!   while a reconcile runs is also credited to that reconcile (a Tokio
//!   task-local the worker sets; the client's response future runs in the
//!   caller's task).
//! - **Before a reconcile** of key X, each informer the controller reads
//!   must have seen: the Manager's last write to X itself (any
//!   controller's); writes to objects whose controller ownerReference is X
//!   (for kinds it `owns`); writes made while reconciling X; and, for kinds
//!   it `watches` through a mapper the tracker cannot run, the highest
//!   version the Manager wrote to that resource (or, for an informer that
//!   cannot say its version, a DeltaFifo's or a plain RealFifo's, each
//!   write to an object in its namespace: one outside its label or field
//!   selector is never seen and holds the key to the bound). "Seen" is:
//!   the cache's
//!   resourceVersion ([`SharedIndexInformer::has_caught_up_to`]) at or
//!   past the write's, or the cached object itself at or past it, or for a
//!   delete, the object (that uid) no longer cached.
//! - **Not seen yet**: the key is parked, the worker goes on with other
//!   keys, and the key is queued again as soon as the informers have seen
//!   the writes. Past the bound ([`DEFAULT_READ_YOUR_WRITES_BOUND`]) the
//!   writes are given up as lost (their events may never come: an object
//!   deleted by someone else, outside a selector), counted
//!   (`kinformer_controller_stale_sync_skips_total`) and logged, and the
//!   key is queued again to reconcile from the cache as it is.
//! - **How versions are ordered**: since Kubernetes 1.35 (KEP-5504) the
//!   API server guarantees that resourceVersions are decimal integers that
//!   grow with every write, comparable within one resource; they are
//!   compared as such ([`kinformer_store::compare_resource_version`]).
//!   Where a version is not one (an aggregated API server may answer
//!   anything), only the cached object at exactly the written version, or
//!   a delete seen, counts: the cost is that a later write by someone else
//!   before the informer saw ours holds the key until the bound.
//!
//! Written by hand: controller-runtime's `EnableReadYourWritesConsistency`
//! and kube-controller-manager's stale-controller checks are Go, and no
//! Rust crate relates a client's writes to an informer's cache.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Method, Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use kinformer_informer::{GroupResource, SharedIndexInformer};
use kinformer_store::{Object, ObjectKey, compare_resource_version, split_meta_namespace_key};
use kinformer_workqueue::{Priority, RateLimitingQueue};
use kube_client::Client;
use kube_client::client::Body;
use parking_lot::Mutex;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use serde::Deserialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, warn};

use crate::Metrics;
use crate::gate::{Admission, Gate, Reconciled};
use crate::reason::{Reason, Reasons};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How long a reconcile waits for its informers to see the Manager's own
/// writes before giving them up as lost and reconciling from the cache as
/// it is: kube-controller-manager's stale-controller checks retry with
/// backoff for about as long.
pub const DEFAULT_READ_YOUR_WRITES_BOUND: Duration = Duration::from_secs(5);

/// Writes not seen for this long are forgotten by the tracker's sweep
/// (counted in `kinformer_read_your_writes_expired_total`): what no
/// reconcile asked about (a write to an object no key maps to, an informer
/// that never sees it) does not pile up.
const MAX_AGE: Duration = Duration::from_secs(120);

/// How often recording a write also sweeps the writes every informer has seen.
const SWEEP_EVERY: Duration = Duration::from_secs(1);

tokio::task_local! {
    static RECONCILING: Reconciling;
    static UNTRACKED: ();
}

/// Runs `future` with the writes it makes through a Manager's client left
/// unremembered: no reconcile waits for the cache to see them (a write
/// whose outcome the controller never reads, a bulk job).
///
/// ```no_run
/// # async fn demo(client: kube_client::Client) -> Result<(), kube_client::Error> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use kinformer_controllers::kube::api::{Api, DeleteParams};
/// let configmaps: Api<ConfigMap> = Api::namespaced(client, "web");
/// kinformer_controllers::untracked(configmaps.delete("scratch", &DeleteParams::default())).await?;
/// # Ok(()) }
/// ```
pub async fn untracked<F: Future>(future: F) -> F::Output {
    UNTRACKED.scope((), future).await
}

/// The reconcile a write is made in: its controller and key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Reconciling {
    controller: Arc<str>,
    key: Arc<str>,
}

impl Reconciling {
    /// Runs `future` as this reconcile: writes it makes are credited to it.
    pub(crate) async fn scope<F: Future>(self, future: F) -> F::Output {
        RECONCILING.scope(self, future).await
    }
}

/// One write the server accepted, the last to its object.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// The resourceVersion answered; `None` for a delete answered by a `Status`.
    version: Option<String>,
    uid: Option<String>,
    /// A DELETE: seen once the object (this uid) is no longer cached.
    delete: bool,
    /// The controller ownerReference: (group, kind, name).
    owner: Option<(String, String, String)>,
    /// The reconciles it was made in.
    by: Vec<Reconciling>,
    at: Instant,
    /// Which write this is, unique in its tracker: two writes can share an
    /// `at` (a coarse clock, paused time), and a newer one must not be
    /// forgotten for an older one that was seen or given up.
    seq: u64,
}

/// What an informer must have seen.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One write to the object `key`.
    Object { key: String, written: Written },
    /// Every write up to this version of the resource.
    Version(String),
}

/// An informer, as the tracker asks it whether it has seen a write.
pub(crate) trait Follows: Send + Sync {
    /// The resource it lists, if it knows.
    fn resource(&self) -> Option<GroupResource>;
    /// Whether it lists the namespace of `key` (every one, or that one).
    fn covers(&self, key: &str) -> bool;
    /// Whether it lists every namespace.
    fn lists_every_namespace(&self) -> bool;
    /// Whether it can say which version of the resource its cache holds
    /// (its queue applies changes in watch order): only then is a
    /// [`Target::Version`] ever seen.
    fn knows_its_version(&self) -> bool;
    /// Whether its cache holds `target` or something newer.
    fn seen(&self, target: &Target) -> bool;
    /// Resolves once [`seen`](Self::seen) holds (`true`) or the informer
    /// stopped (`false`).
    fn wait_seen<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, bool>;
}

impl<C: Object + Clone> Follows for SharedIndexInformer<C> {
    fn resource(&self) -> Option<GroupResource> {
        SharedIndexInformer::resource(self)
    }

    fn covers(&self, key: &str) -> bool {
        self.namespace()
            .is_none_or(|ns| namespace_of(key) == Some(ns))
    }

    fn lists_every_namespace(&self) -> bool {
        self.namespace().is_none()
    }

    fn knows_its_version(&self) -> bool {
        self.applies_in_order()
    }

    fn seen(&self, target: &Target) -> bool {
        let caught_up = |version: &str| matches!(self.has_caught_up_to(version), Ok(true));
        let (key, written) = match target {
            Target::Version(version) => return caught_up(version),
            Target::Object { key, written } => (key, written),
        };
        // The version first, then whether a relist left this key older
        // (it could not decode the object: its copy is older than that).
        if written.version.as_deref().is_some_and(caught_up) && !self.is_stale(key) {
            return true;
        }
        let cached = self.indexer().get_by_key(key);
        let same = cached
            .as_deref()
            .filter(|o| written.uid.is_none() || o.uid() == written.uid.as_deref());
        match (same, &written.version) {
            // Deleted, or not cached at all (created and deleted since).
            (None, _) => written.delete,
            // Deleted, still cached.
            (Some(_), None) => false,
            (Some(cached), Some(version)) => cached.resource_version().is_some_and(|have| {
                match compare_resource_version(have, version) {
                    Ok(order) => order.is_ge(),
                    Err(_) => have == version,
                }
            }),
        }
    }

    fn wait_seen<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, bool> {
        Box::pin(self.wait_until(move |informer| Follows::seen(informer, target)))
    }
}

/// The writes to one resource not yet known to be seen.
#[derive(Default)]
struct Writes {
    objects: HashMap<String, Written>,
    /// Keys of the objects written, by their controller owner (group, kind, name).
    owned_by: HashMap<(String, String, String), HashSet<String>>,
    /// Keys of the objects written, by the reconcile that wrote them.
    by_reconcile: HashMap<Reconciling, HashSet<String>>,
    /// The highest integer version written.
    highest: Option<String>,
}

impl Writes {
    fn insert(&mut self, key: String, mut written: Written) {
        if let Some(old) = self.remove(&key) {
            // A write answered out of order does not move the object back.
            if let (Some(old_version), Some(new_version)) = (&old.version, &written.version)
                && written.uid == old.uid
                && compare_resource_version(old_version, new_version).is_ok_and(|o| o.is_gt())
            {
                written.version = Some(old_version.clone());
            }
            // A delete answered by a Status, a scale: no ownerReference
            // said, the object's owner still waits for it.
            if written.owner.is_none() && (written.uid.is_none() || written.uid == old.uid) {
                written.owner = old.owner;
            }
            for by in old.by {
                if !written.by.contains(&by) {
                    written.by.push(by);
                }
            }
        }
        if let Some(version) = &written.version {
            let higher = match &self.highest {
                None => compare_resource_version(version, version).is_ok(),
                Some(highest) => {
                    compare_resource_version(version, highest).is_ok_and(|o| o.is_gt())
                }
            };
            if higher {
                self.highest = Some(version.clone());
            }
        }
        if let Some(owner) = &written.owner {
            self.owned_by
                .entry(owner.clone())
                .or_default()
                .insert(key.clone());
        }
        for by in &written.by {
            self.by_reconcile
                .entry(by.clone())
                .or_default()
                .insert(key.clone());
        }
        self.objects.insert(key, written);
    }

    fn remove(&mut self, key: &str) -> Option<Written> {
        let written = self.objects.remove(key)?;
        if let Some(owner) = &written.owner
            && let Some(keys) = self.owned_by.get_mut(owner)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.owned_by.remove(owner);
            }
        }
        for by in &written.by {
            if let Some(keys) = self.by_reconcile.get_mut(by) {
                keys.remove(key);
                if keys.is_empty() {
                    self.by_reconcile.remove(by);
                }
            }
        }
        Some(written)
    }
}

/// The Manager's writes, shared by its controllers. See the module docs.
#[derive(Default)]
pub(crate) struct WriteTracker {
    writes: Mutex<HashMap<GroupResource, Writes>>,
    /// Every informer a controller reads, by resource.
    followed: Mutex<HashMap<GroupResource, Vec<Arc<dyn Follows>>>>,
    last_sweep: Mutex<Option<Instant>>,
    next_seq: AtomicU64,
    stats: TrackerStats,
}

/// What the tracker counted.
#[derive(Debug, Default)]
pub(crate) struct TrackerStats {
    /// Writes remembered.
    pub(crate) recorded: AtomicU64,
    /// Accepted writes whose answer could not be read (not JSON, no
    /// metadata): no reconcile waits for them.
    pub(crate) unreadable: AtomicU64,
    /// Writes forgotten after [`MAX_AGE`] without being seen.
    pub(crate) expired: AtomicU64,
    /// Writes given up when a reconcile waited past its bound.
    pub(crate) given_up: AtomicU64,
}

/// The tracker's counts on `/metrics`.
#[derive(Debug)]
pub(crate) struct TrackerCollector(pub(crate) Arc<WriteTracker>);

impl std::fmt::Debug for WriteTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteTracker")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Collector for TrackerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = &self.0.stats;
        let mut family = encoder.encode_descriptor(
            "kinformer_read_your_writes_writes",
            "Writes through the Manager's client to a resource its controllers read, by outcome: remembered; unreadable (an answer without JSON metadata: no reconcile waits for it); expired (never seen by every informer, forgotten after two minutes); given_up (a reconcile waited for it past its bound)",
            None,
            MetricType::Counter,
        )?;
        for (outcome, count) in [
            ("remembered", &stats.recorded),
            ("unreadable", &stats.unreadable),
            ("expired", &stats.expired),
            ("given_up", &stats.given_up),
        ] {
            let labels = [("outcome", outcome)];
            ConstCounter::new(count.load(Ordering::Relaxed))
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl WriteTracker {
    /// `informer` is read by a controller: writes to its resource are remembered.
    pub(crate) fn follow(&self, informer: Arc<dyn Follows>) {
        if let Some(resource) = informer.resource() {
            self.followed
                .lock()
                .entry(resource)
                .or_default()
                .push(informer);
        }
    }

    fn follows(&self, resource: &GroupResource) -> bool {
        self.followed.lock().contains_key(resource)
    }

    /// A client whose writes are remembered, on top of `client`.
    pub(crate) fn client(self: &Arc<Self>, client: Client) -> Client {
        let namespace = client.default_namespace().to_owned();
        let valid_until = *client.valid_until();
        Client::new(
            TrackingService {
                inner: client,
                tracker: Arc::clone(self),
            },
            namespace,
        )
        .with_valid_until(valid_until)
    }

    fn record(&self, write: &WriteRequest, answer: &[u8], by: Option<Reconciling>) {
        let Ok(answer) = serde_json::from_slice::<Answer>(answer) else {
            self.unreadable(write);
            return;
        };
        let (key, written) = if answer.kind.as_deref() == Some("Status") {
            // A delete answered without the object: it is gone.
            let (Some(name), Some(details)) = (&write.name, answer.details) else {
                self.unreadable(write);
                return;
            };
            let written = Written {
                version: None,
                uid: details.uid,
                delete: true,
                owner: None,
                by: by.into_iter().collect(),
                at: Instant::now(),
                seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            };
            (key_of(write.namespace.as_deref(), name), written)
        } else {
            let Some(meta) = answer.metadata else {
                self.unreadable(write);
                return;
            };
            let Some(name) = meta.name.or_else(|| write.name.clone()) else {
                self.unreadable(write);
                return;
            };
            let namespace = meta.namespace.or_else(|| write.namespace.clone());
            let owner = meta
                .owner_references
                .into_iter()
                .find(|r| r.controller == Some(true))
                .map(|r| (api_group(&r.api_version).to_owned(), r.kind, r.name));
            let written = Written {
                version: meta.resource_version.filter(|v| !v.is_empty()),
                uid: meta.uid,
                // A delete answered with the object marked for deletion
                // (finalizers, a grace period): it is still there, at a
                // new version.
                delete: write.method == Method::DELETE && meta.deletion_timestamp.is_none(),
                owner,
                by: by.into_iter().collect(),
                at: Instant::now(),
                seq: self.next_seq.fetch_add(1, Ordering::Relaxed),
            };
            (key_of(namespace.as_deref(), &name), written)
        };
        debug!(resource = %write.resource, key, version = ?written.version, delete = written.delete, "remembered a write");
        self.stats.recorded.fetch_add(1, Ordering::Relaxed);
        self.writes
            .lock()
            .entry(write.resource.clone())
            .or_default()
            .insert(key, written);
        self.sweep_now_and_then();
    }

    fn unreadable(&self, write: &WriteRequest) {
        self.stats.unreadable.fetch_add(1, Ordering::Relaxed);
        debug!(resource = %write.resource, name = ?write.name, "could not read the answer to a write; no reconcile waits for it");
    }

    /// What `reads` must still see before `reconciling` may run.
    pub(crate) fn pending(&self, reconciling: &Reconciling, reads: &[Read]) -> Vec<Pending> {
        let mut candidates = Vec::new();
        {
            let writes = self.writes.lock();
            for read in reads {
                let Some(resource_writes) = writes.get(&read.resource) else {
                    continue;
                };
                let mut keys: HashSet<&String> = HashSet::new();
                if read.relation == Relation::Primary
                    && let Some((key, _)) = resource_writes.objects.get_key_value(&*reconciling.key)
                {
                    keys.insert(key);
                }
                if let Some(by) = resource_writes.by_reconcile.get(reconciling) {
                    keys.extend(by);
                }
                match &read.relation {
                    Relation::Owned { group, kind } => {
                        // Keys come from the cache's key function: always valid.
                        if let Ok((namespace, name)) = split_meta_namespace_key(&reconciling.key) {
                            let owner = (group.clone(), kind.clone(), name.to_owned());
                            if let Some(children) = resource_writes.owned_by.get(&owner) {
                                keys.extend(children.iter().filter(|child| {
                                    namespace.is_none_or(|ns| namespace_of(child) == Some(ns))
                                }));
                            }
                        }
                    }
                    // The highest version is of every namespace's writes.
                    Relation::Watched
                        if read.informer.lists_every_namespace()
                            && read.informer.knows_its_version() =>
                    {
                        if let Some(highest) = &resource_writes.highest {
                            candidates.push((read, Target::Version(highest.clone())));
                        }
                    }
                    // An informer that cannot say its version (a DeltaFifo,
                    // a plain RealFifo): each write to an object in its
                    // namespace, seen in the cached object. (One outside
                    // its selectors is never seen: held to the bound.)
                    Relation::Watched if !read.informer.knows_its_version() => {
                        keys.extend(resource_writes.objects.keys());
                    }
                    Relation::Primary | Relation::Watched => {}
                }
                // A write outside the informer's namespace never reaches it.
                for key in keys.into_iter().filter(|k| read.informer.covers(k)) {
                    let written = resource_writes.objects[key].clone();
                    candidates.push((
                        read,
                        Target::Object {
                            key: key.clone(),
                            written,
                        },
                    ));
                }
            }
        }
        candidates
            .into_iter()
            .filter(|(read, target)| !read.informer.seen(target))
            .map(|(read, target)| Pending {
                resource: read.resource.clone(),
                informer: Arc::clone(&read.informer),
                target,
            })
            .collect()
    }

    /// Forgets the writes of `pending`: a reconcile waited for them past its bound.
    pub(crate) fn give_up(&self, pending: &[Pending]) {
        let mut writes = self.writes.lock();
        for p in pending {
            let Some(resource_writes) = writes.get_mut(&p.resource) else {
                continue;
            };
            let given_up = match &p.target {
                Target::Object { key, written } => resource_writes
                    .objects
                    .get(key)
                    .is_some_and(|w| w.seq == written.seq)
                    .then(|| resource_writes.remove(key))
                    .flatten()
                    .is_some(),
                Target::Version(version) => {
                    let same = resource_writes.highest.as_ref() == Some(version);
                    if same {
                        resource_writes.highest = None;
                    }
                    same
                }
            };
            if given_up {
                self.stats.given_up.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every [`SWEEP_EVERY`] at most: forgets the writes every informer of
    /// their resource has seen, and those older than [`MAX_AGE`]. The
    /// informers are asked with the writes unlocked.
    fn sweep_now_and_then(&self) {
        let now = Instant::now();
        {
            let mut last = self.last_sweep.lock();
            if last.is_some_and(|at| now.duration_since(at) < SWEEP_EVERY) {
                return;
            }
            *last = Some(now);
        }
        let followed = self.followed.lock().clone();
        let snapshot: Vec<(GroupResource, Target)> = {
            let writes = self.writes.lock();
            writes
                .iter()
                .flat_map(|(resource, w)| {
                    let objects = w.objects.iter().map(|(key, written)| Target::Object {
                        key: key.clone(),
                        written: written.clone(),
                    });
                    objects
                        .chain(w.highest.clone().map(Target::Version))
                        .map(move |target| (resource.clone(), target))
                })
                .collect()
        };
        let done: Vec<(GroupResource, Target, bool)> = snapshot
            .into_iter()
            .filter_map(|(resource, target)| {
                let expired = matches!(&target, Target::Object { written, .. } if now.duration_since(written.at) > MAX_AGE);
                let informers = followed.get(&resource).map_or(&[][..], Vec::as_slice);
                let seen = || {
                    informers
                        .iter()
                        .filter(|i| match &target {
                            Target::Object { key, .. } => i.covers(key),
                            Target::Version(_) => {
                                i.lists_every_namespace() && i.knows_its_version()
                            }
                        })
                        .all(|i| i.seen(&target))
                };
                (expired || seen()).then_some((resource, target, expired))
            })
            .collect();
        let mut writes = self.writes.lock();
        for (resource, target, expired) in done {
            let Some(w) = writes.get_mut(&resource) else {
                continue;
            };
            match target {
                // Unless written again since.
                Target::Object { key, written } => {
                    if w.objects
                        .get(&key)
                        .is_some_and(|now| now.seq == written.seq)
                    {
                        w.remove(&key);
                        if expired {
                            self.stats.expired.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Target::Version(version) => {
                    if w.highest.as_ref() == Some(&version) {
                        w.highest = None;
                    }
                }
            }
        }
        writes.retain(|_, w| !w.objects.is_empty() || w.highest.is_some());
    }
}

/// `namespace/name`, or `name` for a cluster-scoped object.
fn key_of(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_owned(),
    }
}

/// The namespace of a key (`None` for a cluster-scoped one).
fn namespace_of(key: &str) -> Option<&str> {
    split_meta_namespace_key(key).ok().and_then(|(ns, _)| ns)
}

/// The API group of an `apiVersion` (`apps/v1`: `apps`; `v1`: the core group, "").
pub(crate) fn api_group(api_version: &str) -> &str {
    api_version.rsplit_once('/').map_or("", |(group, _)| group)
}

/// How a controller reads an informer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Relation {
    /// Its own kind: the reconciled key's object.
    Primary,
    /// A kind it owns: objects whose controller ownerReference names
    /// `kind` of `group` and the reconciled key.
    Owned { group: String, kind: String },
    /// A kind it watches through a mapper.
    Watched,
}

/// An informer a controller reads.
#[derive(Clone)]
pub(crate) struct Read {
    resource: GroupResource,
    informer: Arc<dyn Follows>,
    relation: Relation,
}

impl Read {
    /// `None` for an informer that does not say its resource (a
    /// lister-watcher of one's own): writes cannot be related to it.
    pub(crate) fn new(informer: Arc<dyn Follows>, relation: Relation) -> Option<Self> {
        Some(Self {
            resource: informer.resource()?,
            informer,
            relation,
        })
    }

    pub(crate) fn informer(&self) -> &Arc<dyn Follows> {
        &self.informer
    }
}

/// A write an informer has not seen yet.
pub(crate) struct Pending {
    resource: GroupResource,
    informer: Arc<dyn Follows>,
    target: Target,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target {
            Target::Object { key, written } => write!(
                f,
                "{} {key} at {}",
                self.resource,
                written.version.as_deref().unwrap_or("deletion")
            ),
            Target::Version(version) => write!(f, "{} up to {version}", self.resource),
        }
    }
}

/// One controller's side: what it reads, and its parked keys.
pub(crate) struct Consistency {
    pub(crate) tracker: Arc<WriteTracker>,
    controller: Arc<str>,
    reads: Vec<Read>,
    /// On: reconciles wait for the writes; off: only credited with them.
    waits: bool,
    bound: Duration,
    keys: Mutex<Keys>,
    metrics: Option<Arc<Metrics>>,
}

#[derive(Default)]
struct Keys {
    /// Keys waiting for their informers (a waiter task each), at the
    /// highest priority they were taken at meanwhile.
    parked: HashMap<ObjectKey, Priority>,
    /// Keys whose wait ended at the bound: reconciled once without looking,
    /// whatever was written since, so that no key waits bound after bound.
    released: HashSet<ObjectKey>,
}

/// Whether a key may be reconciled now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    Ready,
    /// No: parked until its informers see the Manager's writes.
    Parked,
}

/// How a parked key's wait ended.
enum WaitEnd {
    Seen,
    Bound,
    /// An informer stopped: its writes will never be seen.
    Stopped,
}

impl Consistency {
    pub(crate) fn new(
        tracker: Arc<WriteTracker>,
        controller: &str,
        reads: Vec<Read>,
        waits: bool,
        bound: Duration,
        metrics: Option<Arc<Metrics>>,
    ) -> Self {
        for read in &reads {
            tracker.follow(Arc::clone(read.informer()));
        }
        Self {
            tracker,
            controller: controller.into(),
            reads,
            waits,
            bound,
            keys: Mutex::default(),
            metrics,
        }
    }

    /// The reconcile of `key` as writes are credited to it.
    pub(crate) fn reconciling(&self, key: &ObjectKey) -> Reconciling {
        Reconciling {
            controller: Arc::clone(&self.controller),
            key: key.as_str().into(),
        }
    }

    /// Whether `key` may be reconciled now; if not, it is parked and
    /// queued again (at `priority`, or a higher one it is taken at
    /// meanwhile) once its informers have seen the Manager's writes, or at
    /// the bound.
    pub(crate) fn before_reconcile(
        self: &Arc<Self>,
        key: &ObjectKey,
        priority: Priority,
        queue: &RateLimitingQueue<ObjectKey>,
        reasons: &Arc<Reasons>,
        halt: &CancellationToken,
    ) -> Readiness {
        if !self.waits {
            return Readiness::Ready;
        }
        {
            let mut keys = self.keys.lock();
            if let Some(parked) = keys.parked.get_mut(key) {
                // Taken again by an event while parked: its waiter queues it.
                *parked = (*parked).max(priority);
                return Readiness::Parked;
            }
            if keys.released.remove(key) {
                return Readiness::Ready;
            }
        }
        let pending = self.tracker.pending(&self.reconciling(key), &self.reads);
        if pending.is_empty() {
            return Readiness::Ready;
        }
        self.keys.lock().parked.insert(key.clone(), priority);
        debug!(behind = ?pending, bound = ?self.bound, "the cache is behind this manager's writes; reconciling once it has seen them");
        if let Some(m) = &self.metrics {
            m.stale_cache_wait(&self.controller);
        }
        let this = Arc::clone(self);
        let (key, queue, reasons, halt) = (
            key.clone(),
            queue.clone(),
            Arc::clone(reasons),
            halt.clone(),
        );
        let since = Instant::now();
        tokio::spawn(
            async move {
                let seen = async {
                    for p in &pending {
                        if !p.informer.wait_seen(&p.target).await {
                            return WaitEnd::Stopped;
                        }
                    }
                    WaitEnd::Seen
                };
                let end = tokio::select! {
                    _ = halt.cancelled() => return,
                    end = tokio::time::timeout(this.bound, seen) => end.unwrap_or(WaitEnd::Bound),
                };
                let waited = since.elapsed();
                let priority = {
                    let mut keys = this.keys.lock();
                    if !matches!(end, WaitEnd::Seen) {
                        keys.released.insert(key.clone());
                    }
                    keys.parked.remove(&key).unwrap_or(priority)
                };
                if let Some(m) = &this.metrics {
                    m.stale_cache_waited(&this.controller, waited.as_secs_f64());
                }
                match end {
                    WaitEnd::Seen => {
                        debug!(key = key.as_str(), ?waited, "the cache has seen this manager's writes");
                        reasons.now(&key, || Reason::CaughtUp);
                    }
                    WaitEnd::Bound | WaitEnd::Stopped => {
                        let behind: Vec<&Pending> = pending
                            .iter()
                            .filter(|p| !p.informer.seen(&p.target))
                            .collect();
                        let why = match end {
                            WaitEnd::Stopped => "an informer stopped",
                            _ => "the bound passed",
                        };
                        warn!(key = key.as_str(), ?behind, bound = ?this.bound, why, "the cache did not see this manager's writes; giving them up and reconciling from the cache as it is");
                        this.tracker.give_up(&pending);
                        if let Some(m) = &this.metrics {
                            m.stale_sync_skip(&this.controller);
                        }
                        reasons.now(&key, || Reason::StaleCache);
                    }
                }
                queue.add_with_priority(key, priority);
            }
            .in_current_span(),
        );
        Readiness::Parked
    }
}

/// Read-your-writes as a gate: a key whose informers have not seen this
/// Manager's writes yet is parked until they have (or until the bound),
/// then queued again; the writes a reconcile makes are credited to it.
pub(crate) struct ReadYourWrites {
    pub(crate) consistency: Arc<Consistency>,
    /// Where a parked key is queued again, with why.
    pub(crate) queue: RateLimitingQueue<ObjectKey>,
    pub(crate) reasons: Arc<Reasons>,
    /// Cancelled when no further key may be taken: parked keys stay parked.
    pub(crate) halt: CancellationToken,
}

impl Gate for ReadYourWrites {
    fn admit(&self, key: &ObjectKey, priority: Priority) -> Admission {
        let readiness = self.consistency.before_reconcile(
            key,
            priority,
            &self.queue,
            &self.reasons,
            &self.halt,
        );
        match readiness {
            Readiness::Ready => Admission::Admit,
            Readiness::Parked => Admission::Park,
        }
    }

    fn scope<'a>(
        &self,
        key: &ObjectKey,
        reconcile: BoxFuture<'a, Reconciled>,
    ) -> BoxFuture<'a, Reconciled> {
        Box::pin(self.consistency.reconciling(key).scope(reconcile))
    }
}

/// A write request, as read from its method and path.
#[derive(Debug)]
struct WriteRequest {
    method: Method,
    resource: GroupResource,
    namespace: Option<String>,
    /// `None` for a create (POST to the collection).
    name: Option<String>,
}

/// The subresources of a Namespace (apiserver's `namespaceSubresources`):
/// `namespaces/x/status` is Namespace x's status, not a collection
/// `status` in namespace x.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// The write `request` makes, if it is one worth remembering.
fn write_request<B>(request: &Request<B>) -> Option<WriteRequest> {
    let method = request.method();
    if ![Method::POST, Method::PUT, Method::PATCH, Method::DELETE].contains(method) {
        return None;
    }
    if let Some(query) = request.uri().query()
        && query
            .split('&')
            .any(|p| p.starts_with("dryRun=") || p == "dryRun")
    {
        return None;
    }
    let segments: Vec<&str> = request.uri().path().trim_matches('/').split('/').collect();
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    // As the API server's RequestInfoFactory reads a path: `namespaces/NS`
    // scopes what follows, unless what follows is a subresource of the
    // Namespace itself (`/api/v1/namespaces/x/status` writes Namespace x).
    let (namespace, rest) = match rest {
        ["namespaces", ns, next, ..] if !NAMESPACE_SUBRESOURCES.contains(next) => {
            (Some((*ns).to_owned()), &rest[2..])
        }
        rest => (None, rest),
    };
    let (resource, name) = match (rest, method) {
        ([resource], &Method::POST) => (*resource, None),
        ([resource, name], m) if m != Method::POST => (*resource, Some(*name)),
        // status, scale, ...: a new version of the object; not POSTs
        // (eviction, binding, token), which do not answer the object.
        // Not `proxy`, whose answer is the proxied backend's.
        ([resource, name, subresource], m)
            if m != Method::POST && m != Method::DELETE && *subresource != "proxy" =>
        {
            (*resource, Some(*name))
        }
        _ => return None,
    };
    Some(WriteRequest {
        method: method.clone(),
        resource: GroupResource::new(group, resource),
        namespace,
        name: name.map(str::to_owned),
    })
}

/// What is read from the answer to a write.
#[derive(Deserialize)]
struct Answer {
    kind: Option<String>,
    metadata: Option<AnswerMeta>,
    details: Option<StatusDetails>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<String>,
    #[serde(default)]
    owner_references: Vec<AnswerOwner>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AnswerOwner {
    api_version: String,
    kind: String,
    name: String,
    controller: Option<bool>,
}

#[derive(Deserialize)]
struct StatusDetails {
    uid: Option<String>,
}

/// The Manager client's service: see the module docs.
#[derive(Clone)]
struct TrackingService {
    inner: Client,
    tracker: Arc<WriteTracker>,
}

/// An answer's body, its errors as the wrapped client's transport gave
/// them: the outer client wraps them once, as it would have.
type AnswerBody = UnsyncBoxBody<Bytes, BoxError>;

fn answer_body(body: Body) -> AnswerBody {
    body.map_err(|e| match e {
        kube_client::Error::Service(inner) => inner,
        other => BoxError::from(other),
    })
    .boxed_unsync()
}

impl tower_service::Service<Request<Body>> for TrackingService {
    type Response = Response<AnswerBody>;
    type Error = kube_client::Error;
    type Future = BoxFuture<'static, Result<Response<AnswerBody>, kube_client::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let write = write_request(&request).filter(|w| self.tracker.follows(&w.resource));
        let (client, tracker) = (self.inner.clone(), Arc::clone(&self.tracker));
        Box::pin(async move {
            let response = client.send(request).await?;
            let Some(write) = write else {
                return Ok(response.map(answer_body));
            };
            if !response.status().is_success() || UNTRACKED.try_with(|_| ()).is_ok() {
                return Ok(response.map(answer_body));
            }
            let by = RECONCILING.try_with(Clone::clone).ok();
            let (parts, body) = response.into_parts();
            let bytes: Bytes = body.collect().await?.to_bytes();
            tracker.record(&write, &bytes, by);
            Ok(Response::from_parts(parts, answer_body(Body::from(bytes))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, uri: &str) -> Request<()> {
        Request::builder().method(method).uri(uri).body(()).unwrap()
    }

    /// An informer of a core resource (ConfigMaps in [`tracker`]) in every
    /// namespace that sees nothing: what is recorded stays (the sweep
    /// forgets what every informer has seen, and what no informer covers).
    struct Blind(&'static str);

    impl Follows for Blind {
        fn resource(&self) -> Option<GroupResource> {
            Some(GroupResource::new("", self.0))
        }
        fn covers(&self, _: &str) -> bool {
            true
        }
        fn lists_every_namespace(&self) -> bool {
            true
        }
        fn knows_its_version(&self) -> bool {
            true
        }
        fn seen(&self, _: &Target) -> bool {
            false
        }
        fn wait_seen<'a>(&'a self, _: &'a Target) -> BoxFuture<'a, bool> {
            Box::pin(std::future::pending())
        }
    }

    fn tracker() -> WriteTracker {
        let tracker = WriteTracker::default();
        tracker.follow(Arc::new(Blind("configmaps")));
        tracker
    }

    fn configmap_write(method: Method, name: Option<&str>) -> WriteRequest {
        WriteRequest {
            method,
            resource: GroupResource::new("", "configmaps"),
            namespace: Some("ns".to_owned()),
            name: name.map(str::to_owned),
        }
    }

    fn version_of(tracker: &WriteTracker, key: &str) -> Option<Option<String>> {
        let writes = tracker.writes.lock();
        let w = writes.get(&GroupResource::new("", "configmaps"))?;
        Some(w.objects.get(key)?.version.clone())
    }

    #[tokio::test]
    async fn an_answer_that_cannot_be_read_is_counted_and_remembers_nothing() {
        let tracker = tracker();
        let create = configmap_write(Method::POST, None);
        let deep = format!(
            "{{\"metadata\":{}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        for answer in [
            &b"not json"[..],
            &b"\xff\xfe{\"metadata\":{}}"[..],
            deep.as_bytes(),
            br#"{"kind":"Status","status":"Success"}"#,
            br#"{"kind":"ConfigMap","metadata":{"resourceVersion":"5"}}"#,
            br#"{"kind":"ConfigMap"}"#,
            br#"{"metadata":"a string"}"#,
        ] {
            tracker.record(&create, answer, None);
        }
        assert_eq!(tracker.stats.unreadable.load(Ordering::Relaxed), 7);
        assert_eq!(tracker.stats.recorded.load(Ordering::Relaxed), 0);
        assert!(tracker.writes.lock().is_empty());
    }

    #[tokio::test]
    async fn a_write_answered_out_of_order_does_not_move_its_object_back() {
        let tracker = tracker();
        let update = configmap_write(Method::PUT, Some("a"));
        let answer = |rv: &str| {
            format!(
                r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"{rv}"}}}}"#
            )
        };
        tracker.record(&update, answer("20").as_bytes(), None);
        tracker.record(&update, answer("7").as_bytes(), None);
        assert_eq!(version_of(&tracker, "ns/a"), Some(Some("20".to_owned())));
        // A huge answer is read all the same.
        let big = format!(
            r#"{{"metadata":{{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"21"}},"data":{{"x":"{}"}}}}"#,
            "y".repeat(8 << 20)
        );
        tracker.record(&update, big.as_bytes(), None);
        assert_eq!(version_of(&tracker, "ns/a"), Some(Some("21".to_owned())));
        // A delete answered by a Status: by uid, no version.
        let delete = configmap_write(Method::DELETE, Some("a"));
        let status = br#"{"kind":"Status","status":"Success","details":{"name":"a","kind":"configmaps","uid":"u1"}}"#;
        tracker.record(&delete, status, None);
        assert_eq!(version_of(&tracker, "ns/a"), Some(None));
    }

    #[tokio::test]
    async fn a_delete_answered_with_the_object_marked_is_an_update_and_keeps_its_owner() {
        let tracker = tracker();
        let update = configmap_write(Method::PUT, Some("a"));
        let owned = br#"{"metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"5",
            "ownerReferences":[{"apiVersion":"v1","kind":"Secret","name":"p","uid":"s","controller":true}]}}"#;
        tracker.record(&update, owned, None);
        // Finalizers pending: the object stays, at a new version.
        let delete = configmap_write(Method::DELETE, Some("a"));
        let marked = br#"{"metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"6",
            "deletionTimestamp":"2026-12-06T00:00:00Z"}}"#;
        tracker.record(&delete, marked, None);
        let writes = tracker.writes.lock();
        let configmaps = &writes[&GroupResource::new("", "configmaps")];
        let written = &configmaps.objects["ns/a"];
        assert!(!written.delete, "the object still exists");
        let owner = ("".to_owned(), "Secret".to_owned(), "p".to_owned());
        assert_eq!(written.owner.as_ref(), Some(&owner));
        assert!(configmaps.owned_by[&owner].contains("ns/a"));
    }

    #[tokio::test]
    async fn writes_recorded_from_many_threads_are_all_remembered() {
        let tracker = Arc::new(tracker());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let tracker = Arc::clone(&tracker);
                std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        for i in 0..500 {
                            let write = configmap_write(Method::PUT, Some("x"));
                            let answer = format!(
                                r#"{{"metadata":{{"name":"cm-{t}-{i}","namespace":"ns","uid":"{t}-{i}","resourceVersion":"{}"}}}}"#,
                                1 + t * 1000 + i
                            );
                            tracker.record(&write, answer.as_bytes(), None);
                        }
                    });
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(tracker.stats.recorded.load(Ordering::Relaxed), 4000);
        let writes = tracker.writes.lock();
        let configmaps = &writes[&GroupResource::new("", "configmaps")];
        assert_eq!(configmaps.objects.len(), 4000);
        assert_eq!(configmaps.highest.as_deref(), Some("7500"));
    }

    /// What a [`Gate`] informer has seen of the writes.
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Sight {
        Behind,
        Seen,
        Stopped,
    }

    /// An informer of ConfigMaps (in `namespace`, or every one) that sees
    /// the writes when told.
    struct Gate {
        namespace: Option<&'static str>,
        sight: tokio::sync::watch::Sender<Sight>,
    }

    impl Gate {
        fn new(namespace: Option<&'static str>) -> Arc<Self> {
            let sight = tokio::sync::watch::channel(Sight::Behind).0;
            Arc::new(Self { namespace, sight })
        }
    }

    impl Follows for Gate {
        fn resource(&self) -> Option<GroupResource> {
            Some(GroupResource::new("", "configmaps"))
        }
        fn covers(&self, key: &str) -> bool {
            self.namespace
                .is_none_or(|ns| namespace_of(key) == Some(ns))
        }
        fn lists_every_namespace(&self) -> bool {
            self.namespace.is_none()
        }
        fn knows_its_version(&self) -> bool {
            true
        }
        fn seen(&self, _: &Target) -> bool {
            *self.sight.borrow() == Sight::Seen
        }
        fn wait_seen<'a>(&'a self, _: &'a Target) -> BoxFuture<'a, bool> {
            let mut sight = self.sight.subscribe();
            Box::pin(async move {
                let Ok(now) = sight.wait_for(|s| *s != Sight::Behind).await else {
                    return false;
                };
                *now == Sight::Seen
            })
        }
    }

    /// A controller of ConfigMaps reading them through `gate`, with
    /// read-your-writes on and `bound`, its queue and its reasons.
    struct Controlled {
        consistency: Arc<Consistency>,
        queue: RateLimitingQueue<ObjectKey>,
        reasons: Arc<Reasons>,
        halt: CancellationToken,
    }

    impl Controlled {
        fn new(gate: &Arc<Gate>, bound: Duration) -> Self {
            let read = Read::new(Arc::clone(gate) as Arc<dyn Follows>, Relation::Primary).unwrap();
            let consistency = Consistency::new(
                Arc::new(WriteTracker::default()),
                "test",
                vec![read],
                true,
                bound,
                None,
            );
            let limiter = kinformer_workqueue::ItemExponentialFailureRateLimiter::new(
                Duration::from_millis(5),
                Duration::from_secs(1),
            );
            Self {
                consistency: Arc::new(consistency),
                queue: RateLimitingQueue::new(limiter),
                reasons: Arc::default(),
                halt: CancellationToken::new(),
            }
        }

        /// The Manager's client wrote ConfigMap `key` at `version`.
        fn wrote(&self, key: &str, version: u32) {
            let (namespace, name) = key.split_once('/').unwrap();
            let write = WriteRequest {
                method: Method::PUT,
                resource: GroupResource::new("", "configmaps"),
                namespace: Some(namespace.to_owned()),
                name: Some(name.to_owned()),
            };
            let answer = format!(
                r#"{{"metadata":{{"name":"{name}","namespace":"{namespace}","uid":"u-{name}","resourceVersion":"{version}"}}}}"#
            );
            self.consistency
                .tracker
                .record(&write, answer.as_bytes(), None);
        }

        fn before(&self, key: &str, priority: Priority) -> Readiness {
            self.consistency.before_reconcile(
                &key.parse().unwrap(),
                priority,
                &self.queue,
                &self.reasons,
                &self.halt,
            )
        }

        /// The next key its waiter queued, with its priority and reason.
        async fn requeued(&self) -> (String, Priority, Reason) {
            let taken = self.queue.get().await.unwrap();
            let reason = self.reasons.take(taken.item());
            (taken.item().to_string(), taken.priority(), reason)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_parked_key_is_queued_once_its_write_is_seen_at_its_highest_priority() {
        let gate = Gate::new(None);
        let c = Controlled::new(&gate, Duration::from_secs(5));
        c.wrote("ns/a", 10);
        assert_eq!(c.before("ns/a", Priority::Low), Readiness::Parked);
        // Taken again by an event while parked: it stays parked, and its
        // priority is the higher one.
        assert_eq!(c.before("ns/a", Priority::High), Readiness::Parked);
        assert_eq!(c.before("ns/a", Priority::Low), Readiness::Parked);
        gate.sight.send_replace(Sight::Seen);
        assert_eq!(
            c.requeued().await,
            ("ns/a".to_owned(), Priority::High, Reason::CaughtUp)
        );
        assert_eq!(
            c.consistency.tracker.stats.given_up.load(Ordering::Relaxed),
            0
        );
        assert_eq!(c.before("ns/a", Priority::Low), Readiness::Ready);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_released_at_the_bound_runs_once_despite_newer_writes_then_waits_again() {
        let gate = Gate::new(None);
        let bound = Duration::from_secs(5);
        let c = Controlled::new(&gate, bound);
        c.wrote("ns/a", 10);
        let parked = Instant::now();
        assert_eq!(c.before("ns/a", Priority::High), Readiness::Parked);
        // Written again while it waits: the new write is not seen either.
        c.wrote("ns/a", 11);
        let (key, _, reason) = c.requeued().await;
        assert_eq!((key.as_str(), reason), ("ns/a", Reason::StaleCache));
        assert!(parked.elapsed() >= bound);
        // The write waited for is superseded, not forgotten: the newer one
        // stays remembered.
        assert_eq!(
            version_of(&c.consistency.tracker, "ns/a"),
            Some(Some("11".to_owned()))
        );
        // Reconciled once from the cache as it is, not parked bound after
        // bound; the next write is waited for again.
        assert_eq!(c.before("ns/a", Priority::High), Readiness::Ready);
        c.wrote("ns/a", 12);
        assert_eq!(c.before("ns/a", Priority::High), Readiness::Parked);
    }

    #[tokio::test(start_paused = true)]
    async fn a_stopped_informer_releases_its_keys_before_the_bound() {
        let gate = Gate::new(None);
        let c = Controlled::new(&gate, Duration::from_secs(3600));
        c.wrote("ns/a", 10);
        let parked = Instant::now();
        assert_eq!(c.before("ns/a", Priority::High), Readiness::Parked);
        gate.sight.send_replace(Sight::Stopped);
        let (key, _, reason) = c.requeued().await;
        assert_eq!((key.as_str(), reason), ("ns/a", Reason::StaleCache));
        assert!(parked.elapsed() < Duration::from_secs(1));
        assert_eq!(
            c.consistency.tracker.stats.given_up.load(Ordering::Relaxed),
            1
        );
        assert_eq!(c.before("ns/a", Priority::High), Readiness::Ready);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_outside_the_informers_namespace_is_not_waited_for() {
        let gate = Gate::new(Some("mine"));
        let c = Controlled::new(&gate, Duration::from_secs(5));
        // The first write sweeps (forgetting what no informer covers);
        // the second comes before the next sweep.
        c.wrote("mine/a", 10);
        c.wrote("theirs/a", 10);
        assert_eq!(c.before("theirs/a", Priority::High), Readiness::Ready);
        assert_eq!(c.before("mine/a", Priority::High), Readiness::Parked);
    }

    /// Lists `ns/b` at 2 (list at 3), then, after a 410, a relist at 7 in
    /// which `ns/b` does not decode: the cache keeps `ns/b` at 2.
    struct Undecoded {
        lists: Mutex<std::collections::VecDeque<kinformer_informer::ListPage<ConfigMapLike>>>,
        watches: std::sync::atomic::AtomicUsize,
    }

    type ConfigMapLike = k8s_openapi::api::core::v1::ConfigMap;

    impl kinformer_informer::ListerWatcher<ConfigMapLike> for Undecoded {
        fn list(
            &self,
            _: kinformer_informer::ListRequest,
        ) -> BoxFuture<
            '_,
            Result<kinformer_informer::ListPage<ConfigMapLike>, kinformer_informer::ListWatchError>,
        > {
            let next = self.lists.lock().pop_front();
            Box::pin(async move {
                next.ok_or_else(|| {
                    kinformer_informer::ListWatchError::Connect("no more lists".into())
                })
            })
        }
        fn watch(
            &self,
            request: kinformer_informer::WatchRequest,
        ) -> BoxFuture<
            '_,
            Result<
                kinformer_informer::WatchStream<ConfigMapLike>,
                kinformer_informer::ListWatchError,
            >,
        > {
            if request.send_initial_events {
                // No streaming list here: lists in pages.
                return Box::pin(async {
                    Err(kinformer_informer::ListWatchError::Api {
                        code: 400,
                        reason: "BadRequest".into(),
                        message: "sendInitialEvents is not supported".into(),
                        causes: Vec::new(),
                    })
                });
            }
            let first = self.watches.fetch_add(1, Ordering::SeqCst) == 0;
            Box::pin(async move {
                use futures::StreamExt;
                Ok(if first {
                    let gone = kinformer_informer::ListWatchError::Gone("too old".into());
                    futures::stream::iter([Err(gone)]).boxed()
                } else {
                    futures::stream::pending().boxed()
                })
            })
        }
        fn describe(&self) -> String {
            "configmaps (undecoded)".into()
        }
    }

    /// A write to an object a relist could not decode is not seen, though
    /// the cache's version is past the write's: the cache holds the object
    /// older than the write.
    #[tokio::test(start_paused = true)]
    async fn a_write_to_an_object_a_relist_could_not_decode_is_not_seen() {
        let b: ConfigMapLike = serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "b", "uid": "u", "resourceVersion": "2"},
        }))
        .unwrap();
        let page = |items: Vec<ConfigMapLike>, rv: &str, skipped| kinformer_informer::ListPage {
            items,
            resource_version: rv.to_owned(),
            continue_token: None,
            skipped,
            shard_selector: None,
        };
        let undecodable = kinformer_informer::Undecodable::new(Some("ns/b".into()), "not UTF-8");
        let lw = Undecoded {
            lists: Mutex::new(
                [
                    page(vec![b], "3", Vec::new()),
                    page(Vec::new(), "7", vec![undecodable]),
                ]
                .into(),
            ),
            watches: Default::default(),
        };
        let informer = SharedIndexInformer::new(
            lw,
            kinformer_informer::InformerOptions::new()
                .fifo(kinformer_informer::FifoKind::AtomicFifo),
        );
        let stop = CancellationToken::new();
        let run = {
            let (informer, stop) = (informer.clone(), stop.clone());
            tokio::spawn(async move { informer.run(stop).await })
        };
        informer.wait_caught_up_to("7").await.unwrap();
        let written = Written {
            version: Some("6".to_owned()),
            uid: Some("u".to_owned()),
            delete: false,
            owner: None,
            by: Vec::new(),
            at: Instant::now(),
            seq: 0,
        };
        let target = Target::Object {
            key: "ns/b".to_owned(),
            written,
        };
        assert!(
            !Follows::seen(&informer, &target),
            "ns/b is cached at 2, older than 6"
        );
        stop.cancel();
        let _ = run.await;
    }

    /// Every shape of write path the API server serves, read as its
    /// RequestInfoFactory reads it: (method, path) and the resource,
    /// namespace and name remembered, or `None` for nothing remembered.
    #[test]
    fn every_shape_of_write_path_is_read_as_the_api_server_reads_it() {
        type Want = Option<(&'static str, Option<&'static str>, Option<&'static str>)>;
        let cases: [(Method, &str, Want); 24] = [
            // core, namespaced
            (
                Method::POST,
                "/api/v1/namespaces/a/configmaps",
                Some(("configmaps", Some("a"), None)),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/configmaps/c",
                Some(("configmaps", Some("a"), Some("c"))),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/a/pods/p/status",
                Some(("pods", Some("a"), Some("p"))),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/a/pods/p",
                Some(("pods", Some("a"), Some("p"))),
            ),
            (Method::DELETE, "/api/v1/namespaces/a/pods", None),
            (Method::POST, "/api/v1/namespaces/a/pods/p/eviction", None),
            (Method::PUT, "/api/v1/namespaces/a/pods/p/proxy", None),
            (Method::PATCH, "/api/v1/nodes/n/proxy", None),
            // core, cluster-scoped: Namespaces and their own subresources
            (
                Method::POST,
                "/api/v1/namespaces",
                Some(("namespaces", None, None)),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/x",
                Some(("namespaces", None, Some("x"))),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/x/status",
                Some(("namespaces", None, Some("x"))),
            ),
            (
                Method::PATCH,
                "/api/v1/namespaces/x/status",
                Some(("namespaces", None, Some("x"))),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/x/finalize",
                Some(("namespaces", None, Some("x"))),
            ),
            (
                Method::DELETE,
                "/api/v1/namespaces/x",
                Some(("namespaces", None, Some("x"))),
            ),
            (Method::DELETE, "/api/v1/namespaces", None),
            (
                Method::PATCH,
                "/api/v1/nodes/n/status",
                Some(("nodes", None, Some("n"))),
            ),
            // grouped, namespaced
            (
                Method::POST,
                "/apis/apps/v1/namespaces/a/deployments",
                Some(("deployments.apps", Some("a"), None)),
            ),
            (
                Method::PUT,
                "/apis/apps/v1/namespaces/a/deployments/d/scale",
                Some(("deployments.apps", Some("a"), Some("d"))),
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/a/deployments",
                None,
            ),
            // a namespaced custom resource called "status" is a collection
            (
                Method::PUT,
                "/apis/x.io/v1/namespaces/a/statuses/s",
                Some(("statuses.x.io", Some("a"), Some("s"))),
            ),
            // grouped, cluster-scoped
            (
                Method::PATCH,
                "/apis/x.io/v1/widgets/w",
                Some(("widgets.x.io", None, Some("w"))),
            ),
            (
                Method::PUT,
                "/apis/x.io/v1/widgets/w/status",
                Some(("widgets.x.io", None, Some("w"))),
            ),
            (Method::DELETE, "/apis/x.io/v1/widgets", None),
            (
                Method::POST,
                "/apis/authentication.k8s.io/v1/tokenreviews",
                Some(("tokenreviews.authentication.k8s.io", None, None)),
            ),
        ];
        for (method, path, want) in cases {
            let got = write_request(&request(method.clone(), path));
            let got = got.as_ref().map(|w| {
                (
                    w.resource.to_string(),
                    w.namespace.as_deref(),
                    w.name.as_deref(),
                )
            });
            let want = want.map(|(r, ns, name)| (r.to_owned(), ns, name));
            assert_eq!(got, want, "{method} {path}");
        }
    }

    /// A Namespace's status write is remembered under the Namespace's key:
    /// the requeued reconcile of Namespace x waits for it.
    #[tokio::test]
    async fn a_namespaces_status_write_is_remembered_under_its_name() {
        let tracker = WriteTracker::default();
        tracker.follow(Arc::new(Blind("namespaces")));
        let write = write_request(&request(Method::PUT, "/api/v1/namespaces/x/status")).unwrap();
        let answer =
            br#"{"kind":"Namespace","metadata":{"name":"x","uid":"u","resourceVersion":"9"}}"#;
        tracker.record(&write, answer, None);
        let writes = tracker.writes.lock();
        let namespaces = writes.get(&GroupResource::new("", "namespaces")).unwrap();
        assert_eq!(namespaces.objects["x"].version.as_deref(), Some("9"));
    }

    #[test]
    fn writes_are_told_from_their_method_and_path() {
        let w = write_request(&request(
            Method::POST,
            "/api/v1/namespaces/a/configmaps?fieldManager=x",
        ))
        .unwrap();
        assert_eq!(
            (w.resource.to_string(), w.namespace.as_deref(), w.name),
            ("configmaps".to_owned(), Some("a"), None)
        );
        let w = write_request(&request(
            Method::PATCH,
            "/apis/apps/v1/namespaces/a/deployments/web/status",
        ))
        .unwrap();
        assert_eq!(
            (w.resource.to_string(), w.name.as_deref()),
            ("deployments.apps".to_owned(), Some("web"))
        );
        let w = write_request(&request(Method::DELETE, "/api/v1/namespaces/gone")).unwrap();
        assert_eq!(
            (w.resource.to_string(), w.namespace, w.name.as_deref()),
            ("namespaces".to_owned(), None, Some("gone"))
        );
        let w = write_request(&request(Method::PUT, "/apis/example.com/v1/websites/w")).unwrap();
        assert_eq!(w.resource, GroupResource::new("example.com", "websites"));
        for (method, uri) in [
            (Method::GET, "/api/v1/namespaces/a/configmaps/c"),
            (Method::POST, "/api/v1/namespaces/a/pods/p/eviction"),
            (Method::POST, "/api/v1/namespaces/a/serviceaccounts/s/token"),
            (Method::DELETE, "/api/v1/namespaces/a/configmaps"),
            (
                Method::PATCH,
                "/api/v1/namespaces/a/configmaps/c?dryRun=All",
            ),
            (Method::POST, "/version"),
        ] {
            assert!(
                write_request(&request(method.clone(), uri)).is_none(),
                "{method} {uri}"
            );
        }
    }
}
