//! Sharded list and watch: each informer sees only the objects whose hash
//! falls in its ranges (KEP-5866, kube-apiserver's `ShardedListAndWatch`
//! feature gate, alpha since v1.36).
//!
//! The server hashes `metadata.uid` (or `metadata.namespace`) with 64-bit
//! FNV-1a and keeps an object when the hash is in one of the selector's
//! ranges, `start <= hash < end`. A LIST answers with the selector it
//! applied in `ListMeta.shardInfo.selector`; watches and the streaming list
//! carry no such echo but are filtered the same way. A server without the
//! gate ignores the parameter and sends everything, so the lister-watcher
//! filters on the client too, with the same hash ([`shard_hash`]): the
//! informer holds its shard whatever the server does. Neither the uid nor
//! the namespace of an object ever changes, so an object never moves from
//! one shard to another.
//!
//! [`ShardSelector`] builds, prints and parses the selector in the exact
//! grammar the server accepts (16 lower-case hex digits a bound, 2^64 as
//! `0x10000000000000000`), so a bad selector is refused here with a clear
//! error instead of the 500 the server answers it with. [`ShardStats`] says
//! whether the server applied the selector and how many objects the client
//! had to drop. FNV-1a is the `fnv` crate's.

use std::fmt;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use thiserror::Error;

/// The field whose hash places an object in a shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardField {
    /// `metadata.uid`: objects spread evenly, whatever their namespace.
    Uid,
    /// `metadata.namespace`: every object of a namespace in one shard.
    Namespace,
}

impl ShardField {
    fn path(self) -> &'static str {
        match self {
            ShardField::Uid => "object.metadata.uid",
            ShardField::Namespace => "object.metadata.namespace",
        }
    }
}

/// The end of the hash space, exclusive: 2^64.
pub const HASH_SPACE_END: u128 = 1 << 64;

/// One range of hashes, `start <= hash < end`; `end` is at most 2^64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HashRange {
    start: u64,
    end: u128,
}

impl HashRange {
    /// `start..end`; refused unless `start < end <= 2^64`.
    pub fn new(start: u64, end: u128) -> Result<Self, ShardSelectorError> {
        if end > HASH_SPACE_END || u128::from(start) >= end {
            return Err(ShardSelectorError::BadRange { start, end });
        }
        Ok(Self { start, end })
    }

    /// The `index`-th of `count` equal ranges that cut the hash space (the
    /// last one ends at 2^64), as kube-apiserver's own tests cut it.
    pub fn split(index: u64, count: u64) -> Result<Self, ShardSelectorError> {
        if count == 0 || index >= count {
            return Err(ShardSelectorError::BadSplit { index, count });
        }
        let span = HASH_SPACE_END / u128::from(count);
        let start = span * u128::from(index);
        let end = if index + 1 == count {
            HASH_SPACE_END
        } else {
            start + span
        };
        Self::new(start as u64, end)
    }

    /// The first hash in the range.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The first hash past the range (2^64 at most).
    pub fn end(&self) -> u128 {
        self.end
    }

    /// Whether `hash` is in the range.
    pub fn contains(&self, hash: u64) -> bool {
        hash >= self.start && u128::from(hash) < self.end
    }
}

/// A shard: the objects whose [`shard_hash`] of one field falls in any of
/// some ranges. Prints as the server's `shardSelector` parameter.
///
/// ```
/// use kinformer_informer::{HashRange, ShardField, ShardSelector};
///
/// // The first of two halves, by uid.
/// let shard = ShardSelector::new(ShardField::Uid, [HashRange::split(0, 2).unwrap()]).unwrap();
/// assert_eq!(
///     shard.to_string(),
///     "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000')"
/// );
/// assert_eq!(shard.to_string().parse::<ShardSelector>().unwrap(), shard);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardSelector {
    field: ShardField,
    /// Sorted, none overlapping or touching another.
    ranges: Vec<HashRange>,
}

impl ShardSelector {
    /// The objects whose `field` hashes into any of `ranges`. Overlapping
    /// and adjacent ranges are merged; no range at all is refused (the
    /// server refuses an empty selector).
    pub fn new(
        field: ShardField,
        ranges: impl IntoIterator<Item = HashRange>,
    ) -> Result<Self, ShardSelectorError> {
        let mut ranges: Vec<HashRange> = ranges.into_iter().collect();
        if ranges.is_empty() {
            return Err(ShardSelectorError::Empty);
        }
        ranges.sort();
        let mut merged: Vec<HashRange> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if u128::from(r.start) <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Ok(Self {
            field,
            ranges: merged,
        })
    }

    /// The field hashed.
    pub fn field(&self) -> ShardField {
        self.field
    }

    /// The ranges, sorted and merged.
    pub fn ranges(&self) -> &[HashRange] {
        &self.ranges
    }

