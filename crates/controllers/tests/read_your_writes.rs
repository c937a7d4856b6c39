//! Read your own writes, against a real kube-apiserver whose watch answers
//! lag the writes (the envtest answering proxy holds watch bytes back;
//! writes and lists pass at once), as on a busy server. Each scenario runs
//! with the feature on, and off to show that it reproduces the defect.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::{
    Action, ControllerOptions, Lookup, Manager, ManagerOptions, ObjectKey, ReconcileError,
};
use kinformer_envtest::{AnsweringProxy, TestEnv};
use kinformer_informer::{CancellationToken, Lister};
use kube_client::api::{Api, DeleteParams, PostParams};
use kube_client::{Client, ResourceExt};
use serde_json::json;

mod common;

/// A namespace, a proxy holding watch answers back by `delay`, and a
/// Manager whose every request goes through it.
struct Lagging {
    admin: Client,
    ns: kinformer_envtest::TestNamespace,
    proxy: Arc<AnsweringProxy>,
    manager: Manager,
}

async fn lagging(prefix: &str, delay: Duration) -> Lagging {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace(prefix).await.unwrap();
    let proxy = Arc::new(AnsweringProxy::start(env).await.unwrap());
    proxy.delay_watches(delay);
    let manager =
        Manager::new(env.client_via(proxy.port()).unwrap(), ManagerOptions::new()).unwrap();
    Lagging {
        admin: env.client().unwrap(),
        ns,
        proxy,
        manager,
    }
}

/// The value of the sample `name{labels}` in `metrics`, 0 if absent.
fn sample(metrics: &kinformer_controllers::Metrics, sample: &str) -> f64 {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// Options for the scenarios: read-your-writes on or off; when on, a
/// bound far above the lag, so that only seeing the writes ends a wait.
fn options<K>(manager: &Manager, read_your_writes: bool) -> ControllerOptions<K> {
    manager
        .controller_options()
        .read_your_writes(read_your_writes)
        .read_your_writes_bound(Duration::from_secs(30))
}

/// After a scenario with read-your-writes on: it waited, always until the
/// writes were seen.
fn waited_and_never_skipped(metrics: &kinformer_controllers::Metrics, controller: &str) {
    let waits = sample(
        metrics,
        &format!("kinformer_controller_stale_cache_waits_total{{controller=\"{controller}\"}}"),
    );
    let skips = sample(
        metrics,
        &format!("kinformer_controller_stale_sync_skips_total{{controller=\"{controller}\"}}"),
    );
    assert!(waits > 0.0, "no reconcile waited for the cache");
    assert_eq!(skips, 0.0, "a wait ended at the bound");
}

/// Runs `manager` until `done` is cancelled (by a reconcile).
async fn run_until(manager: Manager, done: CancellationToken) {
    let task = tokio::spawn(manager.run(done.clone()));
    tokio::time::timeout(Duration::from_secs(60), done.cancelled())
        .await
        .expect("the scenario did not end within 60 s");
    task.await.unwrap().unwrap();
}

/// The ConfigMaps of `namespace` whose controller ownerReference is `uid`, as cached.
fn cached_children(lister: &Lister<ConfigMap>, namespace: &str, uid: &str) -> Vec<String> {
    lister
        .namespaced(namespace)
        .list(&Default::default())
        .iter()
        .filter(|cm| {
            cm.owner_references()
                .iter()
                .any(|r| r.uid == uid && r.controller == Some(true))
        })
        .map(|cm| cm.name_any())
        .collect()
}

fn owner_reference(secret: &Secret) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "name": secret.name_any(),
        "uid": secret.uid().unwrap(), "controller": true,
    })
}

/// Creates Secret `parent` in `ns` and ConfigMap `child` it controls.
async fn parent_with_child(admin: &Client, ns: &str) {
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap();
    let secret = Api::<Secret>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let child: ConfigMap = serde_json::from_value(json!({"metadata": {
        "name": "child", "ownerReferences": [owner_reference(&secret)],
    }}))
    .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &child)
        .await
        .unwrap();
}

