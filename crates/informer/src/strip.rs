//! Dropping `metadata.managedFields` from JSON before it is decoded.
//!
//! Most controllers never read managedFields, yet decoding them is a large
//! share of the cost of a list or watch. [`strip_managed_fields_json`] removes
//! exactly what the [`strip_managed_fields`](crate::strip_managed_fields)
//! transform would: the `managedFields` member of the `metadata` of the
//! Kubernetes object itself (the object of a watch event, each item of a
//! list), and nothing nested deeper, such as a Deployment's
//! `spec.template.metadata.managedFields` or a custom resource's own
//! `spec.x.metadata.managedFields`.
//!
//! The input is parsed once, with JSON's grammar checked. The bytes removed
//! are checked with serde_json itself (strings, escapes, numbers, nesting
//! depth), and the bytes kept are checked by the decoder that reads the
//! output, so invalid JSON never comes out valid: when the input is not
//! well-formed the output is the input itself, for the decoder to report.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// What a JSON document passed to [`strip_managed_fields_json`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonShape {
    /// One Kubernetes object: its own `metadata.managedFields` goes.
    Object,
    /// A list response (`{"items": [..], ..}`): the `metadata.managedFields`
    /// of each item goes.
    List,
    /// One watch event (`{"type": .., "object": {..}}`): the
    /// `metadata.managedFields` of its object goes.
    WatchEvent,
}

/// The JSON without the `metadata.managedFields` of the object(s) that
/// `shape` says it holds; borrowed unchanged when there is none.
///
/// Decoding the output gives exactly what decoding the input gives, less
/// those members (keys spelled with escapes included). Input that is not
/// well-formed JSON, or nests deeper than
/// [`MAX_JSON_NESTING`](crate::MAX_JSON_NESTING), is returned as it is, so
/// that decoding it fails with serde's own error. A document nested deeper
/// than a thread's stack takes is stripped on a stack sized for it.
///
/// ```
/// use kinformer_informer::{JsonShape, strip_managed_fields_json};
/// let event = br#"{"type":"ADDED","object":{"metadata":{"name":"web","managedFields":[{"manager":"kubectl"}]},
///   "spec":{"template":{"metadata":{"managedFields":"kept"}}}}}"#;
/// let stripped = strip_managed_fields_json(event, JsonShape::WatchEvent);
/// let v: serde_json::Value = serde_json::from_slice(&stripped).unwrap();
/// assert_eq!(v["object"]["metadata"], serde_json::json!({"name": "web"}));
/// assert_eq!(v["object"]["spec"]["template"]["metadata"]["managedFields"], "kept");
/// ```
pub fn strip_managed_fields_json(input: &[u8], shape: JsonShape) -> Cow<'_, [u8]> {
    // A key can spell "managedFields" differently only with \u escapes.
    if !contains(input, b"managedFields") && !contains(input, b"\\u") {
        return Cow::Borrowed(input);
    }
    let Ok(depth) = kinformer_protobuf::deep::nesting(input) else {
        return Cow::Borrowed(input);
    };
    let strip = || {
        let mut stripper = Stripper {
            input,
            out: Vec::with_capacity(input.len()),
            removed: false,
        };
        match stripper.document(shape) {
            Some(()) if stripper.removed => Cow::Owned(stripper.out),
            _ => Cow::Borrowed(input),
        }
    };
    if depth <= kinformer_protobuf::deep::SHALLOW {
        strip()
    } else {
        kinformer_protobuf::deep::on_stack_for(depth, strip)
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Deeper than any document handed to the stripper (checked first).
const MAX_DEPTH: usize = kinformer_protobuf::deep::MAX_JSON_NESTING + 1;

/// What a value is to the stripper.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// A Kubernetes object: its `metadata` is [`Role::Metadata`].
    Object,
    /// The `metadata` of an object: its `managedFields` goes.
    Metadata,
    /// A list response: its `items` is [`Role::Items`].
    List,
    /// The items of a list, each a [`Role::Object`].
    Items,
    /// A watch event: its `object` is a [`Role::Object`].
    Event,
    /// Anything else: copied as it is.
    Other,
}

struct Stripper<'a> {
    input: &'a [u8],
    out: Vec<u8>,
    removed: bool,
}

