//! The two seed controllers (the `kinformer` binary) in fault runs.
//!
//! - service-strategy: killed after each of its writes and started again,
//!   and with stale reads, missed states, 410s, conflicts and server
//!   errors, every annotated Service ends with the selector it asks for,
//!   an invalid one left as it was, an unannotated one untouched.
//! - pod-stdout writes nothing: its end state is what it printed. With
//!   stale reads, missed states and 410s, the last line it printed about
//!   each Pod agrees with the server (there, or gone). A Pod created and
//!   deleted while its watch was blind may never be printed at all: it
//!   prints what its cache holds when a key is reconciled, as client-go's
//!   example does, and a relist shows the last state only.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, TestEnv};
use kube_client::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube_client::{Client, ResourceExt};

const BIN: &str = env!("CARGO_BIN_EXE_kinformer");
const STRATEGY: &str = "kinformer.dev/strategy";

fn command(
    controller: &'static str,
) -> impl Fn(&kinformer_envtest::Target) -> tokio::process::Command {
    move |target| {
        let mut command = tokio::process::Command::new(BIN);
        command.args([
            "--namespace",
            &target.namespace,
            "--metrics-bind-address",
            "0",
        ]);
        command.args(["--health-probe-bind-address", "0", controller]);
        command
    }
}

fn service(name: &str, strategy: Option<&str>) -> Service {
    let annotations = strategy.map(|s| serde_json::json!({STRATEGY: s}));
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"ports": [{"port": 80}], "selector": {"app": "before"}},
    }))
    .unwrap()
}

/// Blue switched to green, then to red; one unannotated; one invalid.
async fn services(client: Client, ns: String) -> Result<(), BoxError> {
    let api = Api::<Service>::namespaced(client, &ns);
    let pp = PostParams::default();
    api.create(&pp, &service("web", Some("blue"))).await?;
    api.create(&pp, &service("plain", None)).await?;
    api.create(&pp, &service("odd", Some("not a label!")))
        .await?;
    for strategy in ["green", "red"] {
        let patch =
            Patch::Merge(serde_json::json!({"metadata": {"annotations": {STRATEGY: strategy}}}));
        api.patch("web", &PatchParams::default(), &patch).await?;
    }
    Ok(())
}

fn selectors_follow_strategies() -> Check {
    Check::new(
        "each Service's selector is what its strategy asks, or untouched",
        |s| {
            let wrong: Vec<String> = s
                .list::<Service>()?
                .iter()
                .filter_map(|svc| {
                    let app = svc.spec.as_ref()?.selector.as_ref()?.get("app")?.clone();
                    let want = match svc.name_any().as_str() {
                        "web" => "red",
                        _ => "before",
                    };
                    (app != want)
                        .then(|| format!("{} selects app={app}, not {want}", svc.name_any()))
                })
                .collect();
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(wrong.join("; "))
            }
        },
    )
}

fn service_strategy(env: &TestEnv) -> FaultRun<'_> {
    FaultRun::process(env, "strategy", command("service-strategy"))
        .record::<Service>()
        .scenario(services)
        .expect(selectors_follow_strategies())
        // A seed whose draws hit: each fault's first chance (the first
        // watch of each resource, the first writes) comes out true.
        .seed(81)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_strategy_survives_a_crash_after_each_write() {
    let env = TestEnv::shared().await.unwrap();
    let passed = service_strategy(env)
        .crash_after_each_write()
        .run()
        .await
        .unwrap();
    assert!(passed.writes >= 1 && passed.crashes > 0, "{passed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_strategy_survives_stale_reads_missed_states_410s_and_write_errors() {
    let env = TestEnv::shared().await.unwrap();
    // Conflicts at p = 0.3: a key is dropped after --max-retries (5) failed
    // retries in a row, as client-go's example drops it.
    for fault in [
        Fault::stale_reads(Duration::from_secs(1)),
        Fault::missed_states(),
        Fault::gone(0.5),
        Fault::conflicts(0.3),
        Fault::server_errors(0.3),
    ] {
        let passed = service_strategy(env)
            .fault(fault.clone())
            .run()
            .await
            .unwrap();
        assert!(passed.faults_hit > 0, "{fault:?} hit nothing: {passed:?}");
    }
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }))
    .unwrap()
}

/// Three Pods, one changed, one deleted.
async fn pods(client: Client, ns: String) -> Result<(), BoxError> {
    let api = Api::<Pod>::namespaced(client, &ns);
    for name in ["p1", "p2", "p3"] {
        api.create(&PostParams::default(), &pod(name)).await?;
    }
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {"changed": "yes"}}}));
    api.patch("p2", &PatchParams::default(), &patch).await?;
    api.delete("p3", &DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

fn printed_as_on_the_server() -> Check {
    Check::new("the last line about each Pod agrees with the server", |s| {
        let pods: Vec<String> = s.list::<Pod>()?.iter().map(ResourceExt::name_any).collect();
        let mut wrong = Vec::new();
        for name in ["p1", "p2", "p3"] {
            let last = s.output().iter().rev().find(|l| {
                l.ends_with(&format!("for Pod {name}"))
                    || l.contains(&format!("/{name} does not exist anymore"))
            });
            let exists = pods.iter().any(|p| p == name);
            match (last, exists) {
                (Some(l), true) if l.contains("Sync/Add/Update") => {}
                (Some(l), false) if l.contains("does not exist anymore") => {}
                (None, false) => {} // never seen: created and gone while blind
                (last, _) => wrong.push(format!(
                    "{name} (on the server: {exists}) last printed as {last:?}"
                )),
            }
        }
        if wrong.is_empty() {
            Ok(())
        } else {
            Err(wrong.join("; "))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_stdout_prints_the_last_state_under_stale_reads_missed_states_and_410s() {
    let env = TestEnv::shared().await.unwrap();
    for fault in [
        None,
        Some(Fault::stale_reads(Duration::from_secs(1))),
        Some(Fault::missed_states()),
        Some(Fault::gone(0.5)),
    ] {
        let mut run = FaultRun::process(env, "pod-stdout", command("pod-stdout"))
            .record::<Pod>()
            .scenario(pods)
            .expect(printed_as_on_the_server())
            .seed(81);
        let faulty = fault.is_some();
        if let Some(fault) = fault {
            run = run.fault(fault);
        }
        let passed = run.run().await.unwrap();
        assert!(faulty == (passed.faults_hit > 0), "{passed:?}");
    }
}
