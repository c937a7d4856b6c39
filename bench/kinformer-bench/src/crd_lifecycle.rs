//! `crd-lifecycle KUBECONFIG NAMESPACE COUNT`: a Manager with one
//! controller over a custom resource (`Widget`, bench.kinformer.dev/v1)
//! whose CRD is not installed when it starts, followed through the CRD's
//! life, RSS read at each stage:
//!
//! 1. waiting: the Manager runs, its informer waits for the CRD;
//! 2. the CRD installed: from the bench seeing it Established to the
//!    informer synced, then one Widget created (the server's first write
//!    of a new resource, timed apart) to its reconcile; beside it the
//!    server's own time, from another CRD established to its first plain
//!    list by the bench (a new resource's storage starts on its first
//!    request);
//! 3. COUNT Widgets created in NAMESPACE, all reconciled: RSS caching them;
//! 4. the CRD deleted: from the delete to every Widget reconciled as gone
//!    and the informer waiting again; RSS then, and after glibc's
//!    `malloc_trim(0)` (what the allocator kept, isolated).
//!
//! The CRD is deleted at the end whatever happened, so that the next run
//! starts without it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions};
use kinformer_informer::CancellationToken;
use kube_client::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube_client::core::{NamespaceResourceScope, Resource};
use serde::{Deserialize, Serialize};

use crate::{client, heap_bytes, status_kb};

const CRD: &str = "widgets.bench.kinformer.dev";
/// A second CRD, listed by the bench alone: the server's own time.
const FLOOR: &str = "floors.bench.kinformer.dev";

/// A custom resource about the size of a small operator's: a spec of a
/// few fields and a short list.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Widget {
    #[serde(rename = "apiVersion")]
    api_version: String,
    kind: String,
    metadata: ObjectMeta,
    spec: WidgetSpec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WidgetSpec {
    image: String,
    replicas: i32,
    host: String,
    env: Vec<(String, String)>,
}

impl Resource for Widget {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        "Widget".into()
    }
    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        "bench.kinformer.dev".into()
    }
    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        "widgets".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn widget(i: usize) -> Widget {
    Widget {
        api_version: "bench.kinformer.dev/v1".into(),
        kind: "Widget".into(),
        metadata: ObjectMeta {
            name: Some(format!("widget-{i:05}")),
            ..ObjectMeta::default()
        },
        spec: WidgetSpec {
            image: "registry.example.com/widgets/server:1.27.3".into(),
            replicas: 3,
            host: format!("widget-{i:05}.apps.example.com"),
            env: (0..4)
                .map(|e| (format!("WIDGET_SETTING_{e}"), format!("value-{i}-{e}")))
                .collect(),
        },
    }
}

/// The CRD `name` of `kind` (`plural`) in bench.kinformer.dev, serving v1.
fn crd(name: &str, kind: &str, plural: &str) -> Result<CustomResourceDefinition> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "group": "bench.kinformer.dev",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "scope": "Namespaced",
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
            }]
        }
    }))?)
}

/// What the reconciler saw: the Widgets found and gone, by number (no
/// allocation while it runs: what the bench itself kept alive among the
/// freed objects would pin their pages, and count in the RSS after the
/// CRD is deleted), and when it first found one.
struct Seen {
    found: Vec<bool>,
    gone: Vec<bool>,
    first: Option<Instant>,
}

impl Seen {
    fn new(count: usize) -> Self {
        Self {
            found: vec![false; count],
            gone: vec![false; count],
            first: None,
        }
    }

    /// Marks the Widget `name` (`widget-NNNNN`) in `marks`.
    fn mark(marks: &mut [bool], name: &str) {
        let number = name.strip_prefix("widget-").and_then(|n| n.parse::<usize>().ok());
        if let Some(mark) = number.and_then(|n| marks.get_mut(n)) {
            *mark = true;
        }
    }

    fn all(marks: &[bool]) -> bool {
        marks.iter().all(|m| *m)
    }
}

