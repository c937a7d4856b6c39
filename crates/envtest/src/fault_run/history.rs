//! The history of the recorded kinds in a run's namespace, as the test's
//! own client (not the controller's, and not through the fault proxy) saw
//! it: every object present at the start, then every watch event.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube_client::api::{Api, ListParams, WatchEvent, WatchParams};
use kube_client::core::{ApiResource, DynamicObject};
use kube_client::{Client, ResourceExt};
use tokio::sync::{Notify, oneshot};
use tokio::task::JoinHandle;

/// One change to one object.
#[derive(Clone, Debug)]
pub(crate) struct Change {
    pub at: Duration,
    pub what: String,
}

/// Records while it lives; stops on drop.
pub(crate) struct History {
    changes: Arc<Mutex<Vec<Change>>>,
    changed: Arc<Notify>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for History {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl History {
    /// Starts recording `kinds` in `namespace`; returns once each kind's
    /// first list is in.
    pub async fn start(
        client: Client,
        namespace: &str,
        kinds: &[ApiResource],
        start: Instant,
    ) -> Self {
        let changes = Arc::new(Mutex::new(Vec::new()));
        let changed = Arc::new(Notify::new());
        let mut tasks = Vec::new();
        let mut listed = Vec::new();
        for kind in kinds {
            let api = Api::<DynamicObject>::namespaced_with(client.clone(), namespace, kind);
            let (tx, rx) = oneshot::channel();
            listed.push(rx);
            let (changes, changed, kind) =
                (Arc::clone(&changes), Arc::clone(&changed), kind.clone());
            tasks.push(tokio::spawn(async move {
                record(api, kind, changes, changed, start, tx).await;
            }));
        }
        for rx in listed {
            let _ = rx.await;
        }
        Self {
            changes,
            changed,
            tasks,
        }
    }

    /// Notified on each change.
    pub fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.changed)
    }

    pub fn changes(&self) -> Vec<Change> {
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

async fn record(
    api: Api<DynamicObject>,
    kind: ApiResource,
    changes: Arc<Mutex<Vec<Change>>>,
    changed: Arc<Notify>,
    start: Instant,
    listed: oneshot::Sender<()>,
) {
    let push = |what: String| {
        let at = start.elapsed();
        changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Change { at, what });
        changed.notify_waiters();
    };
    let mut listed = Some(listed);
    let mut listed_once = false;
    'relist: loop {
        let list = match api.list(&ListParams::default()).await {
            Ok(list) => list,
            Err(e) => {
                push(format!(
                    "(history: listing {} failed: {e}; retrying)",
                    kind.plural
                ));
                // Not served yet (a CRD the controller installs): the run
                // goes on, and this kind's history starts once it is.
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let relisted = std::mem::replace(&mut listed_once, true);
        for o in &list.items {
            let verb = if relisted { "RELISTED" } else { "PRESENT" };
            push(describe(verb, &kind, o));
        }
        if let Some(tx) = listed.take() {
            let _ = tx.send(());
        }
        let mut version = list.metadata.resource_version.unwrap_or_default();
        loop {
            let params = WatchParams::default().timeout(290);
            let stream = match api.watch(&params, &version).await {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue 'relist;
                }
            };
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let (verb, o) = match event {
                    Ok(WatchEvent::Added(o)) => ("ADDED", o),
                    Ok(WatchEvent::Modified(o)) => ("MODIFIED", o),
                    Ok(WatchEvent::Deleted(o)) => ("DELETED", o),
                    Ok(WatchEvent::Bookmark(b)) => {
                        version = b.metadata.resource_version;
                        continue;
                    }
                    Ok(WatchEvent::Error(_)) | Err(_) => {
                        push(format!(
                            "(history: the {} watch broke; relisting, so changes in between show as RELISTED)",
                            kind.plural
                        ));
                        continue 'relist;
                    }
                };
                version = o.resource_version().unwrap_or_default();
                push(describe(verb, &kind, &o));
            }
        }
    }
}

/// One line: the event, the object, its version, owner, finalizers,
/// deletion, and the start of what it holds beyond its metadata.
fn describe(verb: &str, kind: &ApiResource, o: &DynamicObject) -> String {
    let mut line = format!(
        "{verb} {} {} rv={}",
        kind.kind,
        o.name_any(),
        o.resource_version().unwrap_or_default()
    );
    if let Some(owner) = o
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true))
    {
        line.push_str(&format!(" controller={} {}", owner.kind, owner.name));
    }
    if !o.finalizers().is_empty() {
        line.push_str(&format!(" finalizers={:?}", o.finalizers()));
    }
    if o.metadata.deletion_timestamp.is_some() {
        line.push_str(" deleting");
    }
    if !o.labels().is_empty() {
        line.push_str(&format!(" labels={:?}", o.labels()));
    }
    if !o.annotations().is_empty() {
        line.push_str(&format!(" annotations={:?}", o.annotations()));
    }
    let body = serde_json::to_string(&o.data).unwrap_or_default();
    if body != "{}" && body != "null" {
        line.push(' ');
        line.push_str(&truncate(&body, 200));
    }
    line
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
