//! [`ProtobufApi`]: kube-client's `Api` for reading, in protobuf.

use std::fmt::Debug;
use std::marker::PhantomData;

use futures::stream::BoxStream;
use kube_client::api::{GetParams, ListParams, WatchParams};
use kube_client::core::{ObjectList, Request, TypeMeta, WatchEvent};
use kube_client::{Client, Resource};
use serde::de::DeserializeOwned;

use crate::transport::{Call, accept, body_bytes, is_protobuf, send};
use crate::{Error, Kind, envelope, known};

/// Gets, lists and watches one built-in kind in protobuf: kube-client's
/// `Api<K>` for reading, with the same constructors, parameters, answers
/// and errors. `K` is a k8s-openapi type, or `PartialObjectMeta<K>` for
/// metadata only.
///
/// It asks for protobuf only: a server that cannot encode the kind answers
/// 406 Not Acceptable (kube-apiserver encodes every built-in kind). A
/// failed call is `Error::Kube(kube_client::Error::Api(status))`, as with
/// kube-client.
///
/// ```no_run
/// # async fn demo(client: kube_client::Client) -> Result<(), kinformer_protobuf::Error> {
/// use k8s_openapi::api::apps::v1::Deployment;
/// use kinformer_protobuf::ProtobufApi;
///
/// let deployments = ProtobufApi::<Deployment>::namespaced(client, "web")?;
/// if let Some(d) = deployments.get_opt("frontend").await? {
///     println!("{:?}", d.status);
/// }
/// # Ok(())
/// # }
/// ```
pub struct ProtobufApi<K> {
    client: Client,
    request: Request,
    kind: &'static Kind,
    drop_managed_fields: bool,
    _kind: PhantomData<fn() -> K>,
}

impl<K> Clone for ProtobufApi<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            request: self.request.clone(),
            kind: self.kind,
            drop_managed_fields: self.drop_managed_fields,
            _kind: PhantomData,
        }
    }
}

impl<K> Debug for ProtobufApi<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtobufApi")
            .field("url_path", &self.request.url_path)
            .field("kind", &self.kind.kind)
            .field("drop_managed_fields", &self.drop_managed_fields)
            .finish()
    }
}

impl<K> ProtobufApi<K>
where
    K: Resource + Clone + DeserializeOwned + 'static,
    K::DynamicType: Default,
{
    /// Objects in every namespace, or cluster-scoped ones. An error when
    /// `K`'s protobuf is not known (a custom resource, `DynamicObject`).
    pub fn all(client: Client) -> Result<Self, Error> {
        Self::all_with(client, &K::DynamicType::default())
    }

    /// Objects in `namespace`.
    pub fn namespaced(client: Client, namespace: &str) -> Result<Self, Error> {
        Self::namespaced_with(client, namespace, &K::DynamicType::default())
    }

    /// Objects in the client's default namespace.
    pub fn default_namespaced(client: Client) -> Result<Self, Error> {
        let namespace = client.default_namespace().to_owned();
        Self::namespaced(client, &namespace)
    }
}

