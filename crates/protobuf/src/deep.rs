//! JSON of any nesting depth the API server accepts, decoded without
//! overflowing the thread's stack.
//!
//! serde_json refuses documents nested deeper than 128 levels, and without
//! that limit it recurses once per level on the thread's stack, as does
//! serde's replay of what it buffers (`#[serde(flatten)]` in
//! `DynamicObject` and `PartialObjectMeta`, tagged enums). The API server
//! accepts JSON nested 10 000 levels deep (Go's decoder limit), so a custom
//! resource or a CustomResourceDefinition nested a few thousand levels is
//! valid, and client-go (whose stacks grow) reads it. Here a document is
//! decoded as serde_json decodes it; only one that meets serde_json's
//! limit is measured (one pass over its bytes) and, up to
//! [`MAX_JSON_NESTING`], decoded again without the limit on a stack of its
//! own, sized for its depth (`stacker::grow`; virtual memory, of which only
//! the pages used are touched); a deeper one still is refused.

use serde::de::{self, Deserialize, Visitor};

/// The deepest nesting of JSON arrays and objects decoded: the API
/// server's own limit on what it accepts (Go's `encoding/json` stops at
/// 10 000), plus the few levels of a watch event or a list around an
/// object, so it never sends deeper.
pub const MAX_JSON_NESTING: usize = 10_016;

/// Documents nested at most this deep are decoded on the caller's stack
/// (serde_json's own limit is 128).
pub const SHALLOW: usize = 100;

/// Stack given to each level of a deep document: measured, a debug build
/// decoding a `DynamicObject` (serde's buffered replay of its flattened
/// fields) needs a few KiB per level; this leaves ample room.
const STACK_PER_LEVEL: usize = 16 << 10;

/// Runs `f` on a stack of its own, deep enough for `depth` levels of JSON.
pub fn on_stack_for<R>(depth: usize, f: impl FnOnce() -> R) -> R {
    stacker::grow(depth * STACK_PER_LEVEL + (1 << 20), f)
}

/// Decodes `json` into `T`, at any depth up to [`MAX_JSON_NESTING`]: as
/// serde_json does, on the caller's stack, and only when that meets
/// serde_json's depth limit, again on a stack sized for the document (so
/// ordinary documents pay nothing for deep ones).
pub fn from_json<'de, T: Deserialize<'de>>(json: &'de [u8]) -> Result<T, serde_json::Error> {
    match serde_json::from_slice(json) {
        Err(e) if too_deep(&e) => {}
        decoded => return decoded,
    }
    let depth = nesting(json)?;
    on_stack_for(depth, || {
        let mut de = serde_json::Deserializer::from_slice(json);
        de.disable_recursion_limit();
        let value = T::deserialize(&mut de)?;
        de.end()?;
        Ok(value)
    })
}

/// Whether serde_json refused a document for nesting deeper than its limit.
pub fn too_deep(e: &serde_json::Error) -> bool {
    e.to_string().starts_with("recursion limit exceeded")
}

/// Hands the JSON value `json`, nested at most `depth` levels (from
/// [`nesting`]), to `visitor`, without serde_json's depth limit: the caller
/// must be on a stack deep enough for `depth` levels ([`on_stack_for`]).
pub(crate) fn deserialize_json_unbounded<'de, V: Visitor<'de>>(
    json: &'de [u8],
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    de.disable_recursion_limit();
    let value = de::Deserializer::deserialize_any(&mut de, visitor)?;
    de.end()?;
    Ok(value)
}

/// How deep `json` nests arrays and objects (text inside strings does not
/// count), refused past [`MAX_JSON_NESTING`]. Ill-formed input is left
/// for the decoder to refuse.
pub fn nesting(json: &[u8]) -> Result<usize, serde_json::Error> {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
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
                if depth > MAX_JSON_NESTING {
                    return Err(de::Error::custom(format!(
                        "JSON nested more than {MAX_JSON_NESTING} levels deep"
                    )));
                }
                deepest = deepest.max(depth);
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    Ok(deepest)
}

#[cfg(test)]
mod tests {
    use kube_client::core::DynamicObject;

    use super::*;

    fn nested_arrays(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    /// Runs `f` on a thread of 2 MiB, a tokio worker's default.
    fn on_small_thread<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn a_custom_resource_nested_as_deep_as_the_server_accepts_decodes_on_a_small_thread() {
        // serde buffers a DynamicObject's flattened fields and replays them
        // recursively: 2 000 levels overflowed a 2 MiB thread before the
        // stack was sized for the document.
        let depth = MAX_JSON_NESTING - 2;
        let spec = nested_arrays(depth - 1);
        let json = format!(
            r#"{{"apiVersion":"example.com/v1","kind":"Deep","metadata":{{"name":"d","namespace":"n"}},"spec":{spec}}}"#
        );
        let decoded = on_small_thread(move || {
            let object: DynamicObject = from_json(json.as_bytes()).unwrap();
            let mut depth = 0;
            let mut v = &object.data["spec"];
            while let Some(inner) = v.as_array().and_then(|a| a.first()) {
                depth += 1;
                v = inner;
            }
            // A Value this deep drops within 2 MiB (measured: 10 000
            // levels in a debug build).
            drop(object);
            depth
        });
        assert_eq!(decoded, depth - 2);
    }

    #[test]
    fn json_nested_deeper_than_the_limit_is_refused_before_decoding() {
        let e = from_json::<serde_json::Value>(nested_arrays(MAX_JSON_NESTING + 1).as_bytes())
            .unwrap_err();
        assert!(e.to_string().contains("nested more than"), "{e}");
        assert!(from_json::<serde_json::Value>(nested_arrays(MAX_JSON_NESTING).as_bytes()).is_ok());
    }

    #[test]
    fn brackets_inside_strings_do_not_count_as_nesting() {
        let json = format!(r#"{{"a": "{}\"[", "b": [[1]]}}"#, "[".repeat(100));
        assert_eq!(nesting(json.as_bytes()).unwrap(), 3);
    }
}
