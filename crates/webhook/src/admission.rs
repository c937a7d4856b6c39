//! Typed admission handlers: what the user writes, and the review around it.
//!
//! A validating handler answers a [`Verdict`] (allowed or denied with a
//! message, with warnings either way). A defaulting (mutating) handler gets
//! the object and returns it changed; the JSON patch the API server needs is
//! computed here, so the user never writes one.
//!
//! The patch applies to the object the API server holds, not to the typed
//! copy the handler saw: a type may not model every field, may write `null`
//! for an absent `Option`, or `[]` for an absent list. So the change is
//! found between the typed copies (before and after the handler), laid over
//! the object as it came (fields the type does not know stay as they are;
//! a list whose length changed is replaced whole, an equal-length one
//! merged item by item; a field the handler set to `null` is removed), and
//! the patch is the difference between the object as it came and that
//! (json-patch's `diff`).

use std::any::type_name;

use json_patch::Patch;
use kube_core::Resource;
use kube_core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube_core::dynamic::DynamicObject;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// The answer of a validating handler (and of a defaulting one that
/// refuses the object).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    denied: Option<String>,
    warnings: Vec<String>,
}

impl Verdict {
    /// The object is admitted.
    pub fn allow() -> Self {
        Self::default()
    }

    /// The object is refused; `message` is what the user's client shows.
    pub fn deny(message: impl Into<String>) -> Self {
        Self {
            denied: Some(message.into()),
            warnings: Vec::new(),
        }
    }

    /// Adds a warning the API server passes on to the client (kubectl
    /// prints it), whether the object is admitted or not. Control
    /// characters (which make the API server drop a warning) become
    /// spaces; the API server shortens warnings past 4 096 bytes in all.
    #[must_use]
    pub fn warn(mut self, warning: impl Into<String>) -> Self {
        let warning: String = warning
            .into()
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        self.warnings.push(warning);
        self
    }

    /// The denial's message, if refused.
    pub fn denied(&self) -> Option<&str> {
        self.denied.as_deref()
    }

    fn respond(self, mut response: AdmissionResponse) -> AdmissionResponse {
        if !self.warnings.is_empty() {
            response.warnings = Some(self.warnings);
        }
        match self.denied {
            // 403, as controller-runtime's denials: the client sees
            // "admission webhook ... denied the request: <message>".
            Some(message) => {
                let mut response = response.deny(message);
                response.result.code = 403;
                response.result.reason = "Forbidden".into();
                response
            }
            None => response,
        }
    }
}

/// How a review is read: as `K`, or (when it does not read as one) only
/// far enough to answer it.
pub(crate) enum Review<K: Resource> {
    Typed(Box<AdmissionRequest<K>>),
    /// The review is well formed but its objects are not `K`s: answered
    /// with a denial saying so.
    Unreadable(Box<AdmissionRequest<DynamicObject>>, String),
}

/// Why a request body is not an AdmissionReview at all.
#[derive(Debug)]
pub(crate) struct Malformed(pub(crate) String);

/// Where a review is read from: the body, or the body already parsed
/// (once, by a route that also needs the object as it came).
#[derive(Clone, Copy)]
pub(crate) enum Body<'a> {
    Bytes(&'a [u8]),
    Parsed(&'a Value),
}

impl Body<'_> {
    fn parse<T: DeserializeOwned>(self) -> Result<T, serde_json::Error> {
        match self {
            Body::Bytes(bytes) => serde_json::from_slice(bytes),
            Body::Parsed(value) => T::deserialize(value),
        }
    }
}

