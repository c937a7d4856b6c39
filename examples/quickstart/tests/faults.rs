//! The README's controller (the binary) in fault runs: killed after each of
//! its writes and started again, with stale reads, missed states, 410s and
//! conflicts, every labelled ConfigMap ends mirrored into a Secret it owns.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kinformer_controllers::kube::{Client, ResourceExt};
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, TestEnv};

const BIN: &str = env!("CARGO_BIN_EXE_quickstart");

/// Two labelled ConfigMaps, one changed twice, its Secret deleted on the
/// way, and one unlabelled ConfigMap.
async fn scenario(client: Client, ns: String) -> Result<(), BoxError> {
    let (cms, secrets) = (
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        Api::<Secret>::namespaced(client, &ns),
    );
    let cm = |name: &str, label: &str, message: &str| -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"mirror": label}},
            "data": {"message": message},
        }))
        .unwrap()
    };
    cms.create(&PostParams::default(), &cm("a", "yes", "one"))
        .await?;
    cms.create(&PostParams::default(), &cm("b", "yes", "one"))
        .await?;
    cms.create(&PostParams::default(), &cm("c", "no", "one"))
        .await?;
    for message in ["two", "three"] {
        let patch = Patch::Merge(serde_json::json!({"data": {"message": message}}));
        cms.patch("a", &PatchParams::default(), &patch).await?;
    }
    let _ = secrets.delete("a", &DeleteParams::default()).await; // if made yet
    Ok(())
}

/// Each labelled ConfigMap has a Secret of its name holding its data; no
/// other Secret.
fn mirrored() -> Check {
    Check::new(
        "every labelled ConfigMap is mirrored, and nothing else",
        |s| {
            let secrets = s.list::<Secret>()?;
            let mut wrong = Vec::new();
            let labelled: Vec<ConfigMap> = s
                .list::<ConfigMap>()?
                .into_iter()
                .filter(|cm| cm.labels().get("mirror").map(String::as_str) == Some("yes"))
                .collect();
            for cm in &labelled {
                let want = cm.data.iter().flatten();
                let want = want.map(|(k, v)| (k.clone(), ByteString(v.clone().into_bytes())));
                let want = Some(want.collect());
                match secrets.iter().find(|s| s.name_any() == cm.name_any()) {
                    Some(secret) if secret.data == want => {}
                    Some(secret) => {
                        wrong.push(format!("Secret {} holds {:?}", cm.name_any(), secret.data))
                    }
                    None => wrong.push(format!("no Secret {}", cm.name_any())),
                }
            }
            for secret in &secrets {
                if !labelled.iter().any(|cm| cm.name_any() == secret.name_any()) {
                    wrong.push(format!("Secret {} mirrors nothing", secret.name_any()));
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
    FaultRun::process(env, "quickstart", |_| tokio::process::Command::new(BIN))
        .record::<ConfigMap>()
        .record::<Secret>()
        .scenario(scenario)
        .expect(mirrored())
        .expect(Check::no_orphans::<Secret>())
        // A seed whose draws hit: each fault's first chance (the first
        // watch of each resource, the first writes) comes out true.
        .seed(81)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_survives_a_crash_after_each_write() {
    let env = TestEnv::shared().await.unwrap();
    let passed = run(env).crash_after_each_write().run().await.unwrap();
    assert!(passed.writes >= 2 && passed.crashes > 0, "{passed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quickstart_survives_stale_reads_missed_states_410s_and_write_errors() {
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
