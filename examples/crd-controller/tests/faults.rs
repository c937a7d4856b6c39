//! The CRD controller (the binary) in fault runs: killed after each of its
//! writes and started again, and with stale reads, missed states, 410s,
//! conflicts and server errors, every Greeting ends with its ConfigMap and
//! its status, and a deleted Greeting leaves nothing behind: no ConfigMap,
//! no finalizer.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, TestEnv};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Client, ResourceExt};

const BIN: &str = env!("CARGO_BIN_EXE_crd-controller");

fn greetings() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk("kinformer.dev", "v1", "Greeting"))
}

fn greeting(name: &str, message: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "kinformer.dev/v1", "kind": "Greeting",
        "metadata": {"name": name}, "spec": {"message": message}
    }))
    .unwrap()
}

/// Three Greetings (once the controller has installed the CRD), one
/// changed twice, one deleted.
async fn scenario(client: Client, ns: String) -> Result<(), BoxError> {
    let api = Api::<DynamicObject>::namespaced_with(client, &ns, &greetings());
    let pp = PostParams::default();
    // The controller installs the CRD at start: wait until it is served.
    let mut tries = 0;
    while let Err(e) = api.create(&pp, &greeting("hello", "hi")).await {
        tries += 1;
        if tries == 300 {
            return Err(format!("Greetings never served: {e}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.create(&pp, &greeting("bye", "so long")).await?;
    api.create(&pp, &greeting("stay", "here")).await?;
    for message in ["hi again", "hi at last"] {
        let patch = Patch::Merge(serde_json::json!({"spec": {"message": message}}));
        api.patch("hello", &PatchParams::default(), &patch).await?;
    }
    api.delete("bye", &DeleteParams::default()).await?;
    Ok(())
}

fn each_greeting_has_its_configmap_and_status() -> Check {
    Check::new(
        "each Greeting has its ConfigMap and status, no other ConfigMap",
        |s| {
            let cms = s.list::<ConfigMap>()?;
            let greetings = s.dynamic(&greetings())?;
            let mut wrong = Vec::new();
            for g in greetings {
                let name = g.name_any();
                let message = g.data["spec"]["message"].as_str().unwrap_or_default();
                let cm = cms
                    .iter()
                    .find(|c| c.name_any() == format!("{name}-greeting"));
                match cm.and_then(|c| c.data.as_ref()?.get("message")) {
                    Some(m) if m == message => {}
                    other => {
                        wrong.push(format!("{name}-greeting holds {other:?}, not {message:?}"))
                    }
                }
                let observed = g.data["status"]["observedGeneration"].as_i64();
                if observed != g.metadata.generation {
                    wrong.push(format!(
                        "{name}: status observed {observed:?}, generation {:?}",
                        g.metadata.generation
                    ));
                }
            }
            for cm in &cms {
                if !greetings
                    .iter()
                    .any(|g| format!("{}-greeting", g.name_any()) == cm.name_any())
                {
                    wrong.push(format!("ConfigMap {} has no Greeting", cm.name_any()));
                }
            }
            if wrong.is_empty() {
                Ok(())
            } else {
                Err(wrong.join("; "))
            }
        },
    )
}

fn run(env: &TestEnv) -> FaultRun<'_> {
    FaultRun::process(env, "greetings", |_| tokio::process::Command::new(BIN))
        .record_resource(greetings())
        .record::<ConfigMap>()
        .scenario(scenario)
        .expect(each_greeting_has_its_configmap_and_status())
        .expect(Check::no_finalizer_left())
        .expect(Check::no_duplicate_children::<ConfigMap>())
        // A seed whose draws hit: each fault's first chance (the first
        // watch of each resource, the first writes) comes out true.
        .seed(81)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_controller_survives_a_crash_after_each_write() {
    let env = TestEnv::shared().await.unwrap();
    let passed = run(env).crash_after_each_write().run().await.unwrap();
    assert!(passed.writes >= 8 && passed.crashes > 0, "{passed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crd_controller_survives_stale_reads_missed_states_410s_and_write_errors() {
    let env = TestEnv::shared().await.unwrap();
    for fault in [
        Fault::stale_reads(Duration::from_secs(1)),
        Fault::missed_states(),
        Fault::gone(0.5),
        Fault::conflicts(0.5),
        Fault::server_errors(0.3),
    ] {
        let passed = run(env).fault(fault.clone()).run().await.unwrap();
        assert!(passed.faults_hit > 0, "{fault:?} hit nothing: {passed:?}");
    }
}
