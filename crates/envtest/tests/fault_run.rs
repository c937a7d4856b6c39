//! Fault runs end to end: a controller that writes its mark before its
//! child is caught by the crash sweep, one that writes its child first
//! survives it, and a failing run's report names the seed, the faults and
//! the requests they hit, the objects' history and the controller's output.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kinformer_envtest::{Check, Fault, FaultRun, Target, TestEnv};
use kube_client::ResourceExt;
use kube_client::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube_client::core::ObjectMeta;

const PARENT: &str = "fault-run.test/parent";
const MARK: &str = "fault-run.test/child-made";

/// A small controller without a cache: every 50 ms it lists the parents
/// and gives each unmarked one a child ConfigMap `<parent>-child` and the
/// mark. `child_first` says in which order: the mark first is the bug
/// (a crash between the two leaves a marked parent without a child, and
/// the mark says there is nothing left to do).
async fn child_maker(target: Target, child_first: bool) {
    let api: Api<ConfigMap> = Api::namespaced(target.client, &target.namespace);
    loop {
        let parents = api.list(&ListParams::default().labels(PARENT)).await;
        for parent in parents.map(|l| l.items).unwrap_or_default() {
            if parent.annotations().contains_key(MARK) {
                continue;
            }
            let mark =
                Patch::Merge(serde_json::json!({"metadata": {"annotations": {MARK: "true"}}}));
            let child = child_of(&parent);
            let made = if child_first {
                let created = api.create(&PostParams::default(), &child).await;
                let exists = matches!(&created, Err(kube_client::Error::Api(s)) if s.code == 409 && s.reason == "AlreadyExists");
                (created.is_ok() || exists)
                    && api
                        .patch(&parent.name_any(), &PatchParams::default(), &mark)
                        .await
                        .is_ok()
            } else {
                api.patch(&parent.name_any(), &PatchParams::default(), &mark)
                    .await
                    .is_ok()
                    && api.create(&PostParams::default(), &child).await.is_ok()
            };
            println!(
                "{}: {}",
                parent.name_any(),
                if made { "made" } else { "failed, will retry" }
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn child_of(parent: &ConfigMap) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{}-child", parent.name_any())),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: parent.name_any(),
                uid: parent.uid().unwrap_or_default(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

/// Two parents, made by the scenario.
async fn two_parents(
    client: kube_client::Client,
    namespace: String,
) -> Result<(), kinformer_envtest::fault_run::BoxError> {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    for name in ["a", "b"] {
        let parent = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(PARENT.to_owned(), "true".to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        api.create(&PostParams::default(), &parent).await?;
    }
    Ok(())
}

/// Each marked parent has its child.
fn every_parent_has_its_child() -> Check {
    Check::new("every parent has its child", |snapshot| {
        let all = snapshot.list::<ConfigMap>()?;
        let missing: Vec<String> = all
            .iter()
            .filter(|c| c.labels().contains_key(PARENT))
            .filter(|p| {
                !all.iter()
                    .any(|c| c.name_any() == format!("{}-child", p.name_any()))
            })
            .map(|p| p.name_any())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("no child for {}", missing.join(", ")))
        }
    })
}

fn run(env: &TestEnv, child_first: bool) -> FaultRun<'_> {
    FaultRun::task(env, "child-maker", move |target| {
        child_maker(target, child_first)
    })
    .record::<ConfigMap>()
    .scenario(two_parents)
    .expect(every_parent_has_its_child())
    .expect(Check::no_duplicate_children::<ConfigMap>())
    .seed(81)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crash_sweep_catches_a_mark_written_before_the_child_and_passes_the_child_first() {
    let env = TestEnv::shared().await.unwrap();
    let passed = run(env, true).crash_after_each_write().run().await.unwrap();
    // Two parents, each a child and a mark: four writes, four crash runs,
    // each of which crashed.
    assert_eq!(
        (passed.writes, passed.runs, passed.crashes),
        (4, 5, 4),
        "{passed:?}"
    );

    let failure = run(env, false)
        .crash_after_each_write()
        .settle_within(Duration::from_secs(5))
        .run()
        .await
        .unwrap_err();
    let report = failure.report();
    for wanted in [
        "the end state was not reached",
        "✗ every parent has its child: no child for a",
        "✓ no duplicate children",
        "seed: 81",
        "crash: the controller killed once the answer to write 1 (of 4 in the clean run)",
        "then the controller crashed (fault)",
        "PATCH /api/v1/namespaces/",
        "killed (the crash fault); started again ---",
    ] {
        assert!(
            report.contains(wanted),
            "no {wanted:?} in the report:\n{report}"
        );
    }
    assert!(
        report.contains("ADDED ConfigMap a")
            && report.contains("annotations={\"fault-run.test/child-made\": \"true\"}"),
        "the history shows the parent made and marked:\n{report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_errors_hit_the_writes_the_seed_picks_and_the_report_lists_them() {
    let env = TestEnv::shared().await.unwrap();
    // A controller that retries survives conflicts and server errors.
    for fault in [Fault::conflicts(0.5), Fault::server_errors(0.5)] {
        let passed = run(env, true).fault(fault).run().await.unwrap();
        assert!(passed.faults_hit > 0, "{passed:?}");
    }

    // A check that cannot be met shows the report: the writes answered
    // 409 without reaching the server, and the controller's retries.
    let failure = run(env, true)
        .fault(Fault::conflicts(0.5))
        .fault(Fault::stale_reads(Duration::from_millis(200)))
        .expect(Check::new("never", |_| {
            Err("a check that cannot be met".into())
        }))
        .settle_within(Duration::from_secs(2))
        .run()
        .await
        .unwrap_err();
    let report = failure.report();
    for wanted in [
        "409 answered to writes with p = 0.5",
        "stale reads: every watch answer held back 200ms",
        "answered 409 (fault)",
        "✗ never: a check that cannot be met",
        "✓ every parent has its child",
        "a task: its output goes to the test's own",
    ] {
        assert!(
            report.contains(wanted),
            "no {wanted:?} in the report:\n{report}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_fault_settings_are_refused_naming_the_setting() {
    let env = TestEnv::shared().await.unwrap();
    let err = run(env, true)
        .fault(Fault::gone(1.0))
        .run()
        .await
        .unwrap_err();
    assert!(
        err.report()
            .contains("the probability must be at least 0 and below 1"),
        "{err}"
    );
    let err = run(env, true)
        .fault(Fault::WriteErrors {
            status: 404,
            probability: 0.1,
        })
        .run()
        .await
        .unwrap_err();
    assert!(
        err.report()
            .contains("the status must be 409, 429, 500 or 503"),
        "{err}"
    );
}