/// Polls `done` every 5 ms, for at most `limit`, naming `what` if it
/// never holds.
async fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let start = Instant::now();
    while !done() {
        if start.elapsed() > limit {
            bail!("{what}: not within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

async fn crd_gone(crds: &Api<CustomResourceDefinition>, name: &str) -> Result<()> {
    let _ = crds.delete(name, &DeleteParams::default()).await;
    let start = Instant::now();
    while crds.get_opt(name).await?.is_some() {
        if start.elapsed() > Duration::from_secs(120) {
            bail!("{name} not gone within 2 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

pub async fn crd_lifecycle(kubeconfig: &str, ns: &str, count: usize) -> Result<serde_json::Value> {
    let client = client(kubeconfig).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for name in [CRD, FLOOR] {
        crd_gone(&crds, name).await?;
    }
    let result = measure(&client, &crds, ns, count).await;
    for name in [CRD, FLOOR] {
        crd_gone(&crds, name).await?;
    }
    result
}

async fn measure(
    client: &kube_client::Client,
    crds: &Api<CustomResourceDefinition>,
    ns: &str,
    count: usize,
) -> Result<serde_json::Value> {
    let seen = Arc::new(Mutex::new(Seen::new(count)));
    let mut manager = Manager::new(client.clone(), ManagerOptions::new())?;
    let controller = manager
        .controller::<Widget>("widgets")
        .reconcile(Arc::clone(&seen), |lookup: Lookup<Widget>, seen| async move {
            let mut seen = seen.lock().expect("seen");
            match lookup {
                Lookup::Found(w) => {
                    seen.first.get_or_insert_with(Instant::now);
                    Seen::mark(&mut seen.found, w.metadata.name.as_deref().unwrap_or_default());
                }
                Lookup::Gone { key } => {
                    Seen::mark(&mut seen.gone, key.name());
                }
            }
            Ok(Action::Done)
        })?;
    manager.add(controller);
    let informer = manager.factory().informer::<Widget>();
    let shutdown = CancellationToken::new();
    let running = tokio::spawn(manager.run(shutdown.clone()));
    let minute = Duration::from_secs(60);

    until("the informer waiting for its CRD", minute, || {
        informer.not_served().is_some()
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let waiting_kb = status_kb("VmRSS:");
    let waiting_anon_kb = status_kb("RssAnon:");
    let (waiting_live, _) = heap_bytes();

    // Installed: from Established as the bench's own watch sees it to
    // the informer synced. Then one Widget created, timed from the create
    // sent to its reconcile (the server's first write of a new resource
    // is slow, and may answer after the watch has delivered the object:
    // its round trip is timed apart).
    let established = install(crds, crd(CRD, "Widget", "widgets")?).await?;
    until("the informer synced", minute, || informer.has_synced()).await?;
    let to_synced = established.elapsed();
    let widgets: Api<Widget> = Api::namespaced(client.clone(), ns);
    let create = Instant::now();
    widgets.create(&PostParams::default(), &widget(0)).await?;
    let created = Instant::now();
    until("the first Widget reconciled", minute, || {
        seen.lock().expect("seen").first.is_some()
    })
    .await?;
    let first = seen.lock().expect("seen").first.context("no reconcile")?;
    let first_create = created - create;
    let to_first_reconcile = first.saturating_duration_since(create);

    // The server's floor: another CRD, another client (a plain list of
    // the bench's own), its first list timed from Established.
    let floor_established = install(crds, crd(FLOOR, "Floor", "floors")?).await?;
    let floors = Api::<kube_client::core::DynamicObject>::all_with(
        client.clone(),
        &kube_client::api::ApiResource::from_gvk_with_plural(
            &kube_client::api::GroupVersionKind::gvk("bench.kinformer.dev", "v1", "Floor"),
            "floors",
        ),
    );
    floors.list(&kube_client::api::ListParams::default()).await?;
    let floor_list = floor_established.elapsed();
    let _ = crds.delete(FLOOR, &DeleteParams::default()).await;

    // COUNT Widgets, 16 creates in flight.
    let created = futures::stream::iter(1..count)
        .map(|i| {
            let widgets = widgets.clone();
            async move { widgets.create(&PostParams::default(), &widget(i)).await }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    if let Some(Err(e)) = created.into_iter().find(Result::is_err) {
        bail!("creating Widgets: {e}");
    }
    until("every Widget reconciled", 5 * minute, || {
        Seen::all(&seen.lock().expect("seen").found)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cached_kb = status_kb("VmRSS:");
    let cached_anon_kb = status_kb("RssAnon:");
    let cached_objects = informer.indexer().len();

    // Deleted: every Widget goes first, each reconciled as gone, then the
    // informer waits again.
    let deleted = Instant::now();
    crds.delete(CRD, &DeleteParams::default()).await?;
    until("every Widget reconciled as gone, then waiting", 5 * minute, || {
        Seen::all(&seen.lock().expect("seen").gone) && informer.not_served().is_some()
    })
    .await?;
    let to_waiting = deleted.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after_kb = status_kb("VmRSS:");
    let after_anon_kb = status_kb("RssAnon:");
    let (heap_live, heap_free) = heap_bytes();
    // SAFETY: malloc_trim only releases free memory of glibc's heaps.
    #[allow(unsafe_code)]
    unsafe {
        libc::malloc_trim(0);
    }
    let trimmed_kb = status_kb("VmRSS:");
    let trimmed_anon_kb = status_kb("RssAnon:");
    let (_, trimmed_free) = heap_bytes();
    let left = informer.indexer().len();
    shutdown.cancel();
    running.await??;
    Ok(serde_json::json!({
        "system": "kinformer", "scenario": "crd-lifecycle", "widgets": cached_objects,
        "cached_after_delete": left,
        "established_to_synced_ms": to_synced.as_secs_f64() * 1e3,
        "server_first_list_ms": floor_list.as_secs_f64() * 1e3,
        "server_first_create_ms": first_create.as_secs_f64() * 1e3,
        "create_sent_to_reconcile_ms": to_first_reconcile.as_secs_f64() * 1e3,
        "delete_to_waiting_s": to_waiting.as_secs_f64(),
        "rss_waiting_bytes": waiting_kb * 1024, "rss_cached_bytes": cached_kb * 1024,
        "rss_after_delete_bytes": after_kb * 1024, "rss_after_delete_trimmed_bytes": trimmed_kb * 1024,
        "heap_live_waiting_bytes": waiting_live, 
        "rss_anon_waiting_bytes": waiting_anon_kb * 1024, "rss_anon_cached_bytes": cached_anon_kb * 1024,
        "rss_anon_after_delete_bytes": after_anon_kb * 1024,
        "rss_anon_after_delete_trimmed_bytes": trimmed_anon_kb * 1024,
        "heap_live_after_delete_bytes": heap_live, "heap_free_after_delete_bytes": heap_free,
        "heap_free_after_delete_trimmed_bytes": trimmed_free,
    }))
}

/// Creates `crd`, watched from before, and returns when the watch showed
/// it Established (read as it comes, whenever the create answers).
async fn install(
    crds: &Api<CustomResourceDefinition>,
    crd: CustomResourceDefinition,
) -> Result<Instant> {
    use futures::TryStreamExt;
    use kube_client::api::{ListParams, WatchEvent, WatchParams};
    let name = crd.metadata.name.clone().unwrap_or_default();
    let selector = format!("metadata.name={name}");
    let from = crds
        .list_metadata(&ListParams::default().fields(&selector))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let events = crds
        .watch(&WatchParams::default().fields(&selector).timeout(60), &from)
        .await?;
    let seen = tokio::spawn(async move {
        let mut events = std::pin::pin!(events);
        while let Some(event) = events.try_next().await? {
            if let WatchEvent::Added(crd) | WatchEvent::Modified(crd) = event {
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    return Ok(Instant::now());
                }
            }
        }
        bail!("{name} not Established within the watch's 60 s")
    });
    crds.create(&PostParams::default(), &crd).await?;
    seen.await?
}
