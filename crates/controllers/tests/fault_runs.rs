//! Fault runs of controllers built on this crate: two deliberately fragile
//! controllers and their sound versions, the examples of the envtest
//! crate's `FaultRun` docs (docs/testing.md).
//!
//! - **A child with a generated name, counted from the cache.** A Secret
//!   controller that creates a ConfigMap child (`generateName`) when its
//!   cache shows none. With read-your-writes off, stale reads of ConfigMaps
//!   make it create a second one before the first reaches its cache: the
//!   fault run catches it (no duplicate children). With read-your-writes
//!   on (the default), it waits for its own write and passes.
//! - **A mark written before the child.** A Secret controller that
//!   annotates its parent "child made" and then creates the child; on a
//!   marked parent it does nothing. Killed between the two writes and
//!   started again, it never makes the child: the crash sweep catches it.
//!   Written child first (an existing child counts as made), it survives
//!   every crash point, conflicts, server errors, missed states and 410s.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::{Action, Lookup, Manager, ManagerOptions, ReconcileError};
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, Target, TestEnv};
use kinformer_informer::{CancellationToken, Lister, SharedInformerFactory};
use kube_client::api::{Api, Patch, PatchParams, PostParams};
use kube_client::{Client, ResourceExt};
use serde_json::json;

/// A Manager of `target`'s namespace, through the fault proxy.
fn manager(target: &Target) -> Manager {
    let factory = SharedInformerFactory::new(target.client.clone()).namespace(&target.namespace);
    Manager::with_factory(factory, target.client.clone(), ManagerOptions::new()).unwrap()
}

fn owner_reference(secret: &Secret) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Secret", "name": secret.name_any(),
        "uid": secret.uid().unwrap_or_default(), "controller": true,
    })
}

/// The scenario: two parent Secrets.
async fn two_parents(client: Client, namespace: String) -> Result<(), BoxError> {
    let api = Api::<Secret>::namespaced(client, &namespace);
    for name in ["a", "b"] {
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &secret).await?;
    }
    Ok(())
}

/// Every parent Secret has a ConfigMap child.
fn every_parent_has_a_child() -> Check {
    Check::new("every parent has a child", |snapshot| {
        let children = snapshot.list::<ConfigMap>()?;
        let missing: Vec<String> = snapshot
            .list::<Secret>()?
            .iter()
            .filter(|p| {
                !children.iter().any(|c| {
                    c.owner_references()
                        .iter()
                        .any(|r| Some(&r.uid) == p.uid().as_ref())
                })
            })
            .map(ResourceExt::name_any)
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("no child for {}", missing.join(", ")))
        }
    })
}

struct Context {
    client: Client,
    children: Lister<ConfigMap>,
}

/// Fragile without read-your-writes: creates a child with a generated name
/// whenever its cache shows none, and looks again every 200 ms.
async fn generated_name_children(target: Target, read_your_writes: bool) {
    let mut manager = manager(&target);
    let context = Arc::new(Context {
        client: manager.client(),
        children: manager.factory().informer::<ConfigMap>().lister(),
    });
    let options = manager
        .controller_options()
        .read_your_writes(read_your_writes);
    let controller = manager
        .controller::<Secret>("generated-name")
        .owns::<ConfigMap>()
        .options(options)
        .reconcile(context, |parent, ctx| async move {
            let Lookup::Found(parent) = parent else {
                return Ok(Action::Done);
            };
            let ns = parent.namespace().unwrap_or_default();
            let uid = parent.uid().unwrap_or_default();
            let has_child = ctx
                .children
                .namespaced(&ns)
                .list(&Default::default())
                .iter()
                .any(|c| c.owner_references().iter().any(|r| r.uid == uid));
            if !has_child {
                let child: ConfigMap = serde_json::from_value(json!({"metadata": {
                    "generateName": format!("{}-", parent.name_any()),
                    "ownerReferences": [owner_reference(&parent)],
                }}))?;
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
                    .create(&PostParams::default(), &child)
                    .await?;
            }
            Ok(Action::RequeueAfter(Duration::from_millis(200)))
        })
        .unwrap();
    manager.add(controller);
    let _ = manager.run(CancellationToken::new()).await;
}

fn generated_name_run(env: &TestEnv, read_your_writes: bool) -> FaultRun<'_> {
    FaultRun::task(env, "generated-name", move |target| {
        generated_name_children(target, read_your_writes)
    })
    .record::<Secret>()
    .record::<ConfigMap>()
    .scenario(two_parents)
    .fault(Fault::stale_reads_of(
        Duration::from_secs(1),
        &["configmaps"],
    ))
    .expect(every_parent_has_a_child())
    .expect(Check::no_duplicate_children::<ConfigMap>())
    .seed(11)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_reads_catch_a_generated_name_child_counted_from_the_cache_and_read_your_writes_fixes_it()
 {
    let env = TestEnv::shared().await.unwrap();
    let failure = generated_name_run(env, false)
        .settle_within(Duration::from_secs(5))
        .run()
        .await
        .unwrap_err();
    let report = failure.report();
    for wanted in [
        "stale reads: watch answers of configmaps held back 1s",
        "✗ no duplicate children: no owner controls two configmaps: Secret ",
        "Secret a controls a-",
        "✓ every parent has a child",
        "ADDED ConfigMap a-",
    ] {
        assert!(
            report.contains(wanted),
            "no {wanted:?} in the report:\n{report}"
        );
    }
    let passed = generated_name_run(env, true).run().await.unwrap();
    assert!(passed.faults_hit > 0, "{passed:?}");
}

