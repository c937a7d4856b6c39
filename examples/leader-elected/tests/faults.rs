//! The leader-elected example (the binary), two replicas, in fault runs.
//! It writes nothing but its Lease: its end state is what it printed. With
//! stale reads, missed states and 410s, every ConfigMap there at the end
//! was reconciled by a replica (whichever led).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_controllers::kube::api::{Api, DeleteParams, PostParams};
use kinformer_controllers::kube::{Client, ResourceExt};
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, TestEnv};

const BIN: &str = env!("CARGO_BIN_EXE_leader-elected");

/// Three ConfigMaps, one deleted.
async fn scenario(client: Client, ns: String) -> Result<(), BoxError> {
    let api = Api::<ConfigMap>::namespaced(client, &ns);
    for name in ["a", "b", "c"] {
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
        api.create(&PostParams::default(), &cm).await?;
    }
    api.delete("b", &DeleteParams::default()).await?;
    Ok(())
}

fn every_configmap_reconciled() -> Check {
    Check::new("every ConfigMap there was reconciled by a replica", |s| {
        let missing: Vec<String> = s
            .list::<ConfigMap>()?
            .iter()
            .map(ResourceExt::name_any)
            .filter(|name| {
                !s.output()
                    .iter()
                    .any(|l| l.ends_with(&format!(" reconciled {name}")))
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("never reconciled: {}", missing.join(", ")))
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_reconcile_every_configmap_under_stale_reads_missed_states_and_410s() {
    let env = TestEnv::shared().await.unwrap();
    for fault in [
        Fault::stale_reads(Duration::from_secs(1)),
        Fault::missed_states(),
        Fault::gone(0.5),
    ] {
        let passed = FaultRun::process(env, "elected", |target| {
            let mut command = tokio::process::Command::new(BIN);
            let identity = format!("replica-{}", target.replica);
            command.args([target.namespace.as_str(), identity.as_str(), "127.0.0.1:0"]);
            command
        })
        .replicas(2)
        .record::<ConfigMap>()
        .scenario(scenario)
        .expect(every_configmap_reconciled())
        // A seed whose draws hit: the first watch of each resource gets 410.
        .seed(81)
        .fault(fault.clone())
        .run()
        .await
        .unwrap();
        assert!(passed.faults_hit > 0, "{fault:?} hit nothing: {passed:?}");
    }
}
