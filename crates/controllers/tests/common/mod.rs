//! What the controllers' test files share.

#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::{TestEnv, TestNamespace};
use kube_client::Client;

/// The shared test environment's client and a fresh namespace named after `prefix`.
pub async fn setup(prefix: &str) -> (Client, TestNamespace) {
    let env = TestEnv::shared().await.unwrap();
    let ns = env.create_namespace(prefix).await.unwrap();
    (env.client().unwrap(), ns)
}

/// Waits (up to 30 s) until `check` is true.
pub async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A ConfigMap `name` with `data.v = "0"`.
pub fn config_map(name: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"v": "0"}}))
        .unwrap()
}

/// GETs `path` on `addr`: the whole HTTP answer.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// Whether RBAC lets `user` do `verb` on `resource` of API group `group`
/// in `ns`, as the API server's authorizer says now.
pub async fn may(
    admin: &Client,
    ns: &str,
    user: &str,
    (group, resource): (&str, &str),
    verb: &str,
) -> bool {
    let attributes = serde_json::json!({
        "namespace": ns, "verb": verb, "group": group, "resource": resource});
    allowed(admin, user, attributes).await
}

/// Whether RBAC lets `user` do what `attributes` (a SubjectAccessReview's
/// `resourceAttributes`) say, as the API server's authorizer says now.
pub async fn allowed(admin: &Client, user: &str, attributes: serde_json::Value) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    use kube_client::api::{Api, PostParams};
    let review: SubjectAccessReview = serde_json::from_value(serde_json::json!({
        "spec": {"user": user, "resourceAttributes": attributes}
    }))
    .unwrap();
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

/// A client acting as `user` (the admin, impersonating), whom RBAC lets do
/// only `verbs` on `resource` of API group `group` in `ns` (a Role and a
/// binding named `name`), once the authorizer knows it.
pub async fn client_allowed_only(
    admin: &Client,
    ns: &str,
    (name, user): (&str, &str),
    (group, resource): (&str, &str),
    verbs: &[&str],
) -> Client {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use kube_client::api::{Api, PostParams};
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [group], "resources": [resource], "verbs": verbs}]
    }))
    .unwrap();
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    eventually("the binding to reach the authorizer", async || {
        may(admin, ns, user, (group, resource), verbs[0]).await
    })
    .await;
    let mut config = TestEnv::shared().await.unwrap().config();
    config.auth_info.impersonate = Some(user.to_owned());
    Client::try_from(config).unwrap()
}

/// A client acting with `kubeconfig`.
pub async fn client_from(kubeconfig: &std::path::Path) -> Client {
    use kube_client::config::{KubeConfigOptions, Kubeconfig};
    let kubeconfig = Kubeconfig::read_from(kubeconfig).unwrap();
    let config =
        kube_client::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
    Client::try_from(config).unwrap()
}