/// Marks its parent "child made", then makes the child (`child_first`:
/// the other way round, an existing child counting as made).
async fn marked_children(target: Target, child_first: bool) {
    let mut manager = manager(&target);
    let context = Arc::new(Context {
        client: manager.client(),
        children: manager.factory().informer::<ConfigMap>().lister(),
    });
    let controller = manager
        .controller::<Secret>("marked")
        .owns::<ConfigMap>()
        .reconcile(context, move |parent, ctx| async move {
            let Lookup::Found(parent) = parent else {
                return Ok(Action::Done);
            };
            if parent.annotations().contains_key("example.dev/child-made") {
                return Ok(Action::Done);
            }
            let ns = parent.namespace().unwrap_or_default();
            let child: ConfigMap = serde_json::from_value(json!({"metadata": {
                "name": format!("{}-child", parent.name_any()),
                "ownerReferences": [owner_reference(&parent)],
            }}))?;
            let (parents, children) = (
                Api::<Secret>::namespaced(ctx.client.clone(), &ns),
                Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns),
            );
            let mark = Patch::Merge(
                json!({"metadata": {"annotations": {"example.dev/child-made": "true"}}}),
            );
            if child_first {
                match children.create(&PostParams::default(), &child).await {
                    Ok(_) => {}
                    Err(kube_client::Error::Api(e)) if e.reason == "AlreadyExists" => {}
                    Err(e) => return Err(ReconcileError::from(e)),
                }
                parents
                    .patch(&parent.name_any(), &PatchParams::default(), &mark)
                    .await?;
            } else {
                parents
                    .patch(&parent.name_any(), &PatchParams::default(), &mark)
                    .await?;
                children.create(&PostParams::default(), &child).await?;
            }
            let _ = &ctx.children;
            Ok(Action::Done)
        })
        .unwrap();
    manager.add(controller);
    let _ = manager.run(CancellationToken::new()).await;
}

fn marked_run(env: &TestEnv, child_first: bool) -> FaultRun<'_> {
    FaultRun::task(env, "marked", move |target| {
        marked_children(target, child_first)
    })
    .record::<Secret>()
    .record::<ConfigMap>()
    .scenario(two_parents)
    .expect(every_parent_has_a_child())
    .expect(Check::no_duplicate_children::<ConfigMap>())
    .expect(Check::no_finalizer_left())
    .seed(81)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crash_sweep_catches_a_mark_written_before_the_child_and_passes_the_child_first() {
    let env = TestEnv::shared().await.unwrap();
    let failure = marked_run(env, false)
        .crash_after_each_write()
        .settle_within(Duration::from_secs(5))
        .run()
        .await
        .unwrap_err();
    let report = failure.report();
    for wanted in [
        "crash: the controller killed once the answer to write 1 (of 4 in the clean run)",
        "PATCH /api/v1/namespaces/",
        "then the controller crashed (fault)",
        "✗ every parent has a child: no child for",
        "killed (the crash fault); started again ---",
    ] {
        assert!(
            report.contains(wanted),
            "no {wanted:?} in the report:\n{report}"
        );
    }
    let passed = marked_run(env, true)
        .crash_after_each_write()
        .run()
        .await
        .unwrap();
    assert_eq!(
        (passed.writes, passed.runs, passed.crashes),
        (4, 5, 4),
        "{passed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_child_first_controller_survives_conflicts_server_errors_missed_states_and_410s() {
    let env = TestEnv::shared().await.unwrap();
    for fault in [
        Fault::conflicts(0.5),
        Fault::server_errors(0.5),
        Fault::missed_states(),
        Fault::gone(0.5),
    ] {
        let passed = marked_run(env, true)
            .fault(fault.clone())
            .run()
            .await
            .unwrap();
        assert!(passed.faults_hit > 0, "{fault:?} hit nothing: {passed:?}");
    }
    let passed = marked_run(env, true)
        .fault(Fault::conflicts(0.3))
        .fault(Fault::missed_states())
        .fault(Fault::stale_reads(Duration::from_millis(300)))
        .crash_after_each_write()
        .run()
        .await
        .unwrap();
    assert!(
        passed.crashes > 0 && passed.faults_hit > passed.crashes,
        "{passed:?}"
    );
}
