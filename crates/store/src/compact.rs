//! The compact form of a store: each object kept encoded, decoded on read.
//!
//! A decoded Kubernetes object is several times the size of its encoding:
//! k8s-openapi lays every optional field out inline (a `Container` is over
//! 2 KB before it holds anything), where the stripped JSON of a whole Pod is
//! about 1 KB. A compact store keeps, per key, the encoded bytes and the
//! index values computed when the object was written, so keys and index
//! lookups cost nothing more than in a store of objects, and decodes an
//! object only when it is read (`get`, `list`, `by_index`). An optional
//! bounded cache of decoded objects serves the keys read again and again
//! (a reconcile reading what its handler was just told about) without a
//! decode each time; the objects just written go into it first.
//!
//! The codec is a [`Codec`]; [`JsonCodec`] (serde_json over the type's own
//! `Serialize` and `Deserialize`) fits every k8s-openapi type, custom
//! resource and `DynamicObject`. A codec must read back what it wrote: the
//! store round-trips the first object it encodes and, if that fails, keeps
//! whole objects from then on and says why ([`CompactStats::disabled`]);
//! it also round-trips every later encoding the codec asks it to check
//! ([`Codec::needs_check`]), keeping whole an object that does not come
//! back the same. An object a codec cannot encode is kept whole, never
//! dropped.
//!
//! Why [`JsonCodec`] needs no check of every object: serde_json writes
//! strings and integers exactly, and floats as the shortest text that
//! reads back to the same bits (read with `float_roundtrip`, which the
//! workspace enables). What JSON cannot hold, it writes as `null`: a float
//! that is not finite (a Go client can write NaN into a protobuf
//! `float64`, which kinformer decodes as client-go does). So an encoding
//! without `null` reads back exactly, and one with it is checked. Nesting
//! deeper than serde_json reads back ([`JSON_MAX_NESTING`]) is refused
//! while encoding, so such an object is kept whole (and its encoding never
//! recurses deeper than that on the thread's stack).
//!
//! The decoded-object cache is the `lru` crate's `LruCache` behind one
//! mutex, keyed by the store's key and checked against a per-write version,
//! so a cached object is never served for a key written since.

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::BoxError;

/// Turns objects into bytes and back, for a compact store.
///
/// `decode(encode(obj))` must give back `obj`: the store checks it on the
/// first object (and keeps whole objects if it does not hold), and on every
/// encoding [`needs_check`](Self::needs_check) picks out (keeping that
/// object whole if it does not hold).
pub trait Codec<K>: Send + Sync {
    /// The bytes to keep for `obj`.
    fn encode(&self, obj: &K) -> Result<Vec<u8>, BoxError>;
    /// The object `bytes` (from [`encode`](Self::encode)) stand for.
    fn decode(&self, bytes: &[u8]) -> Result<K, BoxError>;
    /// Whether `encoded` (what [`encode`](Self::encode) just wrote) may not
    /// read back the same, and must be checked before the store relies on
    /// it. None by default: the codec reads back everything it writes.
    fn needs_check(&self, encoded: &[u8]) -> bool {
        let _ = encoded;
        false
    }
}

/// The deepest nesting of JSON arrays and objects [`JsonCodec`] writes:
/// below serde_json's own limit on reading (128), so everything it writes
/// it reads back. An object nested deeper is not encoded (a compact store
/// keeps it whole).
pub const JSON_MAX_NESTING: usize = 100;

/// JSON through the type's own serde implementations: fits every
/// k8s-openapi type, custom resource and `DynamicObject`. Floats read back
/// bit for bit; an encoding holding `null` (which is how a float that is
/// not finite is written, as well as a real null) is checked by the store.
#[derive(Debug, Clone, Copy, Default)]
pub struct JsonCodec;

impl<K: Serialize + DeserializeOwned + 'static> Codec<K> for JsonCodec {
    fn encode(&self, obj: &K) -> Result<Vec<u8>, BoxError> {
        let mut out = Vec::with_capacity(512);
        let mut serializer = serde_json::Serializer::with_formatter(&mut out, DepthLimited(0));
        obj.serialize(&mut serializer)?;
        Ok(out)
    }

    fn decode(&self, bytes: &[u8]) -> Result<K, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }

    fn needs_check(&self, encoded: &[u8]) -> bool {
        // A null value follows a colon, a bracket or a comma (the compact
        // output has no spaces); inside a string it is only a false alarm.
        encoded
            .windows(5)
            .any(|w| matches!(w, [b':' | b'[' | b',', b'n', b'u', b'l', b'l']))
    }
}