/// `None` everywhere below: the input is not well-formed (or too deep), and
/// is to be handed on unchanged.
impl Stripper<'_> {
    fn document(&mut self, shape: JsonShape) -> Option<()> {
        let role = match shape {
            JsonShape::Object => Role::Object,
            JsonShape::List => Role::List,
            JsonShape::WatchEvent => Role::Event,
        };
        let start = skip_ws(self.input, 0);
        let end = self.value(start, role, 0)?;
        (skip_ws(self.input, end) == self.input.len()).then_some(())
    }

    /// Writes the value at `i`, inside `depth` arrays and objects; returns
    /// its end.
    fn value(&mut self, i: usize, role: Role, depth: usize) -> Option<usize> {
        match (self.input.get(i)?, role) {
            (b'{', Role::Object | Role::Metadata | Role::List | Role::Event) => {
                self.object(i, role, depth)
            }
            (b'[', Role::Items) => self.items(i, depth),
            _ => {
                let end = skip_value(self.input, i, depth)?;
                self.out.extend_from_slice(&self.input[i..end]);
                Some(end)
            }
        }
    }

    fn object(&mut self, i: usize, role: Role, depth: usize) -> Option<usize> {
        if depth + 1 >= MAX_DEPTH {
            return None;
        }
        let input = self.input;
        self.out.push(b'{');
        let mut j = skip_ws(input, i + 1);
        if input.get(j) == Some(&b'}') {
            self.out.push(b'}');
            return Some(j + 1);
        }
        let mut first = true;
        loop {
            if input.get(j) != Some(&b'"') {
                return None;
            }
            let key_end = string_end(input, j)?;
            let colon = skip_ws(input, key_end);
            if input.get(colon) != Some(&b':') {
                return None;
            }
            let v = skip_ws(input, colon + 1);
            let key = key_text(&input[j..key_end])?;
            let end = if role == Role::Metadata && key == "managedFields" {
                let end = skip_value(input, v, depth + 1)?;
                // The removed bytes must be JSON that serde accepts, or
                // removing them would turn invalid input into valid output.
                kinformer_protobuf::deep::from_json::<Validated>(&input[v..end]).ok()?;
                self.removed = true;
                end
            } else {
                let child = match (role, key.as_ref()) {
                    (Role::Object, "metadata") => Role::Metadata,
                    (Role::List, "items") => Role::Items,
                    (Role::Event, "object") => Role::Object,
                    _ => Role::Other,
                };
                if !first {
                    self.out.push(b',');
                }
                first = false;
                self.out.extend_from_slice(&input[j..key_end]);
                self.out.push(b':');
                self.value(v, child, depth + 1)?
            };
            j = skip_ws(input, end);
            match input.get(j)? {
                b',' => j = skip_ws(input, j + 1),
                b'}' => {
                    self.out.push(b'}');
                    return Some(j + 1);
                }
                _ => return None,
            }
        }
    }

    fn items(&mut self, i: usize, depth: usize) -> Option<usize> {
        if depth + 1 >= MAX_DEPTH {
            return None;
        }
        let input = self.input;
        self.out.push(b'[');
        let mut j = skip_ws(input, i + 1);
        if input.get(j) == Some(&b']') {
            self.out.push(b']');
            return Some(j + 1);
        }
        loop {
            let end = self.value(j, Role::Object, depth + 1)?;
            j = skip_ws(input, end);
            match input.get(j)? {
                b',' => {
                    self.out.push(b',');
                    j = skip_ws(input, j + 1);
                }
                b']' => {
                    self.out.push(b']');
                    return Some(j + 1);
                }
                _ => return None,
            }
        }
    }
}

/// A key as serde reads it: its bytes when it has no escape, else decoded.
fn key_text(quoted: &[u8]) -> Option<Cow<'_, str>> {
    let inner = &quoted[1..quoted.len() - 1];
    if inner.contains(&b'\\') {
        serde_json::from_slice::<String>(quoted)
            .ok()
            .map(Cow::Owned)
    } else {
        // Not UTF-8: not a key we look for; the decoder will refuse it.
        Some(String::from_utf8_lossy(inner))
    }
}

