//! CRD conversion, hub and spoke (controller-runtime's model): the user
//! writes, for every version but one, a conversion to and from that one
//! version, the hub; any version converts to any other through it. The
//! webhook converts a whole ConversionReview (the API server sends lists
//! too) in order; one object that does not convert fails the review with a
//! message naming it, as the API server wants (no partial answers).
//!
//! Each converted object keeps what the API server checks: its metadata as
//! the typed round trip of `ObjectMeta` gives it, `apiVersion` set to the
//! desired version and `kind` to the object's own, whatever the types
//! serialize.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube_core::Resource;
use kube_core::conversion::{ConversionRequest, ConversionResponse, ConversionReview};
use kube_core::response::Status;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

type ToHub<H> = Arc<dyn Fn(Value) -> Result<H, String> + Send + Sync>;
type FromHub<H> = Arc<dyn Fn(H) -> Result<Value, String> + Send + Sync>;

/// The conversions of one custom resource, through its hub version `H`.
pub struct Conversion<H> {
    kind: String,
    hub: String,
    /// By apiVersion (`group/version`), the hub's own included.
    versions: BTreeMap<String, (ToHub<H>, FromHub<H>)>,
}

impl<H> std::fmt::Debug for Conversion<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversion")
            .field("kind", &self.kind)
            .field("hub", &self.hub)
            .field("versions", &self.versions.keys().collect::<Vec<_>>())
            .finish()
    }
}

fn read<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_json::from_value(value).map_err(|e| e.to_string())
}

fn write<T: Serialize>(object: &T) -> Result<Value, String> {
    serde_json::to_value(object).map_err(|e| e.to_string())
}

impl<H> Conversion<H>
where
    H: Resource<DynamicType = ()> + Serialize + DeserializeOwned + Send + Sync + 'static,
{
    /// Conversions through `H`, the hub version (often the storage
    /// version). Add the other versions with [`spoke`](Self::spoke).
    pub fn hub() -> Self {
        let hub = H::api_version(&()).into_owned();
        let to_hub: ToHub<H> = Arc::new(read::<H>);
        let from_hub: FromHub<H> = Arc::new(|h: H| write(&h));
        Self {
            kind: H::kind(&()).into_owned(),
            versions: BTreeMap::from([(hub.clone(), (to_hub, from_hub))]),
            hub,
        }
    }

    /// Version `S` (another version of the same kind), with its conversion
    /// to the hub and from it. An `Err` is the reason an object does not
    /// convert; the API server shows it to the client.
    #[must_use]
    pub fn spoke<S>(
        mut self,
        to_hub: impl Fn(S) -> Result<H, String> + Send + Sync + 'static,
        from_hub: impl Fn(H) -> Result<S, String> + Send + Sync + 'static,
    ) -> Self
    where
        S: Resource<DynamicType = ()> + Serialize + DeserializeOwned + 'static,
    {
        let to: ToHub<H> = Arc::new(move |value| to_hub(read::<S>(value)?));
        let from: FromHub<H> = Arc::new(move |hub| write(&from_hub(hub)?));
        self.versions
            .insert(S::api_version(&()).into_owned(), (to, from));
        self
    }

    fn known(&self) -> String {
        self.versions
            .keys()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `object` in `desired`.
    fn convert(&self, object: Value, desired: &str) -> Result<Value, String> {
        let from = object
            .get("apiVersion")
            .and_then(Value::as_str)
            .ok_or("it has no apiVersion")?
            .to_owned();
        let kind = object.get("kind").cloned();
        if from == desired {
            return Ok(object);
        }
        let unknown = |version: &str| {
            format!(
                "this webhook converts {} in {}; {version} is not one of them",
                self.kind,
                self.known()
            )
        };
        let (to_hub, _) = self.versions.get(&from).ok_or_else(|| unknown(&from))?;
        let (_, from_hub) = self.versions.get(desired).ok_or_else(|| unknown(desired))?;
        let mut converted = from_hub(to_hub(object)?)?;
        let fields = converted
            .as_object_mut()
            .ok_or("the conversion did not give an object")?;
        fields.insert("apiVersion".into(), Value::String(desired.to_owned()));
        if let Some(kind) = kind {
            fields.insert("kind".into(), kind);
        }
        Ok(converted)
    }

    /// The answer to `request`: every object converted, or a failure
    /// naming the first that is not.
    pub(crate) fn review(&self, mut request: ConversionRequest) -> ConversionReview {
        let desired = request.desired_api_version.clone();
        let objects = std::mem::take(&mut request.objects);
        let response = ConversionResponse::for_request(request);
        let mut converted = Vec::with_capacity(objects.len());
        for object in objects {
            let name = |o: &Value| {
                let meta = &o["metadata"];
                match (meta["namespace"].as_str(), meta["name"].as_str()) {
                    (Some(ns), Some(name)) => format!("{ns}/{name}"),
                    (None, Some(name)) => name.to_owned(),
                    _ => "an object without a name".to_owned(),
                }
            };
            let named = name(&object);
            match self.convert(object, &desired) {
                Ok(object) => converted.push(object),
                Err(why) => {
                    let message = format!("converting {} {named} to {desired}: {why}", self.kind);
                    return response
                        .failure(Status::failure(&message, "ConversionFailed"))
                        .into_review();
                }
            }
        }
        response.success(converted).into_review()
    }
}

/// The answer to a review whose conversion panicked: a failure naming it.
pub(crate) fn panicked(response: ConversionResponse, message: &str) -> ConversionReview {
    let message = format!("the conversion panicked: {message}");
    response
        .failure(Status::failure(&message, "ConversionFailed"))
        .into_review()
}