    /// Whether an object with this field value is in the shard.
    pub fn contains_value(&self, value: &str) -> bool {
        let hash = shard_hash(value);
        self.ranges.iter().any(|r| r.contains(hash))
    }

    /// Whether `obj` is in the shard (an object without the field hashes
    /// the empty string, as the server does).
    pub fn matches<K: kube_client::Resource>(&self, obj: &K) -> bool {
        let meta = obj.meta();
        let value = match self.field {
            ShardField::Uid => meta.uid.as_deref(),
            ShardField::Namespace => meta.namespace.as_deref(),
        };
        self.contains_value(value.unwrap_or_default())
    }
}

impl fmt::Display for ShardSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(
                f,
                "shardRange({}, '0x{:016x}', '0x{:016x}')",
                self.field.path(),
                r.start,
                r.end
            )?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ShardSelector {
    type Err = ShardSelectorError;

    /// Parses the server's grammar: `shardRange(<field>, '<start>', '<end>')`
    /// terms joined by `||`, every term on the same field.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| ShardSelectorError::Syntax {
            selector: s.to_owned(),
            why: why.to_owned(),
        };
        let mut field = None;
        let mut ranges = Vec::new();
        for term in s.split("||") {
            let inner = term
                .trim()
                .strip_prefix("shardRange(")
                .and_then(|t| t.strip_suffix(')'))
                .ok_or_else(|| bad("each term must be shardRange(field, 'start', 'end')"))?;
            let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
            let [path, start, end] = parts[..] else {
                return Err(bad("shardRange takes a field and two bounds"));
            };
            let f = match path {
                "object.metadata.uid" => ShardField::Uid,
                "object.metadata.namespace" => ShardField::Namespace,
                other => return Err(bad(&format!("cannot shard on {other:?}"))),
            };
            if field.replace(f).is_some_and(|prev| prev != f) {
                return Err(bad("every range must hash the same field"));
            }
            let (start, end) = (
                bound(start).map_err(|w| bad(&w))?,
                bound(end).map_err(|w| bad(&w))?,
            );
            let start =
                u64::try_from(start).map_err(|_| bad("a start bound must be below 2^64"))?;
            ranges.push(HashRange::new(start, end)?);
        }
        Self::new(field.ok_or_else(|| bad("no range"))?, ranges)
    }
}

/// One quoted bound: `'0x` and 16 lower-case hex digits, or 2^64.
fn bound(quoted: &str) -> Result<u128, String> {
    let hex = quoted
        .strip_prefix('\'')
        .and_then(|q| q.strip_suffix('\''))
        .and_then(|q| q.strip_prefix("0x"))
        .ok_or_else(|| format!("bound {quoted} is not a quoted 0x value"))?;
    let exact = hex.len() == 16 || hex == "10000000000000000";
    if !exact
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!(
            "bound {quoted} is not 16 lower-case hex digits (or 0x10000000000000000)"
        ));
    }
    u128::from_str_radix(hex, 16).map_err(|e| format!("bound {quoted}: {e}"))
}

/// The 64-bit FNV-1a hash of `value`'s bytes: the hash kube-apiserver
/// shards on.
pub fn shard_hash(value: &str) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(value.as_bytes());
    h.finish()
}

/// A shard selector that cannot be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ShardSelectorError {
    /// A range is empty, reversed or past 2^64.
    #[error("hash range {start:#x}..{end:#x} is not start < end <= 2^64")]
    BadRange {
        /// The start given.
        start: u64,
        /// The end given.
        end: u128,
    },
    /// `index` is not below `count`, or `count` is zero.
    #[error("shard {index} of {count} does not exist")]
    BadSplit {
        /// The index given.
        index: u64,
        /// The count given.
        count: u64,
    },
    /// A selector with no range.
    #[error("a shard selector needs at least one range")]
    Empty,
    /// A selector string outside the server's grammar.
    #[error("shard selector {selector:?}: {why}")]
    Syntax {
        /// The string given.
        selector: String,
        /// What is wrong with it.
        why: String,
    },
}

/// Whether the server applied a shard selector, as far as the client can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardEnforcement {
    /// Nothing has told yet: no list has echoed the selector and no object
    /// outside it has arrived (a watch, and a custom resource's list, never
    /// echo it).
    Unconfirmed,
    /// A list echoed the selector in `ListMeta.shardInfo`.
    Server,
    /// The server sent objects outside the shard: it ignores the selector
    /// (the feature gate is off, or the server is older than v1.36) and the
    /// client filters.
    Client,
}

/// How sharding has gone for one lister-watcher; shared with whoever asked
/// for it ([`ApiListerWatcher::shard_stats`](crate::ApiListerWatcher::shard_stats)).
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct ShardStats {
    enforcement: AtomicU8,
    filtered: AtomicU64,
}