struct Children {
    lister: Lister<ConfigMap>,
    client: Client,
    ns: String,
    created: AtomicUsize,
    /// Reconciles that found the child in the cache.
    seen: AtomicUsize,
    done: CancellationToken,
}

/// A Secret controller that creates one ConfigMap child (generated name)
/// when its cache shows none, and looks again every 100 ms: how many
/// children did it create once it has seen its child five times?
async fn children_created(read_your_writes: bool) -> usize {
    let Lagging {
        admin,
        ns,
        proxy: _proxy,
        mut manager,
    } = lagging("ryw-children", Duration::from_secs(1)).await;
    let done = CancellationToken::new();
    let context = Arc::new(Children {
        lister: manager.factory().informer::<ConfigMap>().lister(),
        client: manager.client(),
        ns: ns.clone(),
        created: AtomicUsize::new(0),
        seen: AtomicUsize::new(0),
        done: done.clone(),
    });
    let options = options(&manager, read_your_writes);
    let metrics = Arc::clone(manager.metrics());
    let controller = manager
        .controller::<Secret>("children")
        .owns::<ConfigMap>()
        .options(options)
        .reconcile(Arc::clone(&context), |secret, ctx| async move {
            let Lookup::Found(secret) = secret else {
                return Ok(Action::Done);
            };
            if secret.namespace().as_deref() != Some(&ctx.ns) {
                return Ok(Action::Done);
            }
            let uid = secret.uid().unwrap_or_default();
            if cached_children(&ctx.lister, &ctx.ns, &uid).is_empty() {
                let child: ConfigMap = serde_json::from_value(json!({"metadata": {
                    "generateName": "child-",
                    "ownerReferences": [owner_reference(&secret)],
                }}))?;
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns)
                    .create(&PostParams::default(), &child)
                    .await?;
                ctx.created.fetch_add(1, Ordering::SeqCst);
            } else if ctx.seen.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
                ctx.done.cancel();
            }
            Ok(Action::RequeueAfter(Duration::from_millis(100)))
        })
        .unwrap();
    manager.add(controller);
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    run_until(manager, done).await;
    if read_your_writes {
        waited_and_never_skipped(&metrics, "children");
    }
    let on_server = Api::<ConfigMap>::namespaced(admin, &ns)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|cm| !cm.owner_references().is_empty())
        .count();
    assert_eq!(on_server, context.created.load(Ordering::SeqCst));
    on_server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_with_a_generated_name_is_created_once_under_a_lagging_watch() {
    assert_eq!(children_created(true).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_read_your_writes_a_lagging_watch_makes_duplicate_children() {
    let created = children_created(false).await;
    assert!(
        created > 1,
        "the scenario no longer shows the defect: {created} child"
    );
}

struct Deletes {
    lister: Lister<ConfigMap>,
    client: Client,
    ns: String,
    deleted: AtomicUsize,
    not_found: AtomicUsize,
    /// Reconciles that found no child in the cache after deleting it.
    gone: AtomicUsize,
    done: CancellationToken,
}

/// A Secret controller that deletes the ConfigMap it owns whenever its
/// cache shows it, and looks again every 100 ms: how many deletes were
/// answered 404 (the child acted on again from a cache that still had it)?
async fn deletes_of_a_deleted_child(read_your_writes: bool) -> (usize, usize) {
    let Lagging {
        admin,
        ns,
        proxy: _proxy,
        mut manager,
    } = lagging("ryw-delete", Duration::from_secs(1)).await;
    parent_with_child(&admin, &ns).await;
    let done = CancellationToken::new();
    let context = Arc::new(Deletes {
        lister: manager.factory().informer::<ConfigMap>().lister(),
        client: manager.client(),
        ns: ns.clone(),
        deleted: AtomicUsize::new(0),
        not_found: AtomicUsize::new(0),
        gone: AtomicUsize::new(0),
        done: done.clone(),
    });
    let options = options(&manager, read_your_writes);
    let metrics = Arc::clone(manager.metrics());
    let controller = manager
        .controller::<Secret>("deletes")
        .owns::<ConfigMap>()
        .options(options)
        .reconcile(Arc::clone(&context), |secret, ctx| async move {
            let Lookup::Found(secret) = secret else {
                return Ok(Action::Done);
            };
            if secret.namespace().as_deref() != Some(&ctx.ns) {
                return Ok(Action::Done);
            }
            let children = cached_children(&ctx.lister, &ctx.ns, &secret.uid().unwrap_or_default());
            let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns);
            for name in &children {
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => ctx.deleted.fetch_add(1, Ordering::SeqCst),
                    Err(kube_client::Error::Api(e)) if e.code == 404 => {
                        ctx.not_found.fetch_add(1, Ordering::SeqCst)
                    }
                    Err(e) => return Err(ReconcileError::from(e)),
                };
            }
            if children.is_empty()
                && ctx.deleted.load(Ordering::SeqCst) > 0
                && ctx.gone.fetch_add(1, Ordering::SeqCst) + 1 == 3
            {
                ctx.done.cancel();
            }
            Ok(Action::RequeueAfter(Duration::from_millis(100)))
        })
        .unwrap();
    manager.add(controller);
    run_until(manager, done).await;
    if read_your_writes {
        waited_and_never_skipped(&metrics, "deletes");
    }
    (
        context.deleted.load(Ordering::SeqCst),
        context.not_found.load(Ordering::SeqCst),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_deleted_by_the_controller_is_not_acted_on_again_from_the_cache() {
    assert_eq!(deletes_of_a_deleted_child(true).await, (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_read_your_writes_a_deleted_child_is_deleted_again() {
    let (deleted, not_found) = deletes_of_a_deleted_child(false).await;
    assert_eq!(deleted, 1);
    assert!(
        not_found > 0,
        "the scenario no longer shows the defect: no delete of the deleted child"
    );
}

struct Status {
    client: Client,
    ns: String,
    written: AtomicUsize,
    conflicts: AtomicUsize,
    done: CancellationToken,
}

/// A Deployment controller that writes its status from the cached object
/// (a PUT carrying the cached resourceVersion) and is reconciled again at
/// once by a requeue: how many writes were answered 409 Conflict?
async fn status_conflicts(read_your_writes: bool) -> usize {
    let Lagging {
        admin,
        ns,
        proxy: _proxy,
        mut manager,
    } = lagging("ryw-status", Duration::from_secs(1)).await;
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "nginx"}]},
            },
        },
    }))
    .unwrap();
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let done = CancellationToken::new();
    let context = Arc::new(Status {
        client: manager.client(),
        ns: ns.clone(),
        written: AtomicUsize::new(0),
        conflicts: AtomicUsize::new(0),
        done: done.clone(),
    });
    let options = options(&manager, read_your_writes);
    let metrics = Arc::clone(manager.metrics());
    let controller = manager
        .controller::<Deployment>("status")
        .options(options)
        .reconcile(Arc::clone(&context), |deployment, ctx| async move {
            let Lookup::Found(deployment) = deployment else {
                return Ok(Action::Done);
            };
            if deployment.namespace().as_deref() != Some(&ctx.ns) {
                return Ok(Action::Done);
            }
            let mut next = (*deployment).clone();
            let status = next.status.get_or_insert_with(Default::default);
            status.observed_generation = Some(status.observed_generation.unwrap_or(0) + 1);
            let api = Api::<Deployment>::namespaced(ctx.client.clone(), &ctx.ns);
            match api
                .replace_status(&next.name_any(), &PostParams::default(), &next)
                .await
            {
                Ok(_) => {
                    if ctx.written.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
                        ctx.done.cancel();
                    }
                }
                Err(kube_client::Error::Api(e)) if e.code == 409 => {
                    ctx.conflicts.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => return Err(e.into()),
            }
            Ok(Action::RequeueAfter(Duration::from_millis(10)))
        })
        .unwrap();
    manager.add(controller);
    run_until(manager, done).await;
    if read_your_writes {
        waited_and_never_skipped(&metrics, "status");
    }
    context.conflicts.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_write_then_a_requeue_reconciles_on_the_written_version() {
    assert_eq!(status_conflicts(true).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_read_your_writes_a_status_write_then_a_requeue_conflicts() {
    let conflicts = status_conflicts(false).await;
    assert!(
        conflicts > 0,
        "the scenario no longer shows the defect: no 409 Conflict"
    );
}

struct Lost {
    lister: Lister<ConfigMap>,
    client: Client,
    ns: String,
    proxy: Arc<AnsweringProxy>,
    reconciles: AtomicUsize,
    released_before_the_event: AtomicBool,
    done: CancellationToken,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_event_never_arrives_releases_its_key_at_the_bound() {
    // No lag until the controller writes: then its watch answers are held
    // back far longer than the bound.
    let Lagging {
        admin,
        ns,
        proxy,
        mut manager,
    } = lagging("ryw-lost", Duration::ZERO).await;
    let done = CancellationToken::new();
    let context = Arc::new(Lost {
        lister: manager.factory().informer::<ConfigMap>().lister(),
        client: manager.client(),
        ns: ns.clone(),
        proxy,
        reconciles: AtomicUsize::new(0),
        released_before_the_event: AtomicBool::new(false),
        done: done.clone(),
    });
    let options = manager
        .controller_options()
        .read_your_writes_bound(Duration::from_millis(500));
    let metrics = Arc::clone(manager.metrics());
    let controller = manager
        .controller::<Secret>("lost")
        .owns::<ConfigMap>()
        .options(options)
        .reconcile(Arc::clone(&context), |secret, ctx| async move {
            let Lookup::Found(secret) = secret else {
                return Ok(Action::Done);
            };
            if secret.namespace().as_deref() != Some(&ctx.ns) {
                return Ok(Action::Done);
            }
            if ctx.reconciles.fetch_add(1, Ordering::SeqCst) == 0 {
                ctx.proxy.delay_watches(Duration::from_secs(120));
                let child: ConfigMap = serde_json::from_value(json!({"metadata": {
                    "name": "child", "ownerReferences": [owner_reference(&secret)],
                }}))?;
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns)
                    .create(&PostParams::default(), &child)
                    .await?;
                return Ok(Action::RequeueAfter(Duration::from_millis(10)));
            }
            let uid = secret.uid().unwrap_or_default();
            ctx.released_before_the_event.store(
                cached_children(&ctx.lister, &ctx.ns, &uid).is_empty(),
                Ordering::SeqCst,
            );
            ctx.done.cancel();
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(controller);
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap();
    Api::<Secret>::namespaced(admin, &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    run_until(manager, done).await;
    assert!(
        context.released_before_the_event.load(Ordering::SeqCst),
        "the second reconcile came after the child's event"
    );
    let exposed = metrics.encode();
    assert!(
        exposed.contains(r#"kinformer_controller_stale_sync_skips_total{controller="lost"} 1"#),
        "{exposed}"
    );
    assert!(
        exposed.contains(r#"kinformer_read_your_writes_writes_total{outcome="given_up"} 1"#),
        "{exposed}"
    );
}

struct Stamps {
    lister: Lister<ConfigMap>,
    client: Client,
    ns: String,
    /// Set once the stamping controller's write was answered.
    stamped: AtomicBool,
    /// The owner's last reconcile ended after that answer.
    after_stamp: AtomicBool,
    /// Reconciles of the owner that began after one that ended after the
    /// answer, and found the child unstamped in the cache.
    stale: AtomicUsize,
    fresh: AtomicUsize,
    done: CancellationToken,
}

/// Two controllers of one Manager: `stamper` labels the ConfigMap it
/// reconciles; `owner`, the Secret owning it, looks at its child every
/// 50 ms. How many of the owner's reconciles, begun after the label was
/// answered, found the child unlabelled in the cache?
async fn reconciles_on_an_unstamped_child(read_your_writes: bool) -> usize {
    let Lagging {
        admin,
        ns,
        proxy: _proxy,
        mut manager,
    } = lagging("ryw-across", Duration::from_secs(1)).await;
    parent_with_child(&admin, &ns).await;
    let done = CancellationToken::new();
    let context = Arc::new(Stamps {
        lister: manager.factory().informer::<ConfigMap>().lister(),
        client: manager.client(),
        ns: ns.clone(),
        stamped: AtomicBool::new(false),
        after_stamp: AtomicBool::new(false),
        stale: AtomicUsize::new(0),
        fresh: AtomicUsize::new(0),
        done: done.clone(),
    });
    let metrics = Arc::clone(manager.metrics());
    let stamper = manager
        .controller::<ConfigMap>("stamper")
        .options(options(&manager, read_your_writes))
        .reconcile(Arc::clone(&context), |cm, ctx| async move {
            let Lookup::Found(cm) = cm else {
                return Ok(Action::Done);
            };
            if cm.namespace().as_deref() != Some(&ctx.ns) || cm.labels().contains_key("stamped") {
                return Ok(Action::Done);
            }
            let patch = json!({"metadata": {"labels": {"stamped": "yes"}}});
            Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns)
                .patch(
                    &cm.name_any(),
                    &kube_client::api::PatchParams::default(),
                    &kube_client::api::Patch::Merge(patch),
                )
                .await?;
            ctx.stamped.store(true, Ordering::SeqCst);
            Ok(Action::Done)
        })
        .unwrap();
    let owner = manager
        .controller::<Secret>("owner")
        .owns::<ConfigMap>()
        .options(options(&manager, read_your_writes))
        .reconcile(Arc::clone(&context), |secret, ctx| async move {
            let Lookup::Found(secret) = secret else {
                return Ok(Action::Done);
            };
            if secret.namespace().as_deref() != Some(&ctx.ns) {
                return Ok(Action::Done);
            }
            let begun_after_stamp = ctx.after_stamp.load(Ordering::SeqCst);
            let child = ctx.lister.get(&format!("{}/child", ctx.ns));
            let stamped = child.is_some_and(|c| c.labels().contains_key("stamped"));
            if begun_after_stamp {
                if stamped {
                    if ctx.fresh.fetch_add(1, Ordering::SeqCst) + 1 == 5 {
                        ctx.done.cancel();
                    }
                } else {
                    ctx.stale.fetch_add(1, Ordering::SeqCst);
                }
            }
            if ctx.stamped.load(Ordering::SeqCst) {
                ctx.after_stamp.store(true, Ordering::SeqCst);
            }
            Ok(Action::RequeueAfter(Duration::from_millis(50)))
        })
        .unwrap();
    manager.add(stamper).add(owner);
    run_until(manager, done).await;
    if read_your_writes {
        waited_and_never_skipped(&metrics, "owner");
    }
    context.stale.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_by_one_controller_is_awaited_by_another_that_owns_the_object() {
    assert_eq!(reconciles_on_an_unstamped_child(true).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_read_your_writes_another_controller_reads_the_child_unstamped() {
    let stale = reconciles_on_an_unstamped_child(false).await;
    assert!(
        stale > 0,
        "the scenario no longer shows the defect: no reconcile found the child unstamped"
    );
}

struct Counter {
    lister: Lister<ConfigMap>,
    client: Client,
    ns: String,
    written: AtomicUsize,
    conflicts: AtomicUsize,
    done: CancellationToken,
}

/// A Secret controller that `watches` ConfigMaps through a mapper, on
/// informers whose queue is `fifo`, under watch answers 1 s behind: it
/// bumps ConfigMap `counter` from its cached copy (a PUT carrying the
/// cached resourceVersion) and is requeued at once. Its reconciles must
/// wait for its own writes only until they are seen, never to the bound,
/// on every queue (`has_caught_up_to` is an error on the DeltaFifo and the
/// plain RealFifo, and the wait used to end only at the bound).
async fn a_watching_controller_waits_for_its_writes_on(fifo: kinformer_informer::FifoKind) {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("ryw-watches").await.unwrap();
    let proxy = Arc::new(AnsweringProxy::start(env).await.unwrap());
    proxy.delay_watches(Duration::from_secs(1));
    let client = env.client_via(proxy.port()).unwrap();
    let factory = kinformer_informer::SharedInformerFactory::new(client.clone()).fifo(fifo);
    let mut manager = Manager::with_factory(factory, client, ManagerOptions::new()).unwrap();
    let admin = env.client().unwrap();
    let counter: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "counter"}, "data": {"n": "0"},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &counter)
        .await
        .unwrap();
    let done = CancellationToken::new();
    let configmaps = manager.factory().informer::<ConfigMap>();
    let context = Arc::new(Counter {
        lister: configmaps.lister(),
        client: manager.client(),
        ns: ns.clone(),
        written: AtomicUsize::new(0),
        conflicts: AtomicUsize::new(0),
        done: done.clone(),
    });
    // The bound is far above the lag: a wait that ends at it fails the run.
    let options = manager
        .controller_options()
        .read_your_writes_bound(Duration::from_secs(600));
    let metrics = Arc::clone(manager.metrics());
    let mapped_ns = ns.clone();
    let controller = manager
        .controller::<Secret>("watcher")
        .watches(configmaps, move |cm: &ConfigMap| {
            if cm.namespace().as_deref() == Some(&mapped_ns) {
                vec![ObjectKey::namespaced(&mapped_ns, "parent").unwrap()]
            } else {
                Vec::new()
            }
        })
        .options(options)
        .reconcile(Arc::clone(&context), |secret, ctx| async move {
            let Lookup::Found(secret) = secret else {
                return Ok(Action::Done);
            };
            if secret.namespace().as_deref() != Some(&ctx.ns) {
                return Ok(Action::Done);
            }
            let Some(cached) = ctx.lister.namespaced(&ctx.ns).get("counter") else {
                return Ok(Action::Done);
            };
            let mut next = (*cached).clone();
            let n: usize = next
                .data
                .as_ref()
                .and_then(|d| d.get("n")?.parse().ok())
                .unwrap_or(0);
            next.data = Some([("n".to_owned(), (n + 1).to_string())].into());
            let api = Api::<ConfigMap>::namespaced(ctx.client.clone(), &ctx.ns);
            match api.replace("counter", &PostParams::default(), &next).await {
                Ok(_) => {
                    if ctx.written.fetch_add(1, Ordering::SeqCst) + 1 == 4 {
                        ctx.done.cancel();
                    }
                }
                Err(kube_client::Error::Api(e)) if e.code == 409 => {
                    ctx.conflicts.fetch_add(1, Ordering::SeqCst);
                }
                Err(e) => return Err(e.into()),
            }
            Ok(Action::RequeueAfter(Duration::from_millis(10)))
        })
        .unwrap();
    manager.add(controller);
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "parent"}})).unwrap();
    Api::<Secret>::namespaced(admin, &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    run_until(manager, done).await;
    waited_and_never_skipped(&metrics, "watcher");
    assert_eq!(
        context.conflicts.load(Ordering::SeqCst),
        0,
        "a reconcile read a stale counter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_controller_on_a_delta_fifo_waits_for_its_writes_until_seen() {
    a_watching_controller_waits_for_its_writes_on(kinformer_informer::FifoKind::DeltaFifo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_controller_on_a_plain_real_fifo_waits_for_its_writes_until_seen() {
    a_watching_controller_waits_for_its_writes_on(kinformer_informer::FifoKind::RealFifo).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_controller_on_the_atomic_queue_waits_for_its_writes_until_seen() {
    a_watching_controller_waits_for_its_writes_on(kinformer_informer::FifoKind::AtomicFifo).await;
}