/// serde_json's compact output, refusing to nest deeper than
/// [`JSON_MAX_NESTING`].
struct DepthLimited(usize);

impl DepthLimited {
    fn open<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.0 += 1;
        if self.0 > JSON_MAX_NESTING {
            return Err(std::io::Error::other(format!(
                "nested more than {JSON_MAX_NESTING} levels deep"
            )));
        }
        writer.write_all(bracket)
    }

    fn close<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        bracket: &[u8],
    ) -> std::io::Result<()> {
        self.0 = self.0.saturating_sub(1);
        writer.write_all(bracket)
    }
}

impl serde_json::ser::Formatter for DepthLimited {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"]")
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.open(writer, b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.close(writer, b"}")
    }
}

/// How a compact store encodes its objects and how many decoded objects it
/// keeps at hand.
///
/// A compact store keeps, per key, the object's encoding and the index
/// values computed when it was written, so keys and index lookups cost what
/// they cost for whole objects; it decodes an object when it is read (`get`,
/// `list`, `by_index`), after releasing its lock. A decoded Kubernetes
/// object is several times the size of its encoding (k8s-openapi lays every
/// optional field out inline), so the store holds far less. The optional
/// decoded-object cache keeps the objects most recently written or read,
/// each checked against the version of the write it came from. The store
/// round-trips the first object it encodes: a codec that does not read it
/// back disables compaction for the store ([`CompactStats::disabled`]); an
/// object the codec cannot encode is kept whole.
///
/// ```
/// use k8s_openapi::api::core::v1::Pod;
/// use kinformer_store::{Compact, Indexer, namespace_indexers};
///
/// // Pods kept as JSON bytes; the 1 000 most recently used kept decoded too.
/// let indexer = Indexer::<Pod>::compact(namespace_indexers(), Compact::json().decoded_cache(1000));
/// assert!(indexer.compact_stats().is_some());
/// ```
pub struct Compact<K> {
    pub(crate) codec: Arc<dyn Codec<K>>,
    pub(crate) decoded_capacity: usize,
    release_after_list: bool,
}

impl<K> Clone for Compact<K> {
    fn clone(&self) -> Self {
        Self {
            codec: Arc::clone(&self.codec),
            decoded_capacity: self.decoded_capacity,
            release_after_list: self.release_after_list,
        }
    }
}

impl<K> std::fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compact")
            .field("decoded_capacity", &self.decoded_capacity)
            .finish_non_exhaustive()
    }
}

impl<K: Serialize + DeserializeOwned + 'static> Compact<K> {
    /// Objects kept as JSON ([`JsonCodec`]), no decoded-object cache.
    pub fn json() -> Self {
        Self::with_codec(JsonCodec)
    }
}

impl<K> Compact<K> {
    /// Objects kept in `codec`'s encoding, no decoded-object cache.
    pub fn with_codec(codec: impl Codec<K> + 'static) -> Self {
        Self {
            codec: Arc::new(codec),
            decoded_capacity: 0,
            release_after_list: true,
        }
    }

    /// Keeps up to `capacity` decoded objects, the most recently written or
    /// read; 0 (the default) keeps none.
    #[must_use]
    pub fn decoded_cache(mut self, capacity: usize) -> Self {
        self.decoded_capacity = capacity;
        self
    }

    /// Whether an informer with this cache, once it has applied a whole
    /// list, asks the allocator to return the memory it freed to the system
    /// (on Linux with glibc; `true` by default). A list is decoded whole
    /// before it is encoded into the cache; glibc keeps most of that freed
    /// peak, several times the compact cache itself, unless asked.
    #[must_use]
    pub fn release_after_list(mut self, release: bool) -> Self {
        self.release_after_list = release;
        self
    }

    /// See [`release_after_list`](Self::release_after_list).
    pub fn releases_after_list(&self) -> bool {
        self.release_after_list
    }
}

