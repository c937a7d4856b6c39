//! Dropping `metadata.managedFields` from JSON before it is decoded.
//!
//! Most controllers never read managedFields, yet decoding them is a large
//! share of the cost of a list or watch: every field path becomes a
//! `serde_json::Value` map. [`strip_managed_fields_json`] removes the
//! `managedFields` member of every object that is the value of a `metadata`
//! key, scanning the bytes once (strings and escapes respected), so serde
//! never sees them.

use std::borrow::Cow;

/// The JSON with every `"metadata": {.., "managedFields": [..], ..}` member
/// removed; borrowed unchanged when there is none. Malformed JSON is
/// returned as it is, for the decoder to report.
pub fn strip_managed_fields_json(input: &[u8]) -> Cow<'_, [u8]> {
    const KEY: &[u8] = b"\"managedFields\"";
    if !contains(input, KEY) {
        return Cow::Borrowed(input);
    }
    match strip(input) {
        Some(out) => Cow::Owned(out),
        None => Cow::Borrowed(input),
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
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

/// The end (exclusive) of the value starting at `i`.
fn value_end(input: &[u8], i: usize) -> Option<usize> {
    match *input.get(i)? {
        b'"' => string_end(input, i),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut j = i;
            while j < input.len() {
                match input[j] {
                    b'"' => {
                        j = string_end(input, j)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(j + 1);
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            None
        }
        _ => {
            let mut j = i;
            while j < input.len()
                && !matches!(input[j], b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t')
            {
                j += 1;
            }
            Some(j)
        }
    }
}

fn skip_ws(input: &[u8], mut i: usize) -> usize {
    while i < input.len() && matches!(input[i], b' ' | b'\n' | b'\r' | b'\t') {
        i += 1;
    }
    i
}

/// One open object or array: whether it is an object that is the value of a
/// `metadata` key, and (objects) the key just read.
struct Frame {
    object: bool,
    is_metadata: bool,
    /// The output position of the comma before the current member.
    comma_out: Option<usize>,
}

fn strip(input: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(input.len());
    let mut stack: Vec<Frame> = Vec::new();
    let mut last_key_is_metadata = false;
    let mut i = 0;
    while i < input.len() {
        let c = input[i];
        match c {
            b'"' => {
                let end = string_end(input, i)?;
                let after = skip_ws(input, end);
                let is_key =
                    stack.last().is_some_and(|f| f.object) && input.get(after) == Some(&b':');
                if is_key {
                    let key = &input[i + 1..end - 1];
                    if key == b"managedFields" && stack.last().is_some_and(|f| f.is_metadata) {
                        // Drop `"managedFields": <value>` and one comma next to it.
                        let value_start = skip_ws(input, after + 1);
                        let mut next = value_end(input, value_start)?;
                        match stack.last().and_then(|f| f.comma_out) {
                            Some(comma) => out.truncate(comma),
                            None => {
                                let k = skip_ws(input, next);
                                if input.get(k) == Some(&b',') {
                                    next = k + 1;
                                }
                            }
                        }
                        i = next;
                        continue;
                    }
                    last_key_is_metadata = key == b"metadata";
                }
                out.extend_from_slice(&input[i..end]);
                i = end;
                continue;
            }
            b'{' | b'[' => {
                let is_metadata =
                    c == b'{' && last_key_is_metadata && stack.last().is_some_and(|f| f.object);
                stack.push(Frame {
                    object: c == b'{',
                    is_metadata,
                    comma_out: None,
                });
                last_key_is_metadata = false;
            }
            b'}' | b']' => {
                stack.pop();
                last_key_is_metadata = false;
            }
            b',' => {
                if let Some(f) = stack.last_mut() {
                    f.comma_out = Some(out.len());
                }
                last_key_is_metadata = false;
            }
            _ => {}
        }
        out.push(c);
        i += 1;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip_str(s: &str) -> String {
        String::from_utf8(strip_managed_fields_json(s.as_bytes()).into_owned()).unwrap()
    }

    fn same_json(a: &str, b: &str) {
        let a: serde_json::Value = serde_json::from_str(a).unwrap();
        let b: serde_json::Value = serde_json::from_str(b).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn managed_fields_of_metadata_are_dropped_wherever_they_stand() {
        let mf = r#"[{"manager":"kubectl","fieldsV1":{"f:metadata":{"f:labels":{".":{}}}},"operation":"Update"}]"#;
        for (input, want) in [
            (
                format!(r#"{{"metadata":{{"managedFields":{mf},"name":"a"}}}}"#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
            (
                format!(r#"{{"metadata":{{"name":"a","managedFields":{mf}}}}}"#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
            (
                format!(r#"{{"metadata":{{"name":"a","managedFields":{mf},"uid":"u"}}}}"#),
                r#"{"metadata":{"name":"a","uid":"u"}}"#,
            ),
            (
                format!(r#"{{"metadata":{{"managedFields":{mf}}}}}"#),
                r#"{"metadata":{}}"#,
            ),
            (
                format!(r#"{{ "metadata" : {{ "name" : "a" , "managedFields" : {mf} }} }}"#),
                r#"{"metadata":{"name":"a"}}"#,
            ),
        ] {
            let got = strip_str(&input);
            same_json(&got, want);
            assert!(!got.contains("managedFields"), "{got}");
        }
    }

    #[test]
    fn watch_events_and_lists_are_stripped_in_every_object() {
        let event = r#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"p","managedFields":[{"a":1}]},"spec":{}}}"#;
        same_json(
            &strip_str(event),
            r#"{"type":"ADDED","object":{"kind":"Pod","metadata":{"name":"p"},"spec":{}}}"#,
        );
        let list = r#"{"metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a","managedFields":[]}},{"metadata":{"managedFields":[{"x":"]}"}],"name":"b"}}]}"#;
        same_json(
            &strip_str(list),
            r#"{"metadata":{"resourceVersion":"5"},"items":[{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}"#,
        );
    }

    #[test]
    fn managed_fields_elsewhere_are_kept() {
        // A ConfigMap key, a label and annotation values, an escaped quote.
        for input in [
            r#"{"metadata":{"name":"a"},"data":{"managedFields":"keep"}}"#,
            r#"{"metadata":{"labels":{"managedFields":"x"},"annotations":{"note":"\"managedFields\":[1]"}}}"#,
            r#"{"spec":{"managedFields":[1]}}"#,
        ] {
            assert_eq!(strip_str(input), input);
        }
    }

    #[test]
    fn malformed_json_is_passed_through_for_the_decoder_to_report() {
        let bad = r#"{"metadata":{"managedFields":[{"unterminated"#;
        assert_eq!(strip_str(bad), bad);
    }
}
