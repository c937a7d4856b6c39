//! JSON of any nesting depth the API server accepts, decoded without
//! overflowing the thread's stack.
//!
//! serde_json refuses documents nested deeper than 128 levels, and without
//! that limit it recurses once per level on the thread's stack; the API
//! server accepts JSON nested 10 000 levels deep (Go's decoder limit), so
//! a CustomResourceDefinition whose schema nests `properties` a few hundred
//! levels deep is valid, and client-go (whose stacks grow) reads it. Here
//! the limit is lifted (`unbounded_depth`) and each level runs through
//! `serde_stacker`, which moves the decode onto a new stack segment when
//! the current one runs low. A document nested deeper than
//! [`MAX_JSON_NESTING`], checked by one pass over its bytes before it is
//! decoded, is refused with an error instead.

use serde::de::{self, Deserialize, Visitor};

/// The deepest nesting of JSON arrays and objects decoded: twice the API
/// server's own limit (Go's `encoding/json` stops at 10 000).
pub const MAX_JSON_NESTING: usize = 20_000;

/// Stack left below which a level is decoded on a new segment, and the
/// size of that segment (see [`crate::protobuf`]'s decoder, which grows its
/// stack the same way).
const RED_ZONE: usize = 256 << 10;
const STACK_SEGMENT: usize = 8 << 20;

/// Decodes `json` into `T`, at any depth up to [`MAX_JSON_NESTING`].
pub(crate) fn from_json<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, serde_json::Error> {
    check_nesting(json)?;
    let mut de = serde_json::Deserializer::from_slice(json);
    de.disable_recursion_limit();
    let value = T::deserialize(stacked(&mut de))?;
    de.end()?;
    Ok(value)
}

/// Hands the JSON value `json` to `visitor`, at any depth up to
/// [`MAX_JSON_NESTING`].
pub(crate) fn deserialize_json<'de, V: Visitor<'de>>(
    json: &'de [u8],
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    check_nesting(json)?;
    let mut de = serde_json::Deserializer::from_slice(json);
    de.disable_recursion_limit();
    let value = de::Deserializer::deserialize_any(stacked(&mut de), visitor)?;
    de.end()?;
    Ok(value)
}

fn stacked<'a, 'de>(
    de: &'a mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>,
) -> serde_stacker::Deserializer<&'a mut serde_json::Deserializer<serde_json::de::SliceRead<'de>>> {
    let mut stacked = serde_stacker::Deserializer::new(de);
    stacked.red_zone = RED_ZONE;
    stacked.stack_size = STACK_SEGMENT;
    stacked
}

/// Refuses a document nested deeper than [`MAX_JSON_NESTING`]: the
/// decode would take that many stack frames.
fn check_nesting(json: &[u8]) -> Result<(), serde_json::Error> {
    match nesting_over(json, MAX_JSON_NESTING) {
        false => Ok(()),
        true => Err(de::Error::custom(format!(
            "JSON nested more than {MAX_JSON_NESTING} levels deep"
        ))),
    }
}

/// Whether `json` opens more than `max` arrays and objects inside one
/// another (text inside strings does not count). Ill-formed input is
/// left for the decoder to refuse.
pub(crate) fn nesting_over(json: &[u8], max: usize) -> bool {
    let (mut depth, mut in_string, mut escaped) = (0usize, false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested_arrays(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn json_nested_far_deeper_than_serde_jsons_limit_decodes_on_a_small_stack() {
        // A 256 KiB thread: without a growing stack a few hundred levels
        // overflow it (an abort, not a panic).
        let json = nested_arrays(MAX_JSON_NESTING);
        let decoded = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let value: serde_json::Value = from_json(json.as_bytes()).unwrap();
                let mut depth = 0;
                let mut v = &value;
                while let Some(inner) = v.as_array().and_then(|a| a.first()) {
                    depth += 1;
                    v = inner;
                }
                // serde_json's Value drops recursively: on a stack of its own.
                stacker::grow(64 << 20, move || drop(value));
                depth
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(decoded, MAX_JSON_NESTING - 1);
    }

    #[test]
    fn json_nested_deeper_than_the_limit_is_refused_before_decoding() {
        let e = from_json::<serde_json::Value>(nested_arrays(MAX_JSON_NESTING + 1).as_bytes())
            .unwrap_err();
        assert!(e.to_string().contains("nested more than"), "{e}");
    }

    #[test]
    fn brackets_inside_strings_do_not_count_as_nesting() {
        let json = format!(r#"{{"a": "{}\"[", "b": [[1]]}}"#, "[".repeat(100));
        assert!(!nesting_over(json.as_bytes(), 3));
        assert!(nesting_over(json.as_bytes(), 2));
    }
}