/// The end (exclusive) of the string starting at `i` (an opening quote).
fn string_end(input: &[u8], mut i: usize) -> Option<usize> {
    i += 1;
    while i < input.len() {
        match input[i] {
            b'\\' => i += 2,
            b'"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The end (exclusive) of the value at `i`, inside `depth` arrays and
/// objects. Checks the grammar of arrays and objects; the scalars are
/// checked by whoever parses them (serde, on the output or on removed bytes).
fn skip_value(input: &[u8], i: usize, depth: usize) -> Option<usize> {
    match *input.get(i)? {
        b'"' => string_end(input, i),
        open @ (b'{' | b'[') => {
            if depth + 1 >= MAX_DEPTH {
                return None;
            }
            let close = if open == b'{' { b'}' } else { b']' };
            let mut j = skip_ws(input, i + 1);
            if input.get(j) == Some(&close) {
                return Some(j + 1);
            }
            loop {
                let end = if open == b'{' {
                    if input.get(j) != Some(&b'"') {
                        return None;
                    }
                    let key_end = string_end(input, j)?;
                    let colon = skip_ws(input, key_end);
                    if input.get(colon) != Some(&b':') {
                        return None;
                    }
                    skip_value(input, skip_ws(input, colon + 1), depth + 1)?
                } else {
                    skip_value(input, j, depth + 1)?
                };
                j = skip_ws(input, end);
                match *input.get(j)? {
                    b',' => j = skip_ws(input, j + 1),
                    c if c == close => return Some(j + 1),
                    _ => return None,
                }
            }
        }
        b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
            let mut j = i + 1;
            while j < input.len()
                && matches!(input[j], b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z' | b'+' | b'-' | b'.')
            {
                j += 1;
            }
            Some(j)
        }
        _ => None,
    }
}

fn skip_ws(input: &[u8], mut i: usize) -> usize {
    while i < input.len() && matches!(input[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// Any JSON value, parsed by serde_json exactly as it parses a
/// `serde_json::Value` (strings, escapes, numbers and their range), but
/// kept nowhere.
struct Validated;

impl<'de> Deserialize<'de> for Validated {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ValidatedVisitor)
    }
}

struct ValidatedVisitor;

impl<'de> Visitor<'de> for ValidatedVisitor {
    type Value = Validated;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Validated, E> {
        Ok(Validated)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Validated, A::Error> {
        while seq.next_element::<Validated>()?.is_some() {}
        Ok(Validated)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Validated, A::Error> {
        while map.next_key::<Validated>()?.is_some() {
            map.next_value::<Validated>()?;
        }
        Ok(Validated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip_str(s: &str, shape: JsonShape) -> String {
        String::from_utf8(strip_managed_fields_json(s.as_bytes(), shape).into_owned()).unwrap()
    }

    fn same_json(a: &str, b: &str) {
        let a: serde_json::Value = serde_json::from_str(a).unwrap();
        let b: serde_json::Value = serde_json::from_str(b).unwrap();
        assert_eq!(a, b);
    }

    const MF: &str = r#"[{"manager":"kubectl","fieldsV1":{"f:metadata":{"f:labels":{".":{}}},"k:{\"type\":\"Ready\"}":{}},"operation":"Update"}]"#;

    #[test]
    fn the_objects_managed_fields_are_dropped_wherever_they_stand_in_its_metadata() {
        for (input, want) in [
            (
                format!(r#"{{"metadata":{{"managedFields":{MF},"name":"a"}}}}"#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
            (
                format!(r#"{{"metadata":{{"name":"a","managedFields":{MF}}}}}"#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
            (
                format!(r#"{{"metadata":{{"name":"a","managedFields":{MF},"uid":"u"}}}}"#),
                r#"{"metadata":{"name":"a","uid":"u"}}"#,
            ),
            (
                format!(r#"{{"metadata":{{"managedFields":{MF}}}}}"#),
                r#"{"metadata":{}}"#,
            ),
            (
                format!(r#" {{ "metadata" : {{ "name" : "a" , "managedFields" : {MF} }} }} "#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
            // Spelled with escapes, it is the same key to serde.
            (
                format!(r#"{{"meta\u0064ata":{{"name":"a","managed\u0046ields":{MF}}}}}"#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
        ] {
            let got = strip_str(&input, JsonShape::Object);
            same_json(&got, want);
            assert!(!got.contains("managedFields"), "{got}");
        }
    }

    #[test]
    fn watch_events_and_lists_are_stripped_in_their_objects_only() {
        let event = format!(
            r#"{{"type":"ADDED","metadata":{{"managedFields":1}},"object":{{"kind":"Pod","metadata":{{"name":"p","managedFields":{MF}}},"spec":{{}}}}}}"#
        );
        same_json(
            &strip_str(&event, JsonShape::WatchEvent),
            r#"{"type":"ADDED","metadata":{"managedFields":1},"object":{"kind":"Pod","metadata":{"name":"p"},"spec":{}}}"#,
        );
        let list = r#"{"metadata":{"resourceVersion":"5","managedFields":2},"items":[{"metadata":{"name":"a","managedFields":[]}},{"metadata":{"managedFields":[{"x":"]}"}],"name":"b"}}]}"#;
        same_json(
            &strip_str(list, JsonShape::List),
            r#"{"metadata":{"resourceVersion":"5","managedFields":2},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}"#,
        );
    }

    #[test]
    fn managed_fields_below_the_object_are_kept() {
        for input in [
            // A Deployment's pod template, a custom resource's own data.
            r#"{"metadata":{"name":"d"},"spec":{"template":{"metadata":{"managedFields":[{"manager":"x"}]}}}}"#,
            r#"{"metadata":{"name":"c"},"spec":{"x":{"metadata":{"managedFields":[1]}}}}"#,
            r#"{"metadata":{"name":"a"},"data":{"managedFields":"keep"}}"#,
            r#"{"metadata":{"labels":{"managedFields":"x"},"annotations":{"note":"\"managedFields\":[1]"}}}"#,
            r#"{"spec":{"managedFields":[1]}}"#,
            // Not a key of metadata, whatever its spelling looks like.
            r#"{"metadata":{"managedfields":1,"managedFields ":2,"managed\\Fields":3}}"#,
        ] {
            assert_eq!(strip_str(input, JsonShape::Object), input);
        }
        // In a list, only the items are objects.
        let list = r#"{"items":[{"spec":{"template":{"metadata":{"managedFields":[]}}}}],"spec":{"metadata":{"managedFields":[]}}}"#;
        assert_eq!(strip_str(list, JsonShape::List), list);
    }

    #[test]
    fn invalid_json_is_returned_as_it_is_even_when_only_its_managed_fields_are_invalid() {
        for bad in [
            r#"{"metadata":{"managedFields":[{"unterminated"#,
            r#"{"metadata":{"managedFields":[01]}}"#,
            r#"{"metadata":{"managedFields":[1e400]}}"#,
            r#"{"metadata":{"managedFields":"\ud800"}}"#,
            r#"{"metadata":{"managedFields":"\x"}}"#,
            r#"{"metadata":{"managedFields":[1,]}}"#,
            r#"{"metadata":{"managedFields":{"a" 1}}}"#,
            r#"{"metadata":{"managedFields":[] "name":"a"}}"#,
            r#"{"metadata":{"name":"a" "managedFields":[]}}"#,
            r#"{"metadata":{"name":"a",,"managedFields":[]}}"#,
            r#"{"metadata":{"name":"a","managedFields":[],}}"#,
            r#"{"metadata":{"managedFields":[]]}"#,
            r#"{"metadata":{"managedFields":[]}} trailing"#,
            "{\"metadata\":{\"managedFields\":\"\u{1}\"}}",
        ] {
            assert!(
                serde_json::from_str::<serde_json::Value>(bad).is_err(),
                "{bad}"
            );
            assert_eq!(strip_str(bad, JsonShape::Object), bad);
        }
        let not_utf8 = b"{\"metadata\":{\"managedFields\":\"\xff\"}}";
        assert_eq!(
            strip_managed_fields_json(not_utf8, JsonShape::Object).as_ref(),
            not_utf8
        );
    }

    #[test]
    fn managed_fields_nested_as_deep_as_the_server_sends_are_removed_beyond_that_not() {
        let deep = |n: usize| {
            format!(
                r#"{{"metadata":{{"managedFields":{}{}}}}}"#,
                "[".repeat(n),
                "]".repeat(n)
            )
        };
        // The document's own two levels plus n arrays, on a 2 MiB thread.
        let limit = kinformer_protobuf::deep::MAX_JSON_NESTING;
        let (ok, too_deep) = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                (
                    strip_str(&deep(limit - 2), JsonShape::Object),
                    strip_str(&deep(limit - 1), JsonShape::Object),
                )
            })
            .unwrap()
            .join()
            .unwrap();
        same_json(&ok, r#"{"metadata":{}}"#);
        assert_eq!(too_deep, deep(limit - 1));
    }
}
