//! Status writes through server-side apply.

use std::fmt::Debug;

use kube_client::Resource;
use kube_client::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `status` as the whole status owned by `field_manager`, through
/// server-side apply of the `/status` subresource (forced: a controller
/// owns its status fields). Fields it set before and omits now are removed;
/// fields other managers own stay. No resourceVersion is sent: apply merges
/// by field ownership, so there is no conflict to retry.
pub async fn apply_status<K, S>(
    api: &Api<K>,
    name: &str,
    field_manager: &str,
    status: &S,
) -> Result<K, kube_client::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    S: Serialize,
{
    let dt = K::DynamicType::default();
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&dt),
        "kind": K::kind(&dt),
        "status": status,
    });
    let params = PatchParams::apply(field_manager).force();
    api.patch_status(name, &params, &Patch::Apply(&patch)).await
}