pub(crate) fn read<K>(body: Body<'_>) -> Result<Review<K>, Malformed>
where
    K: Resource + DeserializeOwned,
{
    let typed = body
        .parse::<AdmissionReview<K>>()
        .map_err(|e| e.to_string())
        .and_then(|review| {
            TryInto::<AdmissionRequest<K>>::try_into(review).map_err(|e| e.to_string())
        });
    match typed {
        Ok(request) => Ok(Review::Typed(Box::new(request))),
        Err(typed_error) => {
            let review = body
                .parse::<AdmissionReview<DynamicObject>>()
                .map_err(|e| Malformed(format!("not an AdmissionReview: {e}")))?;
            let request: AdmissionRequest<DynamicObject> = review
                .try_into()
                .map_err(|e| Malformed(format!("an AdmissionReview without a request: {e}")))?;
            let why = format!(
                "the webhook cannot read this {} as a {}: {typed_error}",
                request.kind.kind,
                type_name::<K>()
            );
            Ok(Review::Unreadable(Box::new(request), why))
        }
    }
}

/// The review answering with `verdict`, from `response` (made from the
/// request, before the handler took it).
pub(crate) fn answer(
    response: AdmissionResponse,
    verdict: Verdict,
) -> AdmissionReview<DynamicObject> {
    verdict.respond(response).into_review()
}

/// `raw` (the object as the API server sent it) with the change from
/// `before` to `after` (typed copies) laid over it: see the module docs.
fn overlay(raw: Option<&Value>, before: &Value, after: &Value) -> Option<Value> {
    if before == after {
        return raw.cloned();
    }
    match (before, after) {
        (_, Value::Null) => None,
        (Value::Object(b), Value::Object(a)) => {
            let mut out = match raw {
                Some(Value::Object(r)) => r.clone(),
                _ => Map::new(),
            };
            for (key, a_value) in a {
                let b_value = b.get(key).unwrap_or(&Value::Null);
                match overlay(out.get(key), b_value, a_value) {
                    Some(v) => out.insert(key.clone(), v),
                    None => out.remove(key),
                };
            }
            for key in b.keys().filter(|k| !a.contains_key(*k)) {
                out.remove(key);
            }
            Some(Value::Object(out))
        }
        (Value::Array(b), Value::Array(a)) if b.len() == a.len() => {
            let r = match raw {
                Some(Value::Array(r)) if r.len() == a.len() => Some(r),
                _ => None,
            };
            let items = a
                .iter()
                .zip(b)
                .enumerate()
                .map(|(i, (a, b))| overlay(r.map(|r| &r[i]), b, a).unwrap_or(Value::Null))
                .collect();
            Some(Value::Array(items))
        }
        _ => Some(after.clone()),
    }
}

/// The review answering a defaulting handler: `before` changed into
/// `after`, as a JSON patch to `raw`, the object as it came (none if
/// nothing changed).
pub(crate) fn defaulted<K: Serialize>(
    response: AdmissionResponse,
    raw: &Value,
    before: &K,
    after: &K,
) -> Result<AdmissionReview<DynamicObject>, String> {
    let to_value =
        |k: &K| serde_json::to_value(k).map_err(|e| format!("cannot write the object: {e}"));
    let target = overlay(Some(raw), &to_value(before)?, &to_value(after)?).unwrap_or(Value::Null);
    let patch: Patch = json_patch::diff(raw, &target);
    if patch.0.is_empty() {
        return Ok(response.into_review());
    }
    Ok(response
        .with_patch(patch)
        .map_err(|e| format!("cannot write the patch: {e}"))?
        .into_review())
}

/// The review answering an unreadable request with a denial.
pub(crate) fn unreadable(
    request: &AdmissionRequest<DynamicObject>,
    why: String,
) -> AdmissionReview<DynamicObject> {
    AdmissionResponse::from(request).deny(why).into_review()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    /// A kind as kube-derive users write them: an `Option` written as
    /// `null` when absent, a list defaulted to `[]`, fields it does not model.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Spec {
        replicas: Option<i32>,
        #[serde(default)]
        ports: Vec<Port>,
        #[serde(default)]
        hosts: Vec<String>,
    }

    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Port {
        port: i32,
    }

    /// The object after applying `patch` to `raw`, as the API server does.
    fn applied(raw: &Value, before: &Spec, after: &Spec) -> Value {
        let to_value = |s: &Spec| serde_json::to_value(s).unwrap();
        let target = overlay(Some(raw), &to_value(before), &to_value(after)).unwrap();
        let patch = json_patch::diff(raw, &target);
        let mut patched = raw.clone();
        json_patch::patch(&mut patched, &patch.0)
            .expect("the patch applies to the object as it came");
        patched
    }

    #[test]
    fn a_default_patches_the_object_as_it_came_not_the_typed_copy() {
        // No replicas, no ports, no hosts; a port field the type does not
        // model, and a field of its own.
        let raw = json!({"other": {"kept": true}});
        let before: Spec = serde_json::from_value(raw.clone()).unwrap();
        let mut after = before.clone();
        after.replicas = Some(1);
        after.ports.push(Port { port: 80 });
        let patched = applied(&raw, &before, &after);
        assert_eq!(
            patched,
            json!({"other": {"kept": true}, "replicas": 1, "ports": [{"port": 80}]})
        );

        // Fields the type does not model stay on their list item when the
        // list keeps its length; an `Option` set to `None` is removed.
        let raw = json!({"replicas": 3, "ports": [{"port": 80, "name": "http"}], "hosts": ["a"]});
        let before: Spec = serde_json::from_value(raw.clone()).unwrap();
        let mut after = before.clone();
        after.ports[0].port = 8080;
        after.replicas = None;
        after.hosts.push("b".into());
        let patched = applied(&raw, &before, &after);
        assert_eq!(
            patched,
            json!({"ports": [{"port": 8080, "name": "http"}], "hosts": ["a", "b"]})
        );

        // Nothing changed: no patch.
        let target = overlay(Some(&raw), &json!({"a": null}), &json!({"a": null}));
        assert!(json_patch::diff(&raw, &target.unwrap()).0.is_empty());
    }
}
