//! Reviews of objects nested as deep as the API server stores them, read
//! and answered without overflowing a stack.
//!
//! serde_json refuses JSON nested deeper than 128 levels, but the API
//! server stores objects nested up to 10 000 levels (its decoder's limit,
//! from Go's `encoding/json` by way of `sigs.k8s.io/json`): a custom
//! resource whose schema preserves unknown fields can be that deep, and
//! under `failurePolicy: Fail` a webhook that cannot read it blocks it.
//! Without serde_json's limit, reading (and cloning, comparing, writing,
//! dropping) such a value recurses once per level, more than a thread's
//! stack holds. So each body is measured first, in one pass that does not
//! recurse: one nested deeper than the API server ever sends
//! ([`MAX_NESTING`]) is refused; one deeper than serde_json's own limit
//! is answered (read, handled, written and dropped) on a stack of its own,
//! sized for its depth ([`Stack`], [`OnStack`], `stacker`: virtual memory,
//! of which only the pages used are touched), and so is a defaulting
//! handler's patch, found on a blocking thread; the rest as before, on the
//! caller's.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::de::DeserializeOwned;

/// The deepest nesting of JSON arrays and objects in a body read: the API
/// server's limit on the objects it decodes (10 000 levels), and room for
/// the review around them (an AdmissionReview adds 2 levels, a
/// ConversionReview 3).
pub(crate) const MAX_NESTING: usize = 10_016;

/// Bodies nested at most this deep are answered on the caller's stack, as
/// serde_json reads them by default.
const SHALLOW: usize = 128;

/// Stack given to each level of a deeper body. Measured at 10 000 levels,
/// a debug build needs 1 to 2 KiB a level to read a `DynamicObject` (serde buffers its
/// flattened fields and replays them, recursively), patch it and write it;
/// the rest is for a handler that recurses over the object too.
const STACK_PER_LEVEL: usize = 16 << 10;

/// A body nested deeper than [`MAX_NESTING`].
#[derive(Debug, thiserror::Error)]
#[error("JSON nested more than {MAX_NESTING} levels deep, deeper than the API server accepts")]
pub(crate) struct TooDeep;

/// How deep `json` nests arrays and objects (brackets inside strings do
/// not count), counted without recursion and refused past
/// [`MAX_NESTING`]. Ill-formed JSON is left for the reader to refuse.
pub(crate) fn depth(json: &[u8]) -> Result<usize, TooDeep> {
    let (mut level, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
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
                level += 1;
                if level > MAX_NESTING {
                    return Err(TooDeep);
                }
                deepest = deepest.max(level);
            }
            b'}' | b']' => level = level.saturating_sub(1),
            _ => {}
        }
    }
    Ok(deepest)
}

/// Reads `json` as serde_json does, but without its depth limit: only for
/// a body [`depth`] measured, read within [`OnStack`].
pub(crate) fn from_slice<T: DeserializeOwned>(json: &[u8]) -> Result<T, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(json);
    de.disable_recursion_limit();
    let value = T::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// The stack a body is answered on: deep enough for its nesting.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stack {
    /// Bytes of stack to run on; 0: the caller's.
    bytes: usize,
}

impl Stack {
    /// For a body nested `depth` levels: a new one when it is deeper than
    /// serde_json reads by default, the caller's otherwise.
    pub(crate) fn for_depth(depth: usize) -> Self {
        let bytes = match depth {
            0..=SHALLOW => 0,
            _ => depth * STACK_PER_LEVEL + (1 << 20),
        };
        Self { bytes }
    }

    /// `f()`, run on this stack.
    pub(crate) fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self.bytes {
            0 => f(),
            bytes => stacker::grow(bytes, f),
        }
    }
}

/// A future polled, and dropped, on a [`Stack`] (a new one at each poll
/// when it is not the caller's).
pub(crate) struct OnStack<F> {
    future: Option<F>,
    stack: Stack,
}

impl<F> OnStack<F> {
    pub(crate) fn new(stack: Stack, future: F) -> Self {
        Self {
            future: Some(future),
            stack,
        }
    }
}

impl<F: Future + Unpin> Future for OnStack<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let slot = &mut this.future;
        this.stack.run(|| {
            let Some(future) = slot.as_mut() else {
                return Poll::Pending; // polled again after its answer
            };
            let polled = Pin::new(future).poll(cx);
            if polled.is_ready() {
                *slot = None;
            }
            polled
        })
    }
}

impl<F> Drop for OnStack<F> {
    fn drop(&mut self) {
        // Cancelled (the call's timeout, the client gone): what it holds
        // is as deep as the body.
        if let Some(future) = self.future.take() {
            self.stack.run(move || drop(future));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_brackets_outside_strings_and_stops_past_the_limit() {
        assert_eq!(
            depth(br#"{"a": [1, {"b": "[[{{"}], "c": "\"{"}"#).unwrap(),
            3
        );
        assert_eq!(depth(b"1").unwrap(), 0);
        let at_limit = format!("{}{}", "[".repeat(MAX_NESTING), "]".repeat(MAX_NESTING));
        assert_eq!(depth(at_limit.as_bytes()).unwrap(), MAX_NESTING);
        let past = format!("[{at_limit}]");
        assert!(depth(past.as_bytes()).is_err());
        // Unbalanced: measured, refused by the reader.
        assert_eq!(depth(b"]]]{").unwrap(), 1);
    }
}
