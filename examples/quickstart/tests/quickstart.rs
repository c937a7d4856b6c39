//! The README's controller against a real kube-apiserver, as a
//! ServiceAccount bound to the rules it prints; and the README shows its
//! code as it is.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kinformer_controllers::kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kinformer_envtest::{TestEnv, rbac};

const BIN: &str = env!("CARGO_BIN_EXE_quickstart");

/// Waits (up to 30 s) until the Secret `name` holds `message`; its uid.
/// Failing, names the refusals in the controller's `log`.
async fn mirrored(secrets: &Api<Secret>, log: &rbac::Log, name: &str, message: &str) -> String {
    let want = BTreeMap::from([("message".to_owned(), ByteString(message.into()))]);
    for _ in 0..300 {
        if let Some(s) = secrets.get_opt(name).await.unwrap()
            && s.data.as_ref() == Some(&want)
        {
            return s.metadata.uid.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refused: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("forbidden"))
        .collect();
    panic!("Secret {name} never held {message:?}; refused: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labelled_configmap_is_mirrored_into_a_secret_it_owns() {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace("quickstart").await.unwrap();
    let program = tokio::process::Command::new(BIN);
    let print = ["--print-rbac", ns.as_str()];
    let (mut controller, log) =
        rbac::start_as_printed(env, program, &print, "quickstart", &ns, None)
            .await
            .unwrap();
    let client = env.client().unwrap();
    let (configmaps, secrets) = (
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
    let pp = PostParams::default();
    // Queued first, so reconciled before hello's later changes are.
    configmaps
        .create(&pp, &cm("quiet", "no", "shh"))
        .await
        .unwrap();
    configmaps
        .create(&pp, &cm("hello", "yes", "hi"))
        .await
        .unwrap();
    let first = mirrored(&secrets, &log, "hello", "hi").await;
    let owner = secrets
        .get("hello")
        .await
        .unwrap()
        .metadata
        .owner_references
        .unwrap();
    assert_eq!(
        (owner[0].kind.as_str(), owner[0].controller),
        ("ConfigMap", Some(true))
    );

    // A change follows, a key dropped goes too; a deleted Secret comes back.
    let patch = serde_json::json!({"data": {"extra": "x"}});
    configmaps
        .patch("hello", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    let mut added = false;
    for _ in 0..300 {
        let secret = secrets.get("hello").await.unwrap();
        if secret.data.is_some_and(|d| d.contains_key("extra")) {
            added = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        added,
        "the key added to the ConfigMap never reached the Secret"
    );
    let patch = serde_json::json!({"data": {"message": "hello again", "extra": null}});
    configmaps
        .patch("hello", &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
    mirrored(&secrets, &log, "hello", "hello again").await;
    secrets
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    let again = mirrored(&secrets, &log, "hello", "hello again").await;
    assert_ne!(first, again);
    // A Secret there before its ConfigMap is adopted: an ownerReference
    // added to an existing object, which the server lets only those who
    // may delete it add (OwnerReferencesPermissionEnforcement).
    let orphan: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "taken"}, "data": {"message": "b2xk"},
    }))
    .unwrap();
    let orphan = secrets.create(&pp, &orphan).await.unwrap();
    configmaps
        .create(&pp, &cm("taken", "yes", "mine"))
        .await
        .unwrap();
    assert_eq!(
        Some(mirrored(&secrets, &log, "taken", "mine").await),
        orphan.metadata.uid,
        "adopted, not replaced"
    );
    let owner = secrets
        .get("taken")
        .await
        .unwrap()
        .metadata
        .owner_references;
    assert_eq!(owner.unwrap()[0].kind, "ConfigMap");
    // It logs what it did; a ConfigMap not labelled mirror=yes is left alone.
    log.wait_for(Duration::from_secs(30), |l| {
        l.contains(&format!("mirrored {ns}/hello"))
    })
    .await
    .unwrap();
    assert!(secrets.get_opt("quiet").await.unwrap().is_none());
    controller.kill().await.unwrap();
    let refused: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("forbidden"))
        .collect();
    assert!(
        refused.is_empty(),
        "refused under its own rules: {refused:?}"
    );
}

#[test]
fn the_readme_shows_this_code() {
    let readme = include_str!("../../../README.md");
    let main = include_str!("../src/main.rs");
    // From the first `use` on: the module docs are the README's prose.
    let code = &main[main.find("use ").unwrap()..];
    assert!(
        readme.contains(code),
        "README.md does not show examples/quickstart/src/main.rs as it is"
    );
}
