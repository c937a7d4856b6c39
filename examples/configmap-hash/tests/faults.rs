//! configmap-hash (the binary) in fault runs: killed after each of its
//! writes and started again, with stale reads, missed states, 410s and
//! conflicts, every Deployment ends stamped with the hash of the
//! ConfigMaps it uses as they are at the end.

use std::time::Duration;

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};
use kinformer_controllers::kube::api::{Api, Patch, PatchParams, PostParams};
use kinformer_controllers::kube::{Client, ResourceExt};
use kinformer_envtest::fault_run::BoxError;
use kinformer_envtest::{Check, Fault, FaultRun, TestEnv};

mod common;
use common::{configmap, deployment};

const BIN: &str = env!("CARGO_BIN_EXE_configmap-hash");

/// Two Deployments on one ConfigMap that changes twice, a third on a
/// ConfigMap that arrives after it.
async fn scenario(client: Client, ns: String) -> Result<(), BoxError> {
    let (cms, deploys) = (
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        Api::<Deployment>::namespaced(client, &ns),
    );
    let pp = PostParams::default();
    cms.create(&pp, &configmap("shared", "1")).await?;
    deploys.create(&pp, &deployment("web", "shared")).await?;
    deploys.create(&pp, &deployment("api", "shared")).await?;
    deploys.create(&pp, &deployment("late", "later")).await?;
    for value in ["2", "3"] {
        let patch = Patch::Merge(serde_json::json!({"data": {"k": value}}));
        cms.patch("shared", &PatchParams::default(), &patch).await?;
    }
    cms.create(&pp, &configmap("later", "1")).await?;
    Ok(())
}

/// The hash the example computes (FNV-1a over each `namespace/name` key
/// and the JSON of that ConfigMap's data), from what the server holds.
fn expected_hash(d: &Deployment, cms: &[ConfigMap]) -> String {
    let ns = d.namespace().unwrap_or_default();
    let name = d
        .spec
        .template
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .as_ref()
        .unwrap()[0]
        .config_map
        .as_ref()
        .unwrap()
        .name
        .clone();
    let key = format!("{ns}/{name}");
    let data = cms
        .iter()
        .find(|cm| cm.name_any() == name)
        .map(|cm| serde_json::to_string(&cm.data).unwrap())
        .unwrap_or_default();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes().chain(data.into_bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

fn stamped() -> Check {
    Check::new(
        "every Deployment carries the hash of its ConfigMaps as they are",
        |s| {
            let cms = s.list::<ConfigMap>()?;
            let wrong: Vec<String> = s
                .list::<Deployment>()?
                .iter()
                .filter_map(|d| {
                    let want = expected_hash(d, &cms);
                    let have = d.spec.template.metadata.as_ref().and_then(|m| {
                        m.annotations
                            .as_ref()?
                            .get("kinformer.dev/config-hash")
                            .cloned()
                    });
                    (have.as_deref() != Some(want.as_str()))
                        .then(|| format!("{} has {have:?}, not {want}", d.name_any()))
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

fn run(env: &TestEnv) -> FaultRun<'_> {
    FaultRun::process(env, "cmhash", |_| tokio::process::Command::new(BIN))
        .record::<ConfigMap>()
        .record::<Deployment>()
        .scenario(scenario)
        .expect(stamped())
        // A seed whose draws hit: each fault's first chance (the first
        // watch of each resource, the first writes) comes out true.
        .seed(81)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_hash_survives_a_crash_after_each_write() {
    let env = TestEnv::shared().await.unwrap();
    let passed = run(env).crash_after_each_write().run().await.unwrap();
    assert!(passed.writes >= 3 && passed.crashes > 0, "{passed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_hash_survives_stale_reads_missed_states_410s_and_write_errors() {
    let env = TestEnv::shared().await.unwrap();
    for fault in [
        Fault::stale_reads(Duration::from_secs(1)),
        Fault::stale_reads_of(Duration::from_secs(1), &["configmaps"]),
        Fault::missed_states(),
        Fault::gone(0.5),
        Fault::conflicts(0.5),
        Fault::server_errors(0.3),
    ] {
        let passed = run(env).fault(fault.clone()).run().await.unwrap();
        assert!(passed.faults_hit > 0, "{fault:?} hit nothing: {passed:?}");
    }
}

/// Two replicas electing a leader on a Lease of the run's namespace
/// (client-go's timing: a 15 s lease): the leader killed after each of its
/// writes, the standby taking over in the middle of the reconciles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmap_hash_survives_a_leader_hand_over_after_each_write() {
    let env = TestEnv::shared().await.unwrap();
    let passed = FaultRun::process(env, "cmhash-ha", |target| {
        let mut command = tokio::process::Command::new(BIN);
        command.env("LEADER_ELECTION_NAMESPACE", &target.namespace);
        command
    })
    .replicas(2)
    .record::<ConfigMap>()
    .record::<Deployment>()
    .scenario(scenario)
    .expect(stamped())
    .crash_after_each_write()
    .settle_within(Duration::from_secs(60))
    .run()
    .await
    .unwrap();
    assert!(passed.writes >= 3 && passed.crashes > 0, "{passed:?}");
}
