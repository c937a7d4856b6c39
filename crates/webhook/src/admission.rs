//! Typed admission handlers: what the user writes, and the review around it.
//!
//! A validating handler answers a [`Verdict`] (allowed or denied with a
//! message, with warnings either way). A defaulting (mutating) handler gets
//! the object and returns it changed; the JSON patch the API server needs is
//! computed here, as the difference between the two (json-patch's `diff`),
//! so the user never writes one.

use std::any::type_name;

use json_patch::Patch;
use kube_core::Resource;
use kube_core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube_core::dynamic::DynamicObject;
use serde::Serialize;
use serde::de::DeserializeOwned;

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
    /// prints it), whether the object is admitted or not.
    pub fn warn(mut self, warning: impl Into<String>) -> Self {
        self.warnings.push(warning.into());
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
            Some(message) => response.deny(message),
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

pub(crate) fn read<K>(body: &[u8]) -> Result<Review<K>, Malformed>
where
    K: Resource + DeserializeOwned,
{
    let typed = serde_json::from_slice::<AdmissionReview<K>>(body)
        .map_err(|e| e.to_string())
        .and_then(|review| {
            TryInto::<AdmissionRequest<K>>::try_into(review).map_err(|e| e.to_string())
        });
    match typed {
        Ok(request) => Ok(Review::Typed(Box::new(request))),
        Err(typed_error) => {
            let review = serde_json::from_slice::<AdmissionReview<DynamicObject>>(body)
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

/// The review answering a defaulting handler: `before` changed into
/// `after`, as a JSON patch (none if nothing changed).
pub(crate) fn defaulted<K: Serialize>(
    response: AdmissionResponse,
    before: &K,
    after: &K,
) -> Result<AdmissionReview<DynamicObject>, String> {
    let to_value =
        |k: &K| serde_json::to_value(k).map_err(|e| format!("cannot write the object: {e}"));
    let patch: Patch = json_patch::diff(&to_value(before)?, &to_value(after)?);
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