const UNCONFIRMED: u8 = 0;
const SERVER: u8 = 1;
const CLIENT: u8 = 2;

impl ShardStats {
    /// Whether the server applies the selector.
    pub fn enforcement(&self) -> ShardEnforcement {
        match self.enforcement.load(Ordering::Relaxed) {
            SERVER => ShardEnforcement::Server,
            CLIENT => ShardEnforcement::Client,
            _ => ShardEnforcement::Unconfirmed,
        }
    }

    /// Objects the server sent that were outside the shard, dropped here.
    pub fn filtered_on_client(&self) -> u64 {
        self.filtered.load(Ordering::Relaxed)
    }

    /// A list echoed the selector.
    pub(crate) fn server_applied(&self) {
        // Client-side evidence wins: objects outside the shard did arrive.
        let _ = self.enforcement.compare_exchange(
            UNCONFIRMED,
            SERVER,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// `n` objects outside the shard arrived; says so in the log the first time.
    pub(crate) fn filtered(&self, n: u64, what: &str, selector: &ShardSelector) {
        if n == 0 {
            return;
        }
        self.filtered.fetch_add(n, Ordering::Relaxed);
        if self.enforcement.swap(CLIENT, Ordering::Relaxed) != CLIENT {
            tracing::warn!(
                %selector,
                what,
                "the server ignores the shard selector (is kube-apiserver's ShardedListAndWatch feature gate on?): filtering on the client, which still receives and decodes every object"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_hash_is_64_bit_fnv_1a() {
        // The FNV reference vectors.
        assert_eq!(shard_hash(""), 0xcbf29ce484222325);
        assert_eq!(shard_hash("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(shard_hash("foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn a_selector_prints_in_the_servers_grammar_and_parses_back() {
        let halves: Vec<ShardSelector> = (0..2)
            .map(|i| {
                ShardSelector::new(ShardField::Uid, [HashRange::split(i, 2).unwrap()]).unwrap()
            })
            .collect();
        assert_eq!(
            halves[1].to_string(),
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000')"
        );
        let two = ShardSelector::new(
            ShardField::Namespace,
            [
                HashRange::split(0, 4).unwrap(),
                HashRange::split(2, 4).unwrap(),
            ],
        )
        .unwrap();
        let printed = two.to_string();
        assert_eq!(
            printed,
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000') || shardRange(object.metadata.namespace, '0x8000000000000000', '0xc000000000000000')"
        );
        assert_eq!(printed.parse::<ShardSelector>().unwrap(), two);
        for h in &halves {
            assert_eq!(h.to_string().parse::<ShardSelector>().unwrap(), *h);
        }
    }

    #[test]
    fn adjacent_ranges_merge_and_the_splits_of_n_cover_the_space_once() {
        for n in [1, 3, 7, 64] {
            let all = ShardSelector::new(
                ShardField::Uid,
                (0..n).map(|i| HashRange::split(i, n).unwrap()),
            )
            .unwrap();
            assert_eq!(
                all.ranges(),
                &[HashRange::new(0, HASH_SPACE_END).unwrap()],
                "{n}"
            );
            for v in ["", "a", "0b6d3c1e-uid", "default"] {
                let h = shard_hash(v);
                let owners = (0..n)
                    .filter(|&i| HashRange::split(i, n).unwrap().contains(h))
                    .count();
                assert_eq!(owners, 1, "{v} in {n} shards");
            }
        }
    }

    #[test]
    fn bad_selectors_are_refused_naming_what_is_wrong() {
        for (s, needle) in [
            (
                "shardRange(object.metadata.uid, '0x0', '0x8000000000000000')",
                "16 lower-case",
            ),
            (
                "shardRange(object.metadata.name, '0x0000000000000000', '0x8000000000000000')",
                "cannot shard on",
            ),
            (
                "shardRange(object.metadata.uid, '0x8000000000000000', '0x8000000000000000')",
                "start < end",
            ),
            (
                "shardRange(object.metadata.uid, '0x000000000000000A', '0x8000000000000000')",
                "16 lower-case",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') || shardRange(object.metadata.namespace, '0x0000000000000000', '0x8000000000000000')",
                "same field",
            ),
            (
                "shardRange(object.metadata.uid, '0x0000000000000000', '0x8000000000000000') && true",
                "each term",
            ),
        ] {
            let e = s.parse::<ShardSelector>().unwrap_err().to_string();
            assert!(e.contains(needle), "{s}: {e}");
        }
        assert_eq!(
            ShardSelector::new(ShardField::Uid, []),
            Err(ShardSelectorError::Empty)
        );
        assert!(HashRange::split(2, 2).is_err());
        assert!(HashRange::new(1, HASH_SPACE_END + 1).is_err());
    }
}
