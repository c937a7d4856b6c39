//! Objects the example's test files share.

#![allow(dead_code)]

use k8s_openapi::api::{apps::v1::Deployment, core::v1::ConfigMap};

/// A Deployment `name` whose pods take env from and mount ConfigMap `configmap`.
pub fn deployment(name: &str, configmap: &str) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "c", "image": "x", "envFrom": [{"configMapRef": {"name": configmap}}]}],
                    "volumes": [{"name": "v", "configMap": {"name": configmap}}]
                }
            }
        }
    }))
    .unwrap()
}

/// A ConfigMap `name` holding `k: value`.
pub fn configmap(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "data": {"k": value}}))
        .unwrap()
}
