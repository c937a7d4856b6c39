//! Server-side apply of a controller's writes: an object it builds
//! ([`apply`]) and the status of one it reconciles ([`apply_status`]), each
//! forced, as a controller owns the fields it writes (the API server's
//! guidance for controllers). Apply merges by field ownership: with no
//! resourceVersion (`apply_status` sends none; an object built fresh for
//! `apply` has none) there is no conflict to retry.

use std::any::TypeId;
use std::fmt::Debug;

use kinformer_informer::is_cluster_scoped;
use kube_client::api::{Patch, PatchParams};
use kube_client::core::request::Error as RequestError;
use kube_client::core::{NamespaceResourceScope, Request};
use kube_client::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Writes `object` through server-side apply as `field_manager`, forced, to
/// the name (and, for a namespaced kind, the namespace) in its metadata,
/// and returns it as stored: created if absent; the fields it sets are
/// then owned by `field_manager`, and a field it set before and omits now
/// is removed. Build the object fresh with only the fields you mean to
/// own, as controller-runtime's `client.Apply` of an apply configuration
/// (an object read back carries a resourceVersion, which makes the write
/// conditional, a 409 Conflict once stale, and managedFields, which apply
/// refuses):
///
/// ```no_run
/// # async fn f(client: kinformer_controllers::kube::Client) -> Result<(), kinformer_controllers::kube::Error> {
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
///
/// let config = ConfigMap {
///     metadata: ObjectMeta {
///         name: Some("settings".into()),
///         namespace: Some("default".into()),
///         ..Default::default()
///     },
///     data: Some([("mode".to_owned(), "fast".to_owned())].into()),
///     ..Default::default()
/// };
/// let stored = kinformer_controllers::apply(&client, "my-controller", &config).await?;
/// # Ok(()) }
/// ```
///
/// An object without a name, a namespaced one without a namespace, a
/// cluster-scoped one with a namespace, or one of a kind that is neither
/// (a subresource's, such as `Scale`) is an error naming what is wrong
/// (`kube::Error::BuildRequest`), and nothing is sent. k8s-openapi's
/// required fields are always serialized (a Deployment's `spec.selector`
/// and `spec.template`, empty or not), so a typed object is applied whole,
/// as the controller means it to be; to set a few fields of an object
/// another writer owns, apply a `json!` value with kube's `Api::patch`, or
/// a `PartialObjectMeta<K>` for its labels and annotations (built with
/// `ObjectMeta::into_request_partial`). The controller needs
/// `create` and `patch` of the kind
/// ([`writes`](crate::ControllerBuilder::writes)): an apply that creates is
/// authorized as a create.
pub async fn apply<K>(
    client: &Client,
    field_manager: &str,
    object: &K,
) -> Result<K, kube_client::Error>
where
    K: Resource + Serialize + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    K::Scope: 'static,
{
    let (name, request) = target(object, "apply")?;
    let params = PatchParams::apply(field_manager).force();
    let patch = Patch::Apply(object);
    let mut request = match K::metadata_api() {
        true => request.patch_metadata(name, &params, &patch),
        false => request.patch(name, &params, &patch),
    }
    .map_err(kube_client::Error::BuildRequest)?;
    request.extensions_mut().insert("patch");
    client.request::<K>(request).await
}

/// The name `object` is written under and the request for its kind's
/// collection: in its namespace for a namespaced kind, none for a
/// cluster-scoped one. `Api::patch` builds the same request; it is built
/// here because an `Api` of a namespace needs the scope as a bound, and
/// these take both scopes. An object whose name or namespace does not fit
/// its kind is an error naming what is wrong (`doing` names the write).
fn target<'o, K>(object: &'o K, doing: &str) -> Result<(&'o str, Request), kube_client::Error>
where
    K: Resource,
    K::DynamicType: Default,
    K::Scope: 'static,
{
    let dt = K::DynamicType::default();
    let meta = object.meta();
    let refused = |what: String| {
        kube_client::Error::BuildRequest(RequestError::Validation(format!(
            "{doing} of {} {:?}: {what}",
            K::kind(&dt),
            meta.name.as_deref().unwrap_or_default()
        )))
    };
    let name = meta.name.as_deref().filter(|n| !n.is_empty());
    let name = name.ok_or_else(|| refused("metadata.name is not set".into()))?;
    let namespace = meta.namespace.as_deref().filter(|ns| !ns.is_empty());
    let namespaced = TypeId::of::<K::Scope>() == TypeId::of::<NamespaceResourceScope>();
    match (is_cluster_scoped::<K>(), namespaced, namespace) {
        (true, _, Some(namespace)) => Err(refused(format!(
            "metadata.namespace is {namespace:?}, and the kind is cluster-scoped"
        ))),
        (false, true, None) => Err(refused(
            "metadata.namespace is not set, and the kind is namespaced".into(),
        )),
        // A subresource's kind (Scale, Eviction) or a dynamic scope.
        (false, false, _) => Err(refused(
            "the kind is neither namespaced nor cluster-scoped: apply its parent".into(),
        )),
        _ => Ok((name, Request::new(K::url_path(&dt, namespace)))),
    }
}

/// Writes `status` as the whole status of `object` owned by
/// `field_manager`, through server-side apply of its `/status` subresource
/// (forced: a controller owns its status fields), to the name and
/// namespace in `object`'s metadata, and returns the object as stored.
/// Fields it set before and omits now are removed; fields other managers
/// own stay. No resourceVersion is sent, so there is no conflict to retry;
/// an object that does not exist is the server's 404 (a status apply does
/// not create). The name and namespace are checked as [`apply`] checks
/// them. An object from the cache is an `Arc<K>`: pass `&*object`. With a
/// name and no object, use kube's `Api::patch_status` with `Patch::Apply`.
/// The controller needs `patch` of the kind's status
/// ([`writes_status`](crate::ControllerBuilder::writes_status)).
///
/// ```no_run
/// # async fn f(client: kinformer_controllers::kube::Client, deployment: k8s_openapi::api::apps::v1::Deployment) -> Result<(), kinformer_controllers::kube::Error> {
/// use k8s_openapi::api::apps::v1::DeploymentStatus;
///
/// let status = DeploymentStatus { replicas: Some(2), ..Default::default() };
/// kinformer_controllers::apply_status(&client, "my-controller", &deployment, &status).await?;
/// # Ok(()) }
/// ```
pub async fn apply_status<K, S>(
    client: &Client,
    field_manager: &str,
    object: &K,
    status: &S,
) -> Result<K, kube_client::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    K::Scope: 'static,
    S: Serialize,
{
    let (name, request) = target(object, "status apply")?;
    let dt = K::DynamicType::default();
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&dt),
        "kind": K::kind(&dt),
        "status": status,
    });
    let params = PatchParams::apply(field_manager).force();
    let mut request = request
        .patch_subresource("status", name, &params, &Patch::Apply(&patch))
        .map_err(kube_client::Error::BuildRequest)?;
    request.extensions_mut().insert("patch_status");
    client.request::<K>(request).await
}
