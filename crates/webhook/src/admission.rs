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
//! found between the typed copies (before and after the handler) and laid
//! over the object as it came; the patch is the difference between the
//! object as it came and that (json-patch's `diff`):
//! - fields the type does not know stay as they are; so does a field the
//!   object lacks that the handler left as the type read it (an absent
//!   list stays absent, not `[]`);
//! - objects are merged key by key; a list's items each with the item of
//!   the object it came from, found in this order: the item the type read
//!   as the same value (kept, moved, or left when others were added or
//!   removed), else the one with the same `name` (the key of most
//!   Kubernetes lists), else, when the list kept its length, the items
//!   left on both sides in order (changed in place);
//! - a value the object has nothing to merge with (absent or `null` there,
//!   of another shape, an item paired with none, a list the type reads at
//!   another length) is written whole, as the handler returned it, default
//!   fields included: a struct the handler fills in reads back as the
//!   handler's, and meets a schema that requires its fields;
//! - a field the handler set to `null` (an absent `Option`) is removed, and
//!   none is written within a value written whole: the API server does not
//!   prune a `null` that a patch puts into a custom resource, and its
//!   schema refuses it. A `null` the object has where the handler left it
//!   stays, in an item it moved too.
//!
//! The stored object so reads back as the handler's answer wherever the
//! type reads an absent field as its default (serde's `default`, `Option`).
//! Finding it takes time and memory in proportion to the object (its
//! values are numbered once, bottom up, so that equal ones compare at
//! once), however deep the change.

use std::any::type_name;
use std::collections::{HashMap, VecDeque};

use json_patch::Patch;
use kube_core::Resource;
use kube_core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube_core::dynamic::DynamicObject;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

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
            Body::Bytes(bytes) => crate::nesting::from_slice(bytes),
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

/// Numbers for the values nested in the typed copies, equal where the
/// values are: found once, bottom up, so that whether the handler changed
/// a value, or which item of a list an item is, is one comparison, not a
/// walk of the value (a change `d` levels down cost `d²`).
struct Numbered<'a> {
    numbers: HashMap<Shape<'a>, usize>,
    /// Each value's number, by its address in `before` or `after`.
    of: HashMap<*const Value, usize>,
}