/// What a compact store holds and how its reads went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompactStats {
    /// Objects held encoded.
    pub encoded_objects: usize,
    /// The bytes of their encodings, together.
    pub encoded_bytes: usize,
    /// Objects held whole: the codec could not encode them (or read one
    /// back), or compaction is disabled.
    pub whole_objects: usize,
    /// Decodes done to answer reads.
    pub decodes: u64,
    /// Reads answered from the decoded-object cache.
    pub decoded_cache_hits: u64,
    /// Reads that found bytes the codec could not decode; the object was
    /// left out of the answer (and the failure logged with its key). Such
    /// an object is invisible to reads, so an informer cannot hand its last
    /// state to a delete handler either; the round-trip checks make this a
    /// codec bug, not a data condition, for [`JsonCodec`].
    pub decode_failures: u64,
    /// Why the store keeps whole objects instead of encoding them: the
    /// codec did not read back the first object it encoded.
    pub disabled: Option<String>,
}

/// A stored object: whole, or as its encoding.
pub(crate) enum Stored<K> {
    Whole(Arc<K>),
    Encoded {
        bytes: Arc<[u8]>,
        /// Unique per write, so the decoded cache can tell a stale object.
        version: u64,
    },
}

impl<K> Clone for Stored<K> {
    fn clone(&self) -> Self {
        match self {
            Stored::Whole(obj) => Stored::Whole(Arc::clone(obj)),
            Stored::Encoded { bytes, version } => Stored::Encoded {
                bytes: Arc::clone(bytes),
                version: *version,
            },
        }
    }
}

impl<K> Stored<K> {
    /// Whether both are the one write: the same object, or the same bytes
    /// of the same write.
    pub(crate) fn same(&self, other: &Self) -> bool {
        match (self, other) {
            (Stored::Whole(a), Stored::Whole(b)) => Arc::ptr_eq(a, b),
            (
                Stored::Encoded { bytes, version },
                Stored::Encoded {
                    bytes: other_bytes,
                    version: other_version,
                },
            ) => version == other_version && Arc::ptr_eq(bytes, other_bytes),
            _ => false,
        }
    }
}

/// An object as a read under the store's lock found it.
pub(crate) enum Read<K> {
    /// Whole, or decoded already.
    Ready(Arc<K>),
    /// Its bytes, to decode once the lock is released.
    Undecoded {
        key: Arc<str>,
        bytes: Arc<[u8]>,
        version: u64,
    },
}

const UNCHECKED: u8 = 0;
const CHECKED: u8 = 1;
const DISABLED: u8 = 2;

type Lru<K> = lru::LruCache<Arc<str>, (u64, Arc<K>), foldhash::fast::RandomState>;

/// The codec, the decoded-object cache and the counters of a compact store.
pub(crate) struct CompactState<K> {
    codec: Arc<dyn Codec<K>>,
    decoded: Option<Mutex<Lru<K>>>,
    next_version: AtomicU64,
    round_trip: AtomicU8,
    disabled: Mutex<Option<String>>,
    decodes: AtomicU64,
    hits: AtomicU64,
    failures: AtomicU64,
}

impl<K> CompactState<K> {
    pub(crate) fn new(compact: Compact<K>) -> Self {
        Self {
            codec: compact.codec,
            decoded: NonZeroUsize::new(compact.decoded_capacity).map(|capacity| {
                Mutex::new(lru::LruCache::with_hasher(capacity, Default::default()))
            }),
            next_version: AtomicU64::new(0),
            round_trip: AtomicU8::new(UNCHECKED),
            disabled: Mutex::new(None),
            decodes: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        }
    }

