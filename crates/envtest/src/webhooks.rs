//! Webhook configurations and CRD conversion pointed at a local server,
//! for testing webhooks against the real API server (controller-runtime's
//! envtest `WebhookInstallOptions`): the manifests a project deploys (a
//! `ValidatingWebhookConfiguration` or `MutatingWebhookConfiguration`
//! whose webhooks call a Service, a CRD whose conversion does) are
//! rewritten to call `https://<local address><the Service's path>` with
//! the local server's CA, and created.

use std::net::SocketAddr;

use base64::Engine;
use kube_client::Api;
use kube_client::api::{ApiResource, DynamicObject, PostParams};
use kube_client::core::GroupVersionKind;
use serde_json::{Value, json};

use crate::{EnvtestError, TestEnv};

/// `client_config` (a webhook's `clientConfig`) calling `local` instead:
/// the Service's `path` (or the URL's) kept, the CA set.
fn point(client_config: &mut Value, local: SocketAddr, ca_bundle: &str) {
    let path = client_config
        .pointer("/service/path")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or_else(|| {
            let url = client_config.get("url")?.as_str()?;
            let rest = url.split_once("://")?.1;
            Some(rest.find('/').map_or("/", |i| &rest[i..]).to_owned())
        })
        .unwrap_or_else(|| "/".to_owned());
    *client_config = json!({
        "url": format!("https://{local}{path}"),
        "caBundle": ca_bundle,
    });
}

/// `manifest` with every webhook it declares calling `local`; an error
/// names a kind that declares none.
pub(crate) fn pointed_at(
    mut manifest: Value,
    local: SocketAddr,
    ca_pem: &str,
) -> Result<Value, EnvtestError> {
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let kind = manifest
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    match kind.as_str() {
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            let hooks = manifest
                .get_mut("webhooks")
                .and_then(Value::as_array_mut)
                .ok_or_else(|| EnvtestError::Client(format!("a {kind} without webhooks")))?;
            for hook in hooks {
                let config = hook
                    .as_object_mut()
                    .ok_or_else(|| {
                        EnvtestError::Client(format!("a webhook of a {kind} is not an object"))
                    })?
                    .entry("clientConfig")
                    .or_insert_with(|| json!({}));
                point(config, local, &ca_bundle);
            }
        }
        "CustomResourceDefinition" => {
            let conversion = manifest
                .pointer_mut("/spec/conversion")
                .filter(|c| c.get("strategy").and_then(Value::as_str) == Some("Webhook"))
                .ok_or_else(|| {
                    EnvtestError::Client(
                        "a CustomResourceDefinition without webhook conversion".to_owned(),
                    )
                })?;
            let config = conversion
                .as_object_mut()
                .and_then(|c| c.get_mut("webhook"))
                .and_then(Value::as_object_mut)
                .ok_or_else(|| EnvtestError::Client("a conversion without webhook".to_owned()))?
                .entry("clientConfig")
                .or_insert_with(|| json!({}));
            point(config, local, &ca_bundle);
        }
        other => {
            return Err(EnvtestError::Client(format!(
                "{other:?} declares no webhook: give ValidatingWebhookConfiguration, \
                 MutatingWebhookConfiguration or CustomResourceDefinition manifests"
            )));
        }
    }
    Ok(manifest)
}

impl TestEnv {
    /// Creates `manifests` (webhook configurations and CRDs with webhook
    /// conversion, as the project deploys them: JSON, or YAML read into a
    /// `serde_json::Value`) with every webhook calling the server at
    /// `local` instead, trusted through `ca_pem` (its CA, PEM). The API
    /// server picks a new configuration up within a second or so; a test
    /// should wait for its first call to be in force.
    pub async fn install_webhooks(
        &self,
        manifests: &[Value],
        local: SocketAddr,
        ca_pem: &str,
    ) -> Result<(), EnvtestError> {
        let client = self.client()?;
        for manifest in manifests {
            let manifest = pointed_at(manifest.clone(), local, ca_pem)?;
            let (group, version) = match manifest["apiVersion"].as_str().unwrap_or_default() {
                v if v.contains('/') => v.split_once('/').unwrap_or_default(),
                v => ("", v),
            };
            let kind = manifest["kind"].as_str().unwrap_or_default();
            let plural = format!("{}s", kind.to_ascii_lowercase());
            let resource = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, kind),
                &plural,
            );
            let object: DynamicObject = serde_json::from_value(manifest.clone())
                .map_err(|e| EnvtestError::failed(format!("reading a {kind} manifest"), e))?;
            Api::<DynamicObject>::all_with(client.clone(), &resource)
                .create(&PostParams::default(), &object)
                .await
                .map_err(|e| {
                    let what = format!("creating the {kind} {:?}", object.metadata.name);
                    EnvtestError::failed(what, e)
                })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_is_replaced_by_the_local_url_keeping_its_path() {
        let local: SocketAddr = "127.0.0.1:9443".parse().unwrap();
        let manifest = json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": "v"},
            "webhooks": [
                {"name": "a", "clientConfig": {"service": {"name": "s", "namespace": "n", "path": "/validate-a"}}},
                {"name": "b", "clientConfig": {"url": "https://example.com:443/validate-b?x=1"}},
                {"name": "c", "clientConfig": {"service": {"name": "s", "namespace": "n"}}},
            ],
        });
        let pointed = pointed_at(manifest, local, "CA").unwrap();
        let urls: Vec<&str> = pointed["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["clientConfig"]["url"].as_str().unwrap())
            .collect();
        assert_eq!(
            urls,
            [
                "https://127.0.0.1:9443/validate-a",
                "https://127.0.0.1:9443/validate-b?x=1",
                "https://127.0.0.1:9443/",
            ]
        );
        assert_eq!(pointed["webhooks"][0]["clientConfig"]["caBundle"], "Q0E=");
        assert!(
            pointed["webhooks"][0]["clientConfig"]
                .get("service")
                .is_none()
        );

        let crd = json!({"kind": "CustomResourceDefinition", "spec": {"conversion": {
            "strategy": "Webhook",
            "webhook": {"clientConfig": {"service": {"name": "s", "namespace": "n", "path": "/convert"}}},
        }}});
        let pointed = pointed_at(crd, local, "CA").unwrap();
        assert_eq!(
            pointed.pointer("/spec/conversion/webhook/clientConfig/url"),
            Some(&json!("https://127.0.0.1:9443/convert"))
        );
        let error = pointed_at(json!({"kind": "ConfigMap"}), local, "CA").unwrap_err();
        assert!(error.to_string().contains("declares no webhook"), "{error}");
    }
}