impl<K> ProtobufApi<K>
where
    K: Resource + Clone + DeserializeOwned + 'static,
{
    /// Objects of the kind `dyntype` names in every namespace, or
    /// cluster-scoped ones.
    pub fn all_with(client: Client, dyntype: &K::DynamicType) -> Result<Self, Error> {
        Self::new(client, None, dyntype)
    }

    /// Objects of the kind `dyntype` names in `namespace`.
    pub fn namespaced_with(
        client: Client,
        namespace: &str,
        dyntype: &K::DynamicType,
    ) -> Result<Self, Error> {
        Self::new(client, Some(namespace), dyntype)
    }

    fn new(
        client: Client,
        namespace: Option<&str>,
        dyntype: &K::DynamicType,
    ) -> Result<Self, Error> {
        Ok(Self {
            kind: known::<K>(dyntype)?,
            request: Request::new(K::url_path(dyntype, namespace)),
            client,
            drop_managed_fields: false,
            _kind: PhantomData,
        })
    }

    /// Leaves `metadata.managedFields` out of every object (they are
    /// skipped in the bytes, never decoded): most readers never look at
    /// them, and they are often half an object's size.
    #[must_use]
    pub fn drop_managed_fields(mut self, drop: bool) -> Self {
        self.drop_managed_fields = drop;
        self
    }

    /// The object `name`.
    pub async fn get(&self, name: &str) -> Result<K, Error> {
        let gp = GetParams::default();
        let request = if K::metadata_api() {
            self.request.get_metadata(name, &gp)
        } else {
            self.request.get(name, &gp)
        }
        .map_err(kube_client::Error::BuildRequest)?;
        let body = self.body(request, Call::Get).await?;
        Ok(envelope::object(
            &envelope::unknown(&body)?,
            self.kind,
            self.drop_managed_fields,
        )?)
    }

    /// The object `name`, or `None` when there is none (a 404).
    pub async fn get_opt(&self, name: &str) -> Result<Option<K>, Error> {
        match self.get(name).await {
            Ok(object) => Ok(Some(object)),
            Err(Error::Kube(kube_client::Error::Api(status))) if status.code == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The objects `lp` selects (one page when it sets a limit). An item
    /// that does not decode fails the list, naming the item, as with
    /// kube-client; [`decode_list`](crate::decode_list) keeps the others.
    pub async fn list(&self, lp: &ListParams) -> Result<ObjectList<K>, Error> {
        let request = if K::metadata_api() {
            self.request.list_metadata(lp)
        } else {
            self.request.list(lp)
        }
        .map_err(kube_client::Error::BuildRequest)?;
        let body = self.body(request, Call::List).await?;
        let list = envelope::list::<K>(&body, self.kind, self.drop_managed_fields)?;
        let items = list
            .items
            .into_iter()
            .collect::<Result<Vec<K>, _>>()
            .map_err(Error::Undecodable)?;
        Ok(ObjectList {
            types: TypeMeta {
                api_version: self.kind.api_version.to_owned(),
                kind: format!("{}List", self.kind.kind),
            },
            metadata: list.metadata,
            items,
        })
    }

    /// Watches the objects `wp` selects from `version` (`"0"`: from any
    /// recent state). The stream ends when the server ends the watch
    /// (`wp.timeout`); an ERROR event is an `Err` of its `Status` (410
    /// Gone: list again); an object that does not decode is
    /// [`Error::Undecodable`], and the events after it still come; a frame
    /// that cannot be read (over [`MAX_FRAME`](crate::MAX_FRAME), a failed
    /// read) is the last item, its error.
    pub async fn watch(
        &self,
        wp: &WatchParams,
        version: &str,
    ) -> Result<BoxStream<'static, Result<WatchEvent<K>, Error>>, Error>
    where
        K: Send,
    {
        let mut request = if K::metadata_api() {
            self.request.watch_metadata(wp, version)
        } else {
            self.request.watch(wp, version)
        }
        .map_err(kube_client::Error::BuildRequest)?;
        // Servers since 1.37 gzip a watch one member per event, which the
        // client's decompression layer cannot follow past the first.
        request.headers_mut().insert(
            http::header::ACCEPT_ENCODING,
            http::HeaderValue::from_static("identity"),
        );
        let response = send(&self.client, request, &accept::<K>(Call::Watch, false)).await?;
        expect_protobuf(&response)?;
        Ok(crate::events(
            crate::body_reader(response),
            self.kind,
            self.drop_managed_fields,
            None,
        ))
    }

    async fn body(
        &self,
        request: http::Request<Vec<u8>>,
        call: Call,
    ) -> Result<bytes::Bytes, Error> {
        let response = send(&self.client, request, &accept::<K>(call, false)).await?;
        expect_protobuf(&response)?;
        body_bytes(response).await
    }
}

/// A success in another format than asked is the server's mistake, named.
fn expect_protobuf<B>(response: &http::Response<B>) -> Result<(), Error> {
    if is_protobuf(response) {
        return Ok(());
    }
    let got = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_else(|| "no Content-Type".into());
    Err(Error::decode(format!(
        "asked for protobuf, the server answered {got}"
    )))
}