    /// The form to store `obj` in: its encoding, or the object itself when
    /// the codec fails or compaction is disabled.
    pub(crate) fn store_form(&self, key: &str, obj: &Arc<K>) -> Stored<K> {
        if self.round_trip.load(Ordering::Acquire) == DISABLED {
            return Stored::Whole(Arc::clone(obj));
        }
        let bytes = match self.codec.encode(obj) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!(key, error = %e, "the compact store's codec cannot encode this object; it is kept whole");
                return Stored::Whole(Arc::clone(obj));
            }
        };
        if self.round_trip.load(Ordering::Acquire) == UNCHECKED {
            if let Err(why) = self.check_round_trip(&bytes) {
                tracing::error!(key, reason = %why, "the compact store's codec does not read back what it wrote; keeping whole objects");
                *self.disabled.lock() = Some(why);
                self.round_trip.store(DISABLED, Ordering::Release);
                return Stored::Whole(Arc::clone(obj));
            }
            self.round_trip.store(CHECKED, Ordering::Release);
        } else if self.codec.needs_check(&bytes)
            && let Err(why) = self.check_round_trip(&bytes)
        {
            tracing::warn!(key, reason = %why, "the compact store's codec does not read this object back; it is kept whole");
            return Stored::Whole(Arc::clone(obj));
        }
        Stored::Encoded {
            bytes: bytes.into(),
            version: self.next_version(),
        }
    }

    /// A version for a write, later than every one handed out before.
    pub(crate) fn next_version(&self) -> u64 {
        self.next_version.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the codec reads `bytes` back into an object that encodes to
    /// the same bytes.
    fn check_round_trip(&self, bytes: &[u8]) -> Result<(), String> {
        let decoded = self
            .codec
            .decode(bytes)
            .map_err(|e| format!("decoding its own encoding failed: {e}"))?;
        let again = self
            .codec
            .encode(&decoded)
            .map_err(|e| format!("encoding the decoded object failed: {e}"))?;
        if again == bytes {
            Ok(())
        } else {
            Err(format!(
                "the decoded object encodes differently ({} bytes, first {} bytes)",
                again.len(),
                bytes.len()
            ))
        }
    }

    /// Notes that `key` now holds `obj` as `stored`, in the decoded cache;
    /// returns the decoded object cached for the key before, with its version.
    pub(crate) fn written(
        &self,
        key: &Arc<str>,
        stored: &Stored<K>,
        obj: &Arc<K>,
    ) -> Option<(u64, Arc<K>)> {
        let (Some(decoded), Stored::Encoded { version, .. }) = (&self.decoded, stored) else {
            return None;
        };
        decoded
            .lock()
            .push(Arc::clone(key), (*version, Arc::clone(obj)))
            .filter(|(old_key, _)| old_key == key)
            .map(|(_, cached)| cached)
    }

    /// Forgets the decoded object of `key`.
    pub(crate) fn removed(&self, key: &str) {
        if let Some(decoded) = &self.decoded {
            decoded.lock().pop(key);
        }
    }

    /// Forgets every decoded object.
    pub(crate) fn cleared(&self) {
        if let Some(decoded) = &self.decoded {
            decoded.lock().clear();
        }
    }

    /// What a read of `key` finds in `stored`, under the store's lock: the
    /// object when it is whole, or `candidate` (a decoded object and its
    /// version, taken from the cache by the write that replaced it) or the
    /// decoded cache has this version; otherwise the bytes to decode once
    /// the lock is released ([`finish`](Self::finish)).
    pub(crate) fn read(
        &self,
        key: &Arc<str>,
        stored: &Stored<K>,
        candidate: Option<(u64, Arc<K>)>,
    ) -> Read<K> {
        let (bytes, version) = match stored {
            Stored::Whole(obj) => return Read::Ready(Arc::clone(obj)),
            Stored::Encoded { bytes, version } => (bytes, *version),
        };
        if let Some((v, obj)) = candidate
            && v == version
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Read::Ready(obj);
        }
        if let Some(decoded) = &self.decoded
            && let Some((v, obj)) = decoded.lock().get(key)
            && *v == version
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Read::Ready(Arc::clone(obj));
        }
        Read::Undecoded {
            key: Arc::clone(key),
            bytes: Arc::clone(bytes),
            version,
        }
    }

    /// The object of a [`read`](Self::read), decoding (and caching) it if
    /// need be. `None`, counted and logged, when the bytes do not decode.
    pub(crate) fn finish(&self, read: Read<K>) -> Option<Arc<K>> {
        let (key, bytes, version) = match read {
            Read::Ready(obj) => return Some(obj),
            Read::Undecoded {
                key,
                bytes,
                version,
            } => (key, bytes, version),
        };
        self.decodes.fetch_add(1, Ordering::Relaxed);
        match self.codec.decode(&bytes) {
            Ok(obj) => {
                let obj = Arc::new(obj);
                if let Some(decoded) = &self.decoded {
                    let mut decoded = decoded.lock();
                    // A write since the read may have cached a newer version.
                    let newer = decoded.peek(&key).is_some_and(|(v, _)| *v > version);
                    if !newer {
                        decoded.put(key, (version, Arc::clone(&obj)));
                    }
                }
                Some(obj)
            }
            Err(e) => {
                self.failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(key = %key, error = %e, "the compact store cannot decode the bytes it holds for this key; it is left out of the answer");
                None
            }
        }
    }

    /// The counters, with what `items` hold.
    pub(crate) fn stats<'a>(&self, items: impl Iterator<Item = &'a Stored<K>>) -> CompactStats
    where
        K: 'a,
    {
        let mut stats = CompactStats {
            decodes: self.decodes.load(Ordering::Relaxed),
            decoded_cache_hits: self.hits.load(Ordering::Relaxed),
            decode_failures: self.failures.load(Ordering::Relaxed),
            disabled: self.disabled.lock().clone(),
            ..CompactStats::default()
        };
        for stored in items {
            match stored {
                Stored::Whole(_) => stats.whole_objects += 1,
                Stored::Encoded { bytes, .. } => {
                    stats.encoded_objects += 1;
                    stats.encoded_bytes += bytes.len();
                }
            }
        }
        stats
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::atomic::AtomicBool;

    use k8s_openapi::api::core::v1::ConfigMap;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::{Indexers, ThreadSafeStore};

    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinition, CustomResourceDefinitionSpec, CustomResourceDefinitionVersion,
        CustomResourceValidation, JSONSchemaProps,
    };

    fn cm(name: &str, rv: &str, data: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("k".to_owned(), data.to_owned())])),
            ..ConfigMap::default()
        })
    }

    fn rv(obj: &ConfigMap) -> &str {
        obj.metadata.resource_version.as_deref().unwrap_or_default()
    }

    fn json_store(decoded: usize) -> ThreadSafeStore<ConfigMap> {
        ThreadSafeStore::compact(Indexers::new(), Compact::json().decoded_cache(decoded))
    }

    #[test]
    fn a_compact_store_holds_each_object_as_its_json_and_reads_it_back_equal() {
        let store = json_store(0);
        let a = cm("a", "1", "x");
        store.add("ns/a", Arc::clone(&a)).unwrap();
        let stats = store.compact_stats().unwrap();
        assert_eq!(stats.encoded_objects, 1);
        assert_eq!(stats.whole_objects, 0);
        assert_eq!(stats.encoded_bytes, serde_json::to_vec(&*a).unwrap().len());
        assert_eq!(*store.get("ns/a").unwrap(), *a);
        assert_eq!(*store.list()[0], *a);
        // No decoded cache: every read decodes.
        assert_eq!(store.compact_stats().unwrap().decodes, 2);
    }

    #[test]
    fn the_decoded_cache_serves_the_object_just_written_without_a_decode() {
        let store = json_store(10);
        let a = cm("a", "1", "x");
        store.add("ns/a", Arc::clone(&a)).unwrap();
        assert!(Arc::ptr_eq(&store.get("ns/a").unwrap(), &a));
        let stats = store.compact_stats().unwrap();
        assert_eq!((stats.decodes, stats.decoded_cache_hits), (0, 1));
    }

    #[test]
    fn an_update_hands_back_the_object_it_replaced_with_or_without_a_decoded_cache() {
        for decoded in [0, 1, 10] {
            let store = json_store(decoded);
            store.add("ns/a", cm("a", "1", "x")).unwrap();
            // With a cache of one, writing b evicts a: its previous is decoded.
            store.add("ns/b", cm("b", "1", "y")).unwrap();
            let upserted = store.upsert("ns/a", cm("a", "2", "z"));
            let previous = upserted.previous.expect("a was stored");
            assert_eq!(*previous, *cm("a", "1", "x"), "decoded cache of {decoded}");
            assert_eq!(rv(&store.get("ns/a").unwrap()), "2");
        }
    }

    #[test]
    fn a_decoded_object_is_never_served_for_a_key_written_since() {
        let store = json_store(10);
        store.add("ns/a", cm("a", "1", "x")).unwrap();
        let first = store.get("ns/a").unwrap();
        // A whole replace clears the cache; an upsert overwrites the entry;
        // either way the next read is the new object.
        store
            .replace([("ns/a".to_owned(), cm("a", "2", "y"))])
            .unwrap();
        assert_eq!(rv(&store.get("ns/a").unwrap()), "2");
        store.update("ns/a", cm("a", "3", "z")).unwrap();
        assert_eq!(rv(&store.get("ns/a").unwrap()), "3");
        assert_eq!(rv(&first), "1");
    }

    #[test]
    fn a_stale_decode_racing_a_write_is_not_served_afterwards() {
        // A reader took version 1's bytes under the lock; a write of version 2
        // lands before the reader's decode finishes and caches its result.
        let state = CompactState::new(Compact::<ConfigMap>::json().decoded_cache(10));
        let key: Arc<str> = Arc::from("ns/a");
        let v1 = state.store_form(&key, &cm("a", "1", "x"));
        let stale = state.read(&key, &v1, None);
        let v2_obj = cm("a", "2", "y");
        let v2 = state.store_form(&key, &v2_obj);
        state.written(&key, &v2, &v2_obj);
        assert_eq!(rv(&state.finish(stale).unwrap()), "1");
        let Read::Ready(now) = state.read(&key, &v2, None) else {
            panic!("version 2 is in the decoded cache");
        };
        assert_eq!(rv(&now), "2");
        // Even had the stale decode been cached, the version check refuses it.
        state
            .decoded
            .as_ref()
            .unwrap()
            .lock()
            .put(Arc::clone(&key), (0, cm("a", "1", "x")));
        assert!(matches!(
            state.read(&key, &v2, None),
            Read::Undecoded { .. }
        ));
    }

    /// Reads back a different object than it was given.
    struct Lossy;
    impl Codec<ConfigMap> for Lossy {
        fn encode(&self, obj: &ConfigMap) -> Result<Vec<u8>, BoxError> {
            Ok(serde_json::to_vec(obj)?)
        }
        fn decode(&self, bytes: &[u8]) -> Result<ConfigMap, BoxError> {
            let mut obj: ConfigMap = serde_json::from_slice(bytes)?;
            obj.data = None;
            Ok(obj)
        }
    }

    #[test]
    fn a_codec_that_does_not_read_back_what_it_wrote_disables_compaction_and_loses_nothing() {
        let store = ThreadSafeStore::compact(Indexers::new(), Compact::with_codec(Lossy));
        store.add("ns/a", cm("a", "1", "x")).unwrap();
        store.add("ns/b", cm("b", "1", "y")).unwrap();
        let stats = store.compact_stats().unwrap();
        assert_eq!((stats.encoded_objects, stats.whole_objects), (0, 2));
        assert!(
            stats
                .disabled
                .as_deref()
                .unwrap()
                .contains("encodes differently"),
            "{stats:?}"
        );
        assert_eq!(*store.get("ns/a").unwrap(), *cm("a", "1", "x"));
    }

    /// Refuses to encode objects whose data says "refuse"; decodes fail
    /// once `broken` is set.
    #[derive(Default)]
    struct Picky {
        broken: AtomicBool,
    }
    impl Codec<ConfigMap> for Arc<Picky> {
        fn encode(&self, obj: &ConfigMap) -> Result<Vec<u8>, BoxError> {
            if obj
                .data
                .as_ref()
                .and_then(|d| d.get("k"))
                .is_some_and(|v| v == "refuse")
            {
                return Err("refused".into());
            }
            Ok(serde_json::to_vec(obj)?)
        }
        fn decode(&self, bytes: &[u8]) -> Result<ConfigMap, BoxError> {
            if self.broken.load(Ordering::SeqCst) {
                return Err("broken".into());
            }
            Ok(serde_json::from_slice(bytes)?)
        }
    }

    #[test]
    fn an_object_the_codec_cannot_encode_is_kept_whole() {
        let store = ThreadSafeStore::compact(
            Indexers::new(),
            Compact::with_codec(Arc::new(Picky::default())),
        );
        store.add("ns/a", cm("a", "1", "x")).unwrap();
        store.add("ns/b", cm("b", "1", "refuse")).unwrap();
        let stats = store.compact_stats().unwrap();
        assert_eq!((stats.encoded_objects, stats.whole_objects), (1, 1));
        assert_eq!(*store.get("ns/b").unwrap(), *cm("b", "1", "refuse"));
        assert_eq!(store.list().len(), 2);
    }

    #[test]
    fn bytes_that_no_longer_decode_are_counted_and_left_out_of_reads() {
        let codec = Arc::new(Picky::default());
        let store =
            ThreadSafeStore::compact(Indexers::new(), Compact::with_codec(Arc::clone(&codec)));
        store.add("ns/a", cm("a", "1", "x")).unwrap();
        codec.broken.store(true, Ordering::SeqCst);
        assert!(store.get("ns/a").is_none());
        assert!(store.list().is_empty());
        assert_eq!(store.compact_stats().unwrap().decode_failures, 2);
        // The key is still known, and a write replaces the bytes.
        assert!(store.contains_key("ns/a"));
    }

    #[test]
    fn remove_drops_the_key_without_decoding() {
        let store = json_store(0);
        store.add("ns/a", cm("a", "1", "x")).unwrap();
        assert!(store.remove("ns/a"));
        assert!(!store.remove("ns/a"));
        assert_eq!(store.compact_stats().unwrap().decodes, 0);
        assert!(store.is_empty());
    }

    fn crd(name: &str, schema: JSONSchemaProps) -> Arc<CustomResourceDefinition> {
        Arc::new(CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: CustomResourceDefinitionSpec {
                versions: vec![CustomResourceDefinitionVersion {
                    name: "v1".into(),
                    schema: Some(CustomResourceValidation {
                        open_api_v3_schema: Some(schema),
                    }),
                    ..CustomResourceDefinitionVersion::default()
                }],
                ..CustomResourceDefinitionSpec::default()
            },
            status: None,
        })
    }

    fn schema_of(crd: &CustomResourceDefinition) -> &JSONSchemaProps {
        crd.spec.versions[0]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap()
    }

    fn crd_store() -> ThreadSafeStore<CustomResourceDefinition> {
        ThreadSafeStore::compact(Indexers::new(), Compact::json())
    }

    #[test]
    fn floats_read_back_bit_for_bit_from_a_compact_store() {
        let store = crd_store();
        // About one float in ten (1/11 among them) read back one ulp off
        // without serde_json's float_roundtrip.
        let floats: Vec<f64> = (1..200)
            .map(|n| 1.0 / f64::from(n))
            .chain([0.1 + 0.2, 1e-310, f64::MAX])
            .collect();
        for (i, &f) in floats.iter().enumerate() {
            let schema = JSONSchemaProps {
                maximum: Some(f),
                ..JSONSchemaProps::default()
            };
            store
                .add(&i.to_string(), crd(&i.to_string(), schema))
                .unwrap();
        }
        assert_eq!(store.compact_stats().unwrap().whole_objects, 0);
        for (i, &f) in floats.iter().enumerate() {
            let read = store.get(&i.to_string()).unwrap();
            assert_eq!(
                schema_of(&read).maximum.map(f64::to_bits),
                Some(f.to_bits()),
                "{f}"
            );
        }
    }

    #[test]
    fn a_later_object_json_cannot_hold_is_kept_whole_not_changed() {
        let store = crd_store();
        store
            .add("first", crd("first", JSONSchemaProps::default()))
            .unwrap();
        // NaN and infinity are written as null, which reads back as None.
        for (key, f) in [("nan", f64::NAN), ("inf", f64::INFINITY)] {
            let schema = JSONSchemaProps {
                maximum: Some(f),
                ..JSONSchemaProps::default()
            };
            store.add(key, crd(key, schema)).unwrap();
            let read = store.get(key).unwrap();
            assert_eq!(
                schema_of(&read).maximum.map(f64::to_bits),
                Some(f.to_bits()),
                "{key}"
            );
        }
        let stats = store.compact_stats().unwrap();
        assert_eq!((stats.encoded_objects, stats.whole_objects), (1, 2));
        assert_eq!(stats.disabled, None, "the store goes on compacting");
    }

    #[test]
    fn an_object_nested_deeper_than_json_reads_back_is_kept_whole() {
        let store = crd_store();
        store
            .add("first", crd("first", JSONSchemaProps::default()))
            .unwrap();
        let mut schema = JSONSchemaProps::default();
        for _ in 0..JSON_MAX_NESTING {
            schema = JSONSchemaProps {
                properties: Some(BTreeMap::from([("a".to_owned(), schema)])),
                ..JSONSchemaProps::default()
            };
        }
        store.add("deep", crd("deep", schema)).unwrap();
        let read = store.get("deep").unwrap();
        let mut depth = 0;
        let mut at = schema_of(&read);
        while let Some(next) = at.properties.as_ref().and_then(|p| p.get("a")) {
            depth += 1;
            at = next;
        }
        assert_eq!(depth, JSON_MAX_NESTING);
        let stats = store.compact_stats().unwrap();
        assert_eq!(
            (
                stats.encoded_objects,
                stats.whole_objects,
                stats.decode_failures
            ),
            (1, 1, 0)
        );
    }
}