/// A value, its members by their numbers.
#[derive(PartialEq, Eq, Hash)]
enum Shape<'a> {
    Null,
    Bool(bool),
    Number(&'a serde_json::Number),
    String(&'a str),
    Array(Vec<usize>),
    Object(Vec<(&'a str, usize)>),
}

impl<'a> Numbered<'a> {
    fn new(before: &'a Value, after: &'a Value) -> Self {
        let mut numbered = Self {
            numbers: HashMap::new(),
            of: HashMap::new(),
        };
        numbered.number(before);
        numbered.number(after);
        numbered
    }

    fn number(&mut self, value: &'a Value) -> usize {
        let shape = match value {
            Value::Null => Shape::Null,
            Value::Bool(b) => Shape::Bool(*b),
            Value::Number(n) => Shape::Number(n),
            Value::String(s) => Shape::String(s),
            Value::Array(items) => Shape::Array(items.iter().map(|v| self.number(v)).collect()),
            Value::Object(map) => Shape::Object(
                map.iter()
                    .map(|(k, v)| (k.as_str(), self.number(v)))
                    .collect(),
            ),
        };
        let next = self.numbers.len();
        let number = *self.numbers.entry(shape).or_insert(next);
        self.of.insert(value, number);
        number
    }

    /// The number of `value`, a value of `before` or `after`.
    fn of(&self, value: &Value) -> Option<usize> {
        self.of.get(&std::ptr::from_ref(value)).copied()
    }

    fn same(&self, b: &Value, a: &Value) -> bool {
        match (self.of(b), self.of(a)) {
            (Some(b), Some(a)) => b == a,
            // A member one side lacks, read as `null`: compared at once.
            _ => b == a,
        }
    }

    /// `raw` (the object as the API server sent it) with the change from
    /// `before` to `after` (typed copies) laid over it: see the module
    /// docs. `raw` is taken apart and built again, not copied.
    fn overlay(&self, raw: Option<Value>, before: &Value, after: &Value) -> Option<Value> {
        if self.same(before, after) {
            return raw;
        }
        match (raw, before, after) {
            (_, _, Value::Null) => None,
            (Some(Value::Object(mut r)), Value::Object(b), Value::Object(a)) => {
                for (key, a_value) in a {
                    let b_value = b.get(key).unwrap_or(&Value::Null);
                    if let Some(v) = self.overlay(r.remove(key), b_value, a_value) {
                        r.insert(key.clone(), v);
                    }
                }
                for key in b.keys().filter(|k| !a.contains_key(*k)) {
                    r.remove(key);
                }
                Some(Value::Object(r))
            }
            (Some(Value::Array(r)), Value::Array(b), Value::Array(a)) if r.len() == b.len() => {
                Some(Value::Array(self.items(r, b, a)))
            }
            // Nothing in the object to merge with (absent, `null`, of
            // another shape, a list the type reads at another length):
            // the handler's value, whole.
            _ => Some(without_nulls(after)),
        }
    }

    /// The items of a list: each item of `a` laid over the item of `r` it
    /// came from (see the module docs), or written whole.
    fn items(&self, r: Vec<Value>, b: &[Value], a: &[Value]) -> Vec<Value> {
        let mut from: Vec<Option<usize>> = vec![None; a.len()];
        let mut taken = vec![false; b.len()];
        // Each item of `a` takes the first item of `b` left with the same
        // number: first the same value, then the same `name`.
        let mut pair = |key: &dyn Fn(&Value) -> Option<usize>, from: &mut [Option<usize>]| {
            let mut left: HashMap<usize, VecDeque<usize>> = HashMap::new();
            for (i, item) in b.iter().enumerate().filter(|(i, _)| !taken[*i]) {
                if let Some(key) = key(item) {
                    left.entry(key).or_default().push_back(i);
                }
            }
            for (item, from) in a.iter().zip(from.iter_mut()) {
                if from.is_some() {
                    continue;
                }
                *from = key(item).and_then(|key| left.get_mut(&key)?.pop_front());
                if let Some(i) = *from {
                    taken[i] = true;
                }
            }
        };
        pair(&|item| self.of(item), &mut from);
        pair(
            &|item| match item.get("name") {
                Some(Value::Null) | None => None,
                Some(name) => self.of(name),
            },
            &mut from,
        );
        // A list that kept its length: the items left were changed in place.
        if a.len() == b.len() {
            let left = (0..b.len()).filter(|i| !taken[*i]);
            let unpaired = from.iter_mut().filter(|f| f.is_none());
            for (f, i) in unpaired.zip(left) {
                *f = Some(i);
            }
        }
        let mut r: Vec<Option<Value>> = r.into_iter().map(Some).collect();
        a.iter()
            .zip(from)
            .map(|(a, from)| match from {
                Some(i) => self.overlay(r[i].take(), &b[i], a).unwrap_or(Value::Null),
                None => without_nulls(a),
            })
            .collect()
    }
}

/// `value` as the handler returned it, but for the `null` members of its
/// objects (absent `Option`s): the object had nothing there, and the API
/// server does not prune a `null` a patch writes into a custom resource,
/// which its schema then refuses.
fn without_nulls(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), without_nulls(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(without_nulls).collect()),
        other => other.clone(),
    }
}

/// The JSON patch to `raw` (the object as it came) that makes it `after`,
/// the handler's answer to `before`: see the module docs.
fn patch_for<K: Serialize>(raw: &Value, before: &K, after: &K) -> Result<Patch, String> {
    let to_value =
        |k: &K| serde_json::to_value(k).map_err(|e| format!("cannot write the object: {e}"));
    let (before, after) = (to_value(before)?, to_value(after)?);
    let numbered = Numbered::new(&before, &after);
    let target = numbered
        .overlay(Some(raw.clone()), &before, &after)
        .unwrap_or(Value::Null);
    Ok(json_patch::diff(raw, &target))
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
    let patch = patch_for(raw, before, after)?;
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
    use serde_json::{Map, json};

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

    fn overlay(raw: Option<&Value>, before: &Value, after: &Value) -> Option<Value> {
        Numbered::new(before, after).overlay(raw.cloned(), before, after)
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

    /// A kind with a struct of its own in its spec, defaulted when absent,
    /// whose `port` the CRD's schema requires.
    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    struct Probed {
        #[serde(default)]
        spec: ProbedSpec,
    }

    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    struct ProbedSpec {
        replicas: Option<i32>,
        #[serde(default)]
        probe: Probe,
        extra: Option<Probe>,
        #[serde(default)]
        ports: Vec<NamedPort>,
        #[serde(default)]
        hosts: Vec<String>,
    }

    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    struct NamedPort {
        port: i32,
        name: Option<String>,
    }

    #[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
    struct Probe {
        path: String,
        port: u16,
        #[serde(rename = "timeoutSeconds")]
        timeout_seconds: Option<i32>,
    }

    /// `raw` with the patch answering a defaulting handler that does
    /// `default` applied (as the API server applies it), and the handler's
    /// answer.
    fn stored<K>(raw: &Value, default: impl FnOnce(&mut K)) -> (Value, K)
    where
        K: Serialize + DeserializeOwned + Clone,
    {
        let before: K = serde_json::from_value(raw.clone()).unwrap();
        let mut after = before.clone();
        default(&mut after);
        let patch = patch_for(raw, &before, &after).unwrap();
        let mut patched = raw.clone();
        json_patch::patch(&mut patched, &patch.0).expect("the patch applies to the object");
        (patched, after)
    }

    #[test]
    fn a_struct_the_handler_adds_is_stored_whole_with_its_default_fields() {
        // The spec has no probe: the type defaults one; the handler sets
        // its path. The port (0, as defaulted) goes with it, or the stored
        // object no longer reads as the type and the schema refuses it.
        let raw = json!({"spec": {"unmodelled": "kept"}});
        let (patched, after) = stored(&raw, |p: &mut Probed| p.spec.probe.path = "/x".into());
        assert_eq!(
            patched,
            json!({"spec": {"unmodelled": "kept", "probe": {"path": "/x", "port": 0}}})
        );
        assert_eq!(serde_json::from_value::<Probed>(patched).unwrap(), after);

        // No spec at all: the spec is added whole, as the handler returned
        // it, except for the `null`s of its absent `Option`s (a patch's
        // `null` is not pruned by the API server, and a CRD's schema
        // refuses it).
        let raw = json!({"metadata": {"name": "p"}});
        let (patched, after) = stored(&raw, |p: &mut Probed| {
            p.spec.extra = Some(Probe {
                path: "/y".into(),
                ..Probe::default()
            })
        });
        assert_eq!(
            patched,
            json!({"metadata": {"name": "p"}, "spec": {
                "probe": {"path": "", "port": 0},
                "extra": {"path": "/y", "port": 0},
                "ports": [], "hosts": [],
            }})
        );
        assert_eq!(serde_json::from_value::<Probed>(patched).unwrap(), after);

        // A struct the object has is merged: its field the type does not
        // model stays, its absent `Option` stays absent.
        let raw = json!({"spec": {"probe": {"path": "/a", "port": 1, "scheme": "HTTPS"}}});
        let (patched, _) = stored(&raw, |p: &mut Probed| p.spec.probe.path = "/b".into());
        assert_eq!(
            patched,
            json!({"spec": {"probe": {"path": "/b", "port": 1, "scheme": "HTTPS"}}})
        );
    }

    #[test]
    fn a_list_the_type_reads_at_another_length_is_stored_as_the_handler_returned_it() {
        // A set read from a list with a duplicate: the typed copies have
        // two items, the object three; the handler changes one. No item
        // can be matched to the object's, so the list is the handler's.
        let raw = json!({"hosts": ["a", "a", "b"]});
        let target = overlay(
            Some(&raw),
            &json!({"hosts": ["a", "b"]}),
            &json!({"hosts": ["a", "c"]}),
        );
        assert_eq!(target, Some(json!({"hosts": ["a", "c"]})));
    }

    /// A kind whose ports do not model `protocol` or `name`, and a list of
    /// anything.
    #[derive(Debug, Clone, Serialize, Deserialize)]
    struct Ports {
        #[serde(default)]
        ports: Vec<Port>,
        #[serde(default)]
        items: Vec<Value>,
    }

    fn dns_and_http() -> Value {
        json!({"ports": [
            {"port": 53, "protocol": "UDP", "name": "dns"},
            {"port": 80, "protocol": "TCP", "name": "http"},
        ]})
    }

    #[test]
    fn an_item_the_handler_appends_leaves_the_others_what_the_type_does_not_model() {
        let raw = json!({"ports": [{"port": 80, "protocol": "UDP", "name": "dns"}]});
        let (patched, _) = stored(&raw, |p: &mut Ports| p.ports.push(Port { port: 443 }));
        assert_eq!(
            patched,
            json!({"ports": [{"port": 80, "protocol": "UDP", "name": "dns"}, {"port": 443}]})
        );
        // Put first, the same.
        let (patched, _) = stored(&raw, |p: &mut Ports| p.ports.insert(0, Port { port: 443 }));
        assert_eq!(
            patched,
            json!({"ports": [{"port": 443}, {"port": 80, "protocol": "UDP", "name": "dns"}]})
        );
    }

    #[test]
    fn an_item_the_handler_removes_takes_only_its_own_fields_with_it() {
        let (patched, _) = stored(&dns_and_http(), |p: &mut Ports| {
            p.ports.remove(0);
        });
        assert_eq!(
            patched,
            json!({"ports": [{"port": 80, "protocol": "TCP", "name": "http"}]})
        );
    }

    #[test]
    fn items_the_handler_reorders_keep_their_own_fields() {
        let (patched, _) = stored(&dns_and_http(), |p: &mut Ports| {
            p.ports.sort_by_key(|port| std::cmp::Reverse(port.port));
        });
        assert_eq!(
            patched,
            json!({"ports": [
                {"port": 80, "protocol": "TCP", "name": "http"},
                {"port": 53, "protocol": "UDP", "name": "dns"},
            ]})
        );
    }

    #[test]
    fn an_item_changed_beside_one_removed_pairs_by_its_name() {
        // Neither the list's length nor the item's typed copy says which
        // item of the object it was: its `name` does.
        let raw = json!({"spec": {"ports": [
            {"port": 53, "name": "dns", "protocol": "UDP"},
            {"port": 80, "name": "http", "protocol": "TCP"},
        ]}});
        let (patched, _) = stored(&raw, |p: &mut Probed| {
            p.spec.ports.remove(0);
            p.spec.ports[0].port = 8080;
        });
        assert_eq!(
            patched,
            json!({"spec": {"ports": [{"port": 8080, "name": "http", "protocol": "TCP"}]}})
        );
    }

    #[test]
    fn a_null_the_object_has_stays_when_the_handler_changes_the_list_around_it() {
        let raw = json!({"items": [{"a": null, "b": 1}]});
        let (patched, _) = stored(&raw, |p: &mut Ports| p.items.push(json!({"c": 2})));
        assert_eq!(patched, json!({"items": [{"a": null, "b": 1}, {"c": 2}]}));
    }

    mod property {
        use super::*;
        use proptest::prelude::*;

        /// The object as the API server might send it: any field of
        /// [`Probed`] present or absent (or `null` where that reads), and
        /// fields the type does not model.
        fn raw_object() -> impl Strategy<Value = Value> {
            let probe = (
                "/[a-c]{0,2}",
                0u16..3,
                prop::option::of(prop::option::of(0i32..3)),
                prop::option::of(0i32..3),
            )
                .prop_map(|(path, port, timeout, unmodelled)| {
                    let mut probe = json!({"path": path, "port": port});
                    if let Some(timeout) = timeout {
                        probe["timeoutSeconds"] = json!(timeout);
                    }
                    if let Some(unmodelled) = unmodelled {
                        probe["unmodelled"] = json!(unmodelled);
                    }
                    probe
                });
            let port = (
                0i32..3,
                prop::option::of(prop::option::of("[a-c]{1,2}")),
                any::<bool>(),
            )
                .prop_map(|(port, name, unmodelled)| {
                    let mut item = json!({"port": port});
                    if let Some(name) = name {
                        item["name"] = json!(name);
                    }
                    if unmodelled {
                        item["protocol"] = json!("TCP");
                    }
                    item
                });
            let spec = (
                prop::option::of(prop::option::of(0i32..3)),
                prop::option::of(probe.clone()),
                prop::option::of(prop::option::of(probe)),
                prop::option::of(prop::collection::vec(port, 0..3)),
                prop::option::of(prop::collection::vec("[a-c]", 0..3)),
                prop::option::of(0i32..3),
            )
                .prop_map(|(replicas, probe, extra, ports, hosts, unmodelled)| {
                    let mut spec = Map::new();
                    let mut put = |key: &str, value: Option<Value>| {
                        if let Some(value) = value {
                            spec.insert(key.to_owned(), value);
                        }
                    };
                    put("replicas", replicas.map(|r| json!(r)));
                    put("probe", probe);
                    put("extra", extra.map(|e| json!(e)));
                    put("ports", ports.map(Value::Array));
                    put("hosts", hosts.map(|h| json!(h)));
                    put("unmodelled", unmodelled.map(|u| json!(u)));
                    Value::Object(spec)
                });
            (prop::option::of(spec), any::<bool>()).prop_map(|(spec, unmodelled)| {
                let mut raw = json!({"metadata": {"name": "p"}});
                if let Some(spec) = spec {
                    raw["spec"] = spec;
                }
                if unmodelled {
                    raw["status"] = json!({"ready": true});
                }
                raw
            })
        }

        fn probe() -> impl Strategy<Value = Probe> {
            ("/[a-c]{0,2}", 0u16..3, prop::option::of(0i32..3)).prop_map(
                |(path, port, timeout_seconds)| Probe {
                    path,
                    port,
                    timeout_seconds,
                },
            )
        }

        /// A spec the handler might return, and which of its fields it
        /// sets (the others it leaves as they were).
        fn answer() -> impl Strategy<Value = (ProbedSpec, u8)> {
            let port = (0i32..3, prop::option::of("[a-c]{1,2}"))
                .prop_map(|(port, name)| NamedPort { port, name });
            (
                prop::option::of(0i32..3),
                probe(),
                prop::option::of(probe()),
                prop::collection::vec(port, 0..3),
                prop::collection::vec("[a-c]", 0..3),
                any::<u8>(),
            )
                .prop_map(|(replicas, probe, extra, ports, hosts, sets)| {
                    let spec = ProbedSpec {
                        replicas,
                        probe,
                        extra,
                        ports,
                        hosts,
                    };
                    (spec, sets)
                })
        }

        /// `value` without the `null` members of its objects, at any depth.
        fn no_nulls(value: &Value) -> Value {
            match value {
                Value::Object(map) => Value::Object(
                    map.iter()
                        .filter(|(_, v)| !v.is_null())
                        .map(|(k, v)| (k.clone(), no_nulls(v)))
                        .collect(),
                ),
                Value::Array(items) => Value::Array(items.iter().map(no_nulls).collect()),
                other => other.clone(),
            }
        }

        /// Where the object as it came has no `key` (or `null`) and the
        /// handler set one, the stored object has the handler's value.
        fn added_whole(raw: &Value, before: &Value, after: &Value, patched: &Value, at: &str) {
            let (Some(after), Some(patched)) = (after.as_object(), patched.as_object()) else {
                return;
            };
            for (key, a) in after {
                let at = format!("{at}/{key}");
                let b = before.get(key).unwrap_or(&Value::Null);
                match raw.get(key) {
                    None | Some(Value::Null) if a != b && !a.is_null() => {
                        assert_eq!(patched.get(key), Some(&no_nulls(a)), "at {at}");
                    }
                    Some(r) if a != b => {
                        let p = patched.get(key).unwrap_or(&Value::Null);
                        added_whole(r, b, a, p, &at);
                    }
                    _ => {}
                }
            }
        }

        proptest! {
            // No failure file written into the source tree.
            #![proptest_config(ProptestConfig {
                cases: 512,
                failure_persistence: None,
                ..ProptestConfig::default()
            })]

            #[test]
            fn the_stored_object_reads_back_as_the_handlers_answer_keeping_what_the_type_does_not_model(
                raw in raw_object(),
                (answer, sets) in answer(),
                // The ports reversed; then none, the first removed, or one put first.
                (reverse, change) in (any::<bool>(), 0u8..3),
            ) {
                let before: Probed = serde_json::from_value(raw.clone()).unwrap();
                let mut after = before.clone();
                let set = |bit: u8| sets & (1 << bit) != 0;
                if set(0) { after.spec.replicas = answer.replicas; }
                if set(1) { after.spec.probe.path = answer.probe.path.clone(); }
                if set(2) { after.spec.probe.port = answer.probe.port; }
                if set(3) { after.spec.probe.timeout_seconds = answer.probe.timeout_seconds; }
                if set(4) { after.spec.extra = answer.extra.clone(); }
                if set(5) { after.spec.ports = answer.ports.clone(); }
                if set(6) {
                    for (item, new) in after.spec.ports.iter_mut().zip(&answer.ports) {
                        item.port = new.port;
                    }
                }
                if set(7) { after.spec.hosts = answer.hosts.clone(); }
                if reverse { after.spec.ports.reverse(); }
                match change {
                    1 if !after.spec.ports.is_empty() => { after.spec.ports.remove(0); }
                    2 => after.spec.ports.insert(0, NamedPort { port: 9, name: None }),
                    _ => {}
                }

                let patch = patch_for(&raw, &before, &after).unwrap();
                let mut patched = raw.clone();
                json_patch::patch(&mut patched, &patch.0).unwrap();

                let read: Probed = serde_json::from_value(patched.clone()).unwrap();
                prop_assert_eq!(&read, &after);
                added_whole(
                    &raw,
                    &serde_json::to_value(&before).unwrap(),
                    &serde_json::to_value(&after).unwrap(),
                    &patched,
                    "",
                );
                prop_assert_eq!(&patched["metadata"], &raw["metadata"]);
                prop_assert_eq!(&patched["status"], &raw["status"]);
                if let Some(unmodelled) = raw.get("spec").and_then(|s| s.get("unmodelled")) {
                    prop_assert_eq!(&patched["spec"]["unmodelled"], unmodelled);
                }
                if before == after {
                    prop_assert!(patch.0.is_empty(), "{:?}", patch);
                }
                // Ports moved, removed or added, none changed: each stored
                // one is one of the object's as it was, or a new one
                // (without the `protocol` the type does not model).
                if !set(5) && !set(6) {
                    let none = Vec::new();
                    let raw_ports = raw["spec"]["ports"].as_array().unwrap_or(&none);
                    for port in patched["spec"]["ports"].as_array().unwrap_or(&none) {
                        prop_assert!(
                            raw_ports.contains(port) || port.get("protocol").is_none(),
                            "{} is not one of {:?}", port, raw_ports
                        );
                    }
                }
            }
        }
    }
}
