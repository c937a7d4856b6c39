//! Asking the server for protobuf: the `Accept` header of each call, and
//! sending a request with it so that a refusal is the server's `Status`.

use kube_client::client::Body;
use kube_client::{Client, Resource};

use crate::Error;
use crate::envelope::{self, MEDIA_TYPE};

/// What a request does, for its `Accept` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// One object.
    Get,
    /// A list (a `<Kind>List`).
    List,
    /// A watch (length-prefixed event frames).
    Watch,
}

/// The `Accept` header for `call` on `K`: protobuf, and JSON after it when
/// `json_fallback` (a server that cannot encode the kind in protobuf then
/// answers in JSON rather than 406). For `PartialObjectMeta<K>`, the
/// metadata-only `PartialObjectMetadata(List)`, as client-go's metadata
/// client asks.
pub fn accept<K: Resource>(call: Call, json_fallback: bool) -> String {
    let (protobuf, json) = if K::metadata_api() {
        let as_ = if call == Call::List {
            "PartialObjectMetadataList"
        } else {
            "PartialObjectMetadata"
        };
        let media = format!(";as={as_};g=meta.k8s.io;v=v1");
        (
            format!("{MEDIA_TYPE}{media}"),
            format!("application/json{media}"),
        )
    } else if call == Call::Watch {
        (
            format!("{MEDIA_TYPE};stream=watch"),
            "application/json".into(),
        )
    } else {
        (MEDIA_TYPE.to_owned(), "application/json".into())
    };
    if json_fallback {
        format!("{protobuf}, {json}")
    } else {
        protobuf
    }
}

/// Whether the server answered in protobuf.
pub fn is_protobuf<B>(response: &http::Response<B>) -> bool {
    response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with(MEDIA_TYPE))
}

/// Sends `request` with `accept` as its `Accept` header: the response if it
/// succeeded; if not, the server's `Status` (read from protobuf or JSON,
/// whichever it sent) as `kube_client::Error::Api`, as kube-client reports
/// it.
pub async fn send(
    client: &Client,
    request: http::Request<Vec<u8>>,
    accept: &str,
) -> Result<http::Response<Body>, Error> {
    let (mut parts, body) = request.into_parts();
    let accept = http::HeaderValue::from_str(accept)
        .map_err(|e| Error::Kube(kube_client::Error::HttpError(e.into())))?;
    parts.headers.insert(http::header::ACCEPT, accept);
    let response = client
        .send(http::Request::from_parts(parts, Body::from(body)))
        .await?;
    if response.status().is_success() {
        return Ok(response);
    }
    let code = response.status().as_u16();
    let protobuf = is_protobuf(&response);
    let body = body_bytes(response).await?;
    let status = if protobuf {
        decode_status(&body).ok()
    } else {
        serde_json::from_slice::<kube_client::core::Status>(&body).ok()
    };
    let status = match status {
        Some(status) if status.code != 0 => status,
        _ => kube_client::core::Status::failure(
            String::from_utf8_lossy(&body).trim(),
            "Failed to parse error data",
        )
        .with_code(code),
    };
    Err(Error::Kube(kube_client::Error::Api(Box::new(status))))
}

/// The whole body of `response`.
pub async fn body_bytes(response: http::Response<Body>) -> Result<bytes::Bytes, Error> {
    use http_body_util::BodyExt;
    response
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .map_err(|e| Error::Read(std::io::Error::other(e)))
}

/// Decodes a `meta/v1 Status` body in protobuf: what the server sends for
/// a failed call.
pub fn decode_status(body: &[u8]) -> Result<kube_client::core::Status, Error> {
    Ok(envelope::status(&envelope::unknown(body)?)?)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube_client::core::PartialObjectMeta;

    use super::*;

    #[test]
    fn each_call_accepts_its_protobuf_and_json_only_when_asked() {
        assert_eq!(
            accept::<Pod>(Call::Watch, true),
            "application/vnd.kubernetes.protobuf;stream=watch, application/json"
        );
        assert_eq!(
            accept::<Pod>(Call::List, false),
            "application/vnd.kubernetes.protobuf"
        );
        assert_eq!(
            accept::<PartialObjectMeta<Pod>>(Call::List, false),
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
        );
        assert_eq!(
            accept::<PartialObjectMeta<Pod>>(Call::Get, true),
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1, \
             application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"
        );
    }
}
