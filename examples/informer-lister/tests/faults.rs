//! The informer-lister example (the binary) in fault runs. It writes
//! nothing: its end state is what it printed. With stale reads, missed
//! states and 410s, the last line it printed about each ConfigMap agrees
//! with the server (there, or deleted). A ConfigMap made and deleted while
//! its watch was blind may never be printed: a relist shows the last state.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::Client;
use kinformer_controllers::kube::ResourceExt;
use kinformer_controllers::kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, TestEnv};

const BIN: &str = env!("CARGO_BIN_EXE_informer-lister");

/// Three ConfigMaps, one relabelled, one deleted.
async fn scenario(client: Client, ns: String) -> Result<(), BoxError> {
    let api = Api::<ConfigMap>::namespaced(client, &ns);
    for (name, app) in [("a", "web"), ("b", "web"), ("c", "db")] {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"app": app}},
        }))?;
        api.create(&PostParams::default(), &cm).await?;
    }
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {"app": "db"}}}));
    api.patch("a", &PatchParams::default(), &patch).await?;
    api.delete("b", &DeleteParams::default()).await?;
    Ok(())
}

fn printed_as_on_the_server() -> Check {
    Check::new(
        "the last line about each ConfigMap agrees with the server",
        |s| {
            let ns = s.namespace().to_owned();
            let there: Vec<String> = s
                .list::<ConfigMap>()?
                .iter()
                .map(ResourceExt::name_any)
                .collect();
            let mut wrong = Vec::new();
            for name in ["a", "b", "c"] {
                let key = format!(" {ns}/{name} (");
                let last = s.output().iter().rev().find(|l| l.contains(&key));
                let exists = there.iter().any(|n| n == name);
                match (last, exists) {
                    (Some(l), true) if !l.starts_with("deleted") => {}
                    (Some(l), false) if l.starts_with("deleted") => {}
                    (None, false) => {} // never seen: made and gone while blind
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
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_informer_lister_prints_the_last_state_under_stale_reads_missed_states_and_410s() {
    let env = TestEnv::shared().await.unwrap();
    for fault in [
        None,
        Some(Fault::stale_reads(Duration::from_secs(1))),
        Some(Fault::missed_states()),
        Some(Fault::gone(0.5)),
    ] {
        let mut run = FaultRun::process(env, "lister", |target| {
            let mut command = tokio::process::Command::new(BIN);
            command.arg(&target.namespace);
            command
        })
        .record::<ConfigMap>()
        .scenario(scenario)
        .expect(printed_as_on_the_server())
        // A seed whose draws hit: the first watch of each resource gets 410.
        .seed(81);
        let faulty = fault.is_some();
        if let Some(fault) = fault {
            run = run.fault(fault);
        }
        let passed = run.run().await.unwrap();
        assert!(faulty == (passed.faults_hit > 0), "{passed:?}");
    }
}
