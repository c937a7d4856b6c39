//! What the controllers' test files share.

#![allow(dead_code)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kinformer_envtest::TestEnv;
use kube_client::Client;

/// The shared test environment's client and a fresh namespace named after `prefix`.
pub async fn setup(prefix: &str) -> (Client, String) {
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
