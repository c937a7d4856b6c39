//! A serde `Deserializer` over Kubernetes protobuf bytes, driven by the
//! schema: k8s-openapi's own `Deserialize` impls read a message as the map
//! its JSON would be, with the same keys present and the same values.
//!
//! JSON and protobuf differ in what they leave out, and the schema knows the
//! Go tags that decide it: a value (non-pointer) scalar is always in the
//! bytes, but JSON leaves it out when it is zero and tagged `omitempty`, so
//! such a field is skipped here too; a pointer is in the bytes exactly when
//! set, and then in the JSON whatever its value. Zero times and empty raw
//! extensions are JSON `null`, so they are skipped. Unknown field numbers
//! (a newer server) are skipped, as JSON decoding ignores unknown keys.
//!
//! What the server stores, this decodes as its JSON encoding shows it:
//! - A string that is not UTF-8 (protobuf strings are bytes, and a Go
//!   client can write any) has each byte that does not start a valid
//!   sequence replaced by U+FFFD, as Go's `encoding/json` writes it.
//! - Messages nest as deep as the bytes say, on a stack that grows
//!   ([`stacker`]) rather than the thread's: Go's stacks grow, so the server
//!   writes and client-go reads objects deeper than a thread's stack holds
//!   in recursive Rust. Beyond [`MAX_NESTING`] levels, what the server
//!   accepts, the object is refused (with its name, by the caller), never
//!   an overflow. Embedded JSON nested deeper than a thread's stack takes
//!   makes the whole object decode again on a stack sized for it (see
//!   `top_level`).
//! - What one object decodes into is bounded: each message, string,
//!   number and raw JSON value is charged its estimated size in memory as
//!   it is decoded, and so are the decoder's scratch lists (a message's
//!   fields, a map's pairs, packed numbers), before they are built; an
//!   object over [`MAX_DECODED_BYTES`] is refused. An empty repeated
//!   message is 2 bytes on the wire and a whole k8s-openapi struct in
//!   memory, so without the bound one frame could ask for gigabytes. The
//!   estimate is within a factor of two of k8s-openapi's sizes (tested);
//!   a stack grown for deep nesting is not counted.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::generated::{MAPS, MESSAGES};
use super::schema::{Field, INLINE, Message, OMITEMPTY, OMITZERO, POINTER, REPEATED, Ty};

/// Protobuf bytes that do not decode into the object they should be, or a
/// type whose protobuf kinformer does not know: the deserializer's error,
/// an [`Error::Decode`](crate::Error::Decode) once out of the crate.
///
/// Its `source()` is the `serde_json::Error` when JSON embedded in the
/// protobuf (a custom resource's schema, a `RawExtension`) did not decode.
#[derive(Debug)]
pub(crate) struct DecodeError {
    message: String,
    json: Option<serde_json::Error>,
}

impl DecodeError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            json: None,
        }
    }

    /// The message alone.
    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The message and, when embedded JSON failed, serde's error.
    pub(crate) fn into_parts(self) -> (String, Option<serde_json::Error>) {
        (self.message, self.json)
    }

    /// The message, then its cause's (for an [`Undecodable`](crate::Undecodable),
    /// which keeps text only).
    pub(crate) fn with_cause(&self) -> String {
        match &self.json {
            Some(json) => format!("{}: {json}", self.message),
            None => self.message.clone(),
        }
    }
}

/// Two errors are equal when they say the same.
impl PartialEq for DecodeError {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for DecodeError {}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.json
            .as_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl de::Error for DecodeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self::new(msg.to_string())
    }
}

type Result<T, E = DecodeError> = std::result::Result<T, E>;

fn err<T>(what: impl fmt::Display) -> Result<T> {
    Err(DecodeError::new(what.to_string()))
}

/// One field occurrence as found in the bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raw<'de> {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    Bytes(&'de [u8]),
}

/// Reads a varint at `*pos`.
pub(crate) fn varint(buf: &[u8], pos: &mut usize) -> Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&byte) = buf.get(*pos) else {
            return err("truncated varint");
        };
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Ok(value);
        }
    }
    err("varint longer than 10 bytes")
}

/// Iterates the `(field number, value)` pairs of one message's bytes.
pub(crate) struct Fields<'de> {
    buf: &'de [u8],
    pos: usize,
}

impl<'de> Fields<'de> {
    pub(crate) fn new(buf: &'de [u8]) -> Self {
        Self { buf, pos: 0 }
    }
}

impl<'de> Iterator for Fields<'de> {
    type Item = Result<(u32, Raw<'de>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.buf.len() {
            return None;
        }
        Some(self.read())
    }
}

impl<'de> Fields<'de> {
    fn read(&mut self) -> Result<(u32, Raw<'de>)> {
        let tag = varint(self.buf, &mut self.pos)?;
        let number = u32::try_from(tag >> 3).or_else(|_| err("field number out of range"))?;
        let raw = match tag & 7 {
            0 => Raw::Varint(varint(self.buf, &mut self.pos)?),
            1 => Raw::Fixed64(u64::from_le_bytes(
                self.take(8)?.try_into().unwrap_or([0; 8]),
            )),
            2 => {
                let len = varint(self.buf, &mut self.pos)?;
                let len = usize::try_from(len).or_else(|_| err("length out of range"))?;
                Raw::Bytes(self.take(len)?)
            }
            5 => Raw::Fixed32(u32::from_le_bytes(
                self.take(4)?.try_into().unwrap_or([0; 4]),
            )),
            w => return err(format!("field {number}: unsupported wire type {w}")),
        };
        Ok((number, raw))
    }

    fn take(&mut self, n: usize) -> Result<&'de [u8]> {
        let end = self.pos.checked_add(n).filter(|e| *e <= self.buf.len());
        let Some(end) = end else {
            return err(format!(
                "truncated: {n} bytes wanted at offset {}",
                self.pos
            ));
        };
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
}

/// Deserializes message `message` (an index into `MESSAGES`) from `bytes`.
pub(crate) fn from_message<'de, T: de::Deserialize<'de>>(
    message: u16,
    bytes: &'de [u8],
) -> Result<T> {
    let message = message_at(message)?;
    top_level(|| {
        T::deserialize(MessageDe {
            message,
            bytes,
            drop_managed_fields: false,
            type_meta: None,
        })
    })
}

/// `ObjectMeta.managedFields`.
const MANAGED_FIELDS: u32 = 17;

/// Deserializes an object of message `message` from `bytes`, leaving out its
/// own `metadata.managedFields` (only the top-level object's) when
/// `drop_managed_fields`: they are skipped, never decoded. `type_meta`, if
/// given, is presented as its `apiVersion` and `kind`: for the kinds whose
/// JSON carries them on every object, list items included
/// (`PartialObjectMetadata`), where the protobuf message does not.
pub(crate) fn from_typed_object<'de, T: de::Deserialize<'de>>(
    message: u16,
    bytes: &'de [u8],
    drop_managed_fields: bool,
    type_meta: Option<(&'static str, &'static str)>,
) -> Result<T> {
    let message = message_at(message)?;
    top_level(|| {
        T::deserialize(MessageDe {
            message,
            bytes,
            drop_managed_fields,
            type_meta,
        })
    })
}

/// One top-level decode, with fresh limits. Embedded JSON (a raw
/// extension, `fieldsV1`, a schema's `default`) may nest deeper than its
/// visitor can take on a thread's stack, and serde may replay it
/// recursively later (`PartialObjectMeta` buffers its flattened fields),
/// out of reach of [`nested`]'s growing stack: such a decode is abandoned
/// and done again from the start on a stack deep enough for the deepest
/// JSON the server sends.
fn top_level<T>(decode: impl Fn() -> Result<T>) -> Result<T> {
    let scope = Scope::enter();
    match decode() {
        Err(_) if DEEP_JSON.get() > 0 => {
            drop(scope);
            let _scope = Scope::enter();
            DEEP_STACK.set(true);
            crate::deep::on_stack_for(crate::deep::MAX_JSON_NESTING, decode)
        }
        done => done,
    }
}

/// The deepest nesting of messages decoded: what the server accepts. Go's
/// JSON decoder stops at 10 000 levels of JSON, which is about 5 000
/// levels of a schema's `properties`, each one message here; a CRD nested
/// deeper in protobuf is stored, but the server cannot read it back.
pub const MAX_NESTING: u32 = 5_100;

/// The most one object may decode into, as estimated while decoding (the
/// in-memory size of each message, string and element): 256 MiB, over a
/// hundred times what the largest object etcd stores by default (1.5 MiB)
/// decodes into when it is made of ordinary fields.
pub const MAX_DECODED_BYTES: u64 = 256 << 20;

/// Stack left below which a nested message is decoded on a new segment,
/// and the size of that segment: one level of nesting (this deserializer
/// and k8s-openapi's visitor of a large struct) takes tens of KiB in a
/// debug build.
const RED_ZONE: usize = 256 << 10;
const STACK_SEGMENT: usize = 8 << 20;

/// Runs `f` on a stack with at least [`RED_ZONE`] left, growing it onto a
/// new segment when the current one is nearly used up.
pub(crate) fn with_stack<R>(f: impl FnOnce() -> R) -> R {
    stacker::maybe_grow(RED_ZONE, STACK_SEGMENT, f)
}

thread_local! {
    /// The nesting depth and the bytes left to decode into, of the object
    /// this thread decodes now (the decode is synchronous, one per thread).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
    static BUDGET: Cell<u64> = const { Cell::new(MAX_DECODED_BYTES) };
    /// The deepest embedded JSON met that the stack could not take (0: none).
    static DEEP_JSON: Cell<usize> = const { Cell::new(0) };
    /// Whether this decode runs on a stack deep enough for any JSON.
    static DEEP_STACK: Cell<bool> = const { Cell::new(false) };
}

/// One top-level decode: fresh limits, and the caller's restored after.
struct Scope {
    depth: u32,
    budget: u64,
    deep_json: usize,
    deep_stack: bool,
}

impl Scope {
    fn enter() -> Self {
        Self {
            depth: DEPTH.replace(0),
            budget: BUDGET.replace(MAX_DECODED_BYTES),
            deep_json: DEEP_JSON.replace(0),
            deep_stack: DEEP_STACK.replace(false),
        }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        DEPTH.set(self.depth);
        BUDGET.set(self.budget);
        DEEP_JSON.set(self.deep_json);
        DEEP_STACK.set(self.deep_stack);
    }
}

/// Charges `bytes` of decoded memory to the object being decoded.
fn charge(bytes: u64) -> Result<()> {
    let left = BUDGET.get();
    if bytes > left {
        BUDGET.set(0);
        return err(format!(
            "the object decodes into more than {MAX_DECODED_BYTES} bytes (the limit of one \
             object; its encoding is made of many small or empty elements)"
        ));
    }
    BUDGET.set(left - bytes);
    Ok(())
}

/// Decodes one nested message with `f`: one level deeper, charged the
/// message's size in memory, on a stack that grows.
fn nested<R>(message: u16, f: impl FnOnce() -> Result<R>) -> Result<R> {
    let depth = DEPTH.get() + 1;
    if depth > MAX_NESTING {
        return err(format!(
            "messages nested more than {MAX_NESTING} levels deep"
        ));
    }
    charge(inline_size(message))?;
    DEPTH.set(depth);
    let out = with_stack(f);
    DEPTH.set(depth - 1);
    out
}

/// What a message takes in memory before any of its strings, elements or
/// entries: k8s-openapi lays each field out inline (an `Option` of a
/// struct holds the whole struct), so that is the sum of its fields',
/// nested single messages included; a message met again inside itself is
/// boxed (a pointer).
fn inline_size(message: u16) -> u64 {
    static SIZES: OnceLock<Vec<u64>> = OnceLock::new();
    let sizes = SIZES.get_or_init(|| {
        let mut memo = vec![None; MESSAGES.len()];
        (0..MESSAGES.len())
            .map(|m| size_of_message(m, &mut memo, &mut Vec::new()))
            .collect()
    });
    sizes.get(usize::from(message)).copied().unwrap_or(0)
}

fn size_of_message(m: usize, memo: &mut [Option<u64>], open: &mut Vec<usize>) -> u64 {
    if let Some(size) = memo[m] {
        return size;
    }
    if open.contains(&m) {
        return 8; // recursive: a Box
    }
    open.push(m);
    let mut size = 0;
    for field in MESSAGES[m].fields {
        size += match field.ty {
            _ if field.flags & REPEATED != 0 => 24,
            Ty::Map(_) | Ty::String | Ty::Bytes | Ty::Time | Ty::MicroTime | Ty::Quantity => 24,
            Ty::IntOrString | Ty::RawJson => 32,
            Ty::Bool => 1,
            Ty::Int32 | Ty::Int64 | Ty::Float64 => 16,
            Ty::Message(n) => size_of_message(usize::from(n), memo, open),
        };
    }
    open.pop();
    memo[m] = Some(size);
    size
}

/// The largest ratio of decoded memory to wire bytes any message allows:
/// an empty occurrence of it in a repeated field (2 bytes) against its
/// size in memory. For docs and tests.
#[cfg(test)]
pub(crate) fn worst_ratio() -> (u64, &'static str) {
    (0..MESSAGES.len())
        .filter_map(|m| u16::try_from(m).ok())
        .map(|m| (inline_size(m) / 2, MESSAGES[usize::from(m)].name))
        .max()
        .unwrap_or((0, ""))
}

fn message_at(index: u16) -> Result<&'static Message> {
    MESSAGES
        .get(usize::from(index))
        .map_or_else(|| err(format!("no message {index} in the schema")), Ok)
}

/// A message as a map.
struct MessageDe<'de> {
    message: &'static Message,
    bytes: &'de [u8],
    /// Leave out `metadata.managedFields`.
    drop_managed_fields: bool,
    /// `apiVersion` and `kind` to present first.
    type_meta: Option<(&'static str, &'static str)>,
}

/// The fields present in a message (with those of inlined messages), each
/// field's occurrences together, ready to be read as a map.
struct MessageAccess<'de> {
    entries: Vec<(&'static Field, Raw<'de>)>,
    next: usize,
    /// The occurrences of the field whose key was read last.
    value: (usize, usize),
    /// Leave out `metadata.managedFields` (this is the top-level object).
    drop_managed_fields: bool,
    /// `apiVersion` and `kind` entries still to present, and the value of
    /// the one whose key was read last.
    type_meta: Vec<(&'static str, &'static str)>,
    type_value: Option<&'static str>,
}

fn scan<'de>(
    message: &'static Message,
    bytes: &'de [u8],
    skip: u32,
    out: &mut Vec<(&'static Field, Raw<'de>)>,
) -> Result<()> {
    for field in Fields::new(bytes) {
        let (number, raw) = field?;
        if number == skip {
            continue;
        }
        let Ok(i) = message.fields.binary_search_by_key(&number, |f| f.number) else {
            continue; // a field this schema does not know: ignored, as JSON decoding does
        };
        let field = &message.fields[i];
        if field.flags & INLINE != 0 {
            let (Ty::Message(m), Raw::Bytes(b)) = (field.ty, raw) else {
                return err(format!(
                    "{}: inlined field {number} is not a message",
                    message.name
                ));
            };
            scan(message_at(m)?, b, 0, out)?;
        } else {
            out.push((field, raw));
        }
    }
    Ok(())
}

impl<'de> MessageAccess<'de> {
    /// The fields of `bytes`, less field number `skip` (0: none).
    fn new(message: &'static Message, bytes: &'de [u8], skip: u32) -> Result<Self> {
        let mut entries = Vec::with_capacity(message.fields.len());
        scan(message, bytes, skip, &mut entries)?;
        // The scratch list of fields counts against the object's budget.
        charge((entries.len() * size_of::<(&Field, Raw<'_>)>()) as u64)?;
        // A field's occurrences must be adjacent; Go writes them so, in
        // field order, but any order is valid protobuf. A stable sort keeps
        // each field's elements in their order.
        let ordered = entries
            .windows(2)
            .all(|w| std::ptr::eq(w[0].0, w[1].0) || w[0].0.number < w[1].0.number);
        if !ordered {
            entries.sort_by_key(|(f, _)| std::ptr::from_ref::<Field>(f) as usize);
        }
        Ok(Self {
            entries,
            next: 0,
            value: (0, 0),
            drop_managed_fields: false,
            type_meta: Vec::new(),
            type_value: None,
        })
    }
}

/// Whether JSON leaves this occurrence of a single (non-repeated) field out.
fn left_out(field: &Field, raw: Raw<'_>) -> bool {
    let zero = match (field.ty, raw) {
        (Ty::Time | Ty::MicroTime | Ty::RawJson, Raw::Bytes(b)) => {
            return b.is_empty() || raw_json_empty(field.ty, b);
        }
        (Ty::Message(_) | Ty::IntOrString | Ty::Quantity, _) => false,
        (_, Raw::Bytes(b)) => b.is_empty(),
        (_, Raw::Varint(v) | Raw::Fixed64(v)) => v == 0,
        (_, Raw::Fixed32(v)) => v == 0,
    };
    zero && field.flags & POINTER == 0 && field.flags & (OMITEMPTY | OMITZERO) != 0
}

/// A raw extension holding no bytes is JSON `null`.
fn raw_json_empty(ty: Ty, message: &[u8]) -> bool {
    ty == Ty::RawJson
        && !Fields::new(message).any(|f| matches!(f, Ok((1, Raw::Bytes(b))) if !b.is_empty()))
}

impl<'de> MapAccess<'de> for MessageAccess<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if let Some((key, value)) = self.type_meta.pop() {
            self.type_value = Some(value);
            return seed.deserialize(key.into_deserializer()).map(Some);
        }
        loop {
            let Some(&(field, _)) = self.entries.get(self.next) else {
                return Ok(None);
            };
            let start = self.next;
            let mut end = start + 1;
            while self
                .entries
                .get(end)
                .is_some_and(|(f, _)| std::ptr::eq(*f, field))
            {
                end += 1;
            }
            self.next = end;
            let single = field.flags & REPEATED == 0 && !matches!(field.ty, Ty::Map(_));
            // A single field that occurs twice: protobuf says the last one wins.
            if single && left_out(field, self.entries[end - 1].1) {
                continue;
            }
            self.value = (start, end);
            return seed.deserialize(field.json.into_deserializer()).map(Some);
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        if let Some(value) = self.type_value.take() {
            return seed.deserialize(value.into_deserializer());
        }
        let (start, end) = self.value;
        let field = self.entries[start].0;
        let occurrences = &self.entries[start..end];
        if let Ty::Map(m) = field.ty {
            let (key, value) = *MAPS
                .get(usize::from(m))
                .map_or_else(|| err(format!("no map {m} in the schema")), Ok)?;
            return seed.deserialize(MapDe {
                key,
                value,
                entries: occurrences,
            });
        }
        if field.flags & REPEATED != 0 {
            return seed.deserialize(SeqDe {
                ty: field.ty,
                occurrences,
            });
        }
        let skip = if self.drop_managed_fields && field.json == "metadata" {
            MANAGED_FIELDS
        } else {
            0
        };
        seed.deserialize(ValueDe {
            ty: field.ty,
            raw: occurrences[occurrences.len() - 1].1,
            skip,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.entries.len() - self.next + self.type_meta.len())
    }
}

impl<'de> de::Deserializer<'de> for MessageDe<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let mut access = MessageAccess::new(self.message, self.bytes, 0)?;
        access.drop_managed_fields = self.drop_managed_fields;
        if let Some((api_version, kind)) = self.type_meta {
            // Popped from the end: apiVersion first.
            access.type_meta = vec![("kind", kind), ("apiVersion", api_version)];
        }
        visitor.visit_map(access)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

/// A repeated field's elements as a sequence.
struct SeqDe<'a, 'de> {
    ty: Ty,
    occurrences: &'a [(&'static Field, Raw<'de>)],
}

impl<'de> de::Deserializer<'de> for SeqDe<'_, 'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let packed = !matches!(
            self.ty,
            Ty::String | Ty::Bytes | Ty::Message(_) | Ty::Map(_)
        ) && !matches!(self.ty, t if special(t));
        let mut elements = Vec::with_capacity(self.occurrences.len());
        for &(_, raw) in self.occurrences {
            match raw {
                // Packed scalars: one occurrence holds many (at most one
                // a byte), each a scratch element first.
                Raw::Bytes(b) if packed => {
                    charge((b.len() * size_of::<Raw<'_>>()) as u64)?;
                    let mut pos = 0;
                    while pos < b.len() {
                        elements.push(match self.ty {
                            Ty::Float64 => {
                                let chunk = b
                                    .get(pos..pos + 8)
                                    .map_or_else(|| err("truncated packed double"), Ok)?;
                                pos += 8;
                                Raw::Fixed64(u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8])))
                            }
                            _ => Raw::Varint(varint(b, &mut pos)?),
                        });
                    }
                }
                raw => elements.push(raw),
            }
        }
        visitor.visit_seq(Elements {
            ty: self.ty,
            elements: elements.into_iter(),
        })
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

fn special(ty: Ty) -> bool {
    matches!(
        ty,
        Ty::Time | Ty::MicroTime | Ty::IntOrString | Ty::Quantity | Ty::RawJson
    )
}

struct Elements<'de> {
    ty: Ty,
    elements: std::vec::IntoIter<Raw<'de>>,
}

impl<'de> SeqAccess<'de> for Elements<'de> {
    type Error = DecodeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        match self.elements.next() {
            Some(raw) => seed
                .deserialize(ValueDe {
                    ty: self.ty,
                    raw,
                    skip: 0,
                })
                .map(Some),
            None => Ok(None),
        }
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.elements.len())
    }
}

/// A Go map's entries (`{1: key, 2: value}` messages) as a map.
struct MapDe<'a, 'de> {
    key: Ty,
    value: Ty,
    entries: &'a [(&'static Field, Raw<'de>)],
}

impl<'de> de::Deserializer<'de> for MapDe<'_, 'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        charge((self.entries.len() * size_of::<(Raw<'_>, Raw<'_>)>()) as u64)?;
        let mut pairs = Vec::with_capacity(self.entries.len());
        for &(_, raw) in self.entries {
            let Raw::Bytes(entry) = raw else {
                return err("a map entry that is not a message");
            };
            let (mut key, mut value) = (None, None);
            for field in Fields::new(entry) {
                match field? {
                    (1, raw) => key = Some(raw),
                    (2, raw) => value = Some(raw),
                    _ => {}
                }
            }
            // An absent key or value is the type's zero value.
            pairs.push((
                key.unwrap_or(zero(self.key)),
                value.unwrap_or(zero(self.value)),
            ));
        }
        visitor.visit_map(Pairs {
            key: self.key,
            value: self.value,
            pairs: pairs.into_iter(),
            pending: None,
        })
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct newtype_struct seq tuple tuple_struct map struct enum
        identifier ignored_any
    }
}

fn zero(ty: Ty) -> Raw<'static> {
    match ty {
        Ty::Float64 => Raw::Fixed64(0),
        Ty::Bool | Ty::Int32 | Ty::Int64 => Raw::Varint(0),
        _ => Raw::Bytes(&[]),
    }
}

struct Pairs<'de> {
    key: Ty,
    value: Ty,
    pairs: std::vec::IntoIter<(Raw<'de>, Raw<'de>)>,
    pending: Option<Raw<'de>>,
}

impl<'de> MapAccess<'de> for Pairs<'de> {
    type Error = DecodeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        let Some((key, value)) = self.pairs.next() else {
            return Ok(None);
        };
        self.pending = Some(value);
        seed.deserialize(ValueDe {
            ty: self.key,
            raw: key,
            skip: 0,
        })
        .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        let raw = self
            .pending
            .take()
            .map_or_else(|| err("a map value without its key"), Ok)?;
        seed.deserialize(ValueDe {
            ty: self.value,
            raw,
            skip: 0,
        })
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.pairs.len())
    }
}

/// One value of type `ty`.
struct ValueDe<'de> {
    ty: Ty,
    raw: Raw<'de>,
    /// A field number to leave out of the message (0: none).
    skip: u32,
}

impl<'de> ValueDe<'de> {
    fn bytes(&self) -> Result<&'de [u8]> {
        match self.raw {
            Raw::Bytes(b) => Ok(b),
            other => err(format!(
                "expected length-delimited bytes for {:?}, got {other:?}",
                self.ty
            )),
        }
    }

    fn number(&self) -> Result<u64> {
        match self.raw {
            Raw::Varint(v) | Raw::Fixed64(v) => Ok(v),
            Raw::Fixed32(v) => Ok(u64::from(v)),
            Raw::Bytes(_) => err(format!("expected a number for {:?}, got bytes", self.ty)),
        }
    }
}

/// `bytes` as text, as Go's `encoding/json` writes a string: each byte
/// that does not start a valid UTF-8 sequence becomes U+FFFD (one per
/// byte, where Rust's `from_utf8_lossy` writes one per invalid sequence).
pub(crate) fn go_lossy_utf8(bytes: &[u8]) -> Cow<'_, str> {
    let first = match std::str::from_utf8(bytes) {
        Ok(text) => return Cow::Borrowed(text),
        Err(e) => e,
    };
    let mut out = String::with_capacity(bytes.len() + 2);
    let mut rest = bytes;
    let mut valid_up_to = first.valid_up_to();
    loop {
        let (valid, invalid) = rest.split_at(valid_up_to);
        out.push_str(std::str::from_utf8(valid).unwrap_or_default());
        if invalid.is_empty() {
            return Cow::Owned(out);
        }
        out.push('\u{FFFD}');
        rest = &invalid[1..];
        valid_up_to = match std::str::from_utf8(rest) {
            Ok(_) => rest.len(),
            Err(e) => e.valid_up_to(),
        };
    }
}

/// Hands `bytes` to `visitor` as a string (see [`go_lossy_utf8`]).
fn visit_text<'de, V: Visitor<'de>>(bytes: &'de [u8], visitor: V) -> Result<V::Value> {
    charge(bytes.len() as u64)?;
    match go_lossy_utf8(bytes) {
        Cow::Borrowed(text) => visitor.visit_borrowed_str(text),
        Cow::Owned(text) => visitor.visit_string(text),
    }
}

impl<'de> de::Deserializer<'de> for ValueDe<'de> {
    type Error = DecodeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.ty {
            Ty::String => visit_text(self.bytes()?, visitor),
            Ty::Bytes => {
                let bytes = self.bytes()?;
                charge(bytes.len() as u64 * 4 / 3 + 24)?;
                visitor.visit_string(base64(bytes))
            }
            Ty::Bool => visitor.visit_bool(self.number()? != 0),
            // int32 and int64 are sign-extended to 64 bits on the wire.
            Ty::Int32 | Ty::Int64 => {
                charge(8)?;
                visitor.visit_i64(self.number()? as i64)
            }
            Ty::Float64 => {
                charge(8)?;
                visitor.visit_f64(f64::from_bits(self.number()?))
            }
            Ty::Message(m) => {
                let message = message_at(m)?;
                let bytes = self.bytes()?;
                nested(m, || {
                    if is_value_message(message) {
                        return value_of(message, bytes, visitor);
                    }
                    visitor.visit_map(MessageAccess::new(message, bytes, self.skip)?)
                })
            }
            Ty::Map(_) => err("a map value outside a map field"),
            Ty::Time => visitor.visit_string(time(self.bytes()?, false)?),
            Ty::MicroTime => visitor.visit_string(time(self.bytes()?, true)?),
            Ty::IntOrString => {
                let (mut kind, mut int, mut string) = (0, 0i64, &[][..]);
                for field in Fields::new(self.bytes()?) {
                    match field? {
                        (1, Raw::Varint(v)) => kind = v,
                        (2, Raw::Varint(v)) => int = v as i32 as i64,
                        (3, Raw::Bytes(b)) => string = b,
                        _ => {}
                    }
                }
                if kind == 1 {
                    visit_text(string, visitor)
                } else {
                    visitor.visit_i64(int)
                }
            }
            Ty::Quantity => {
                let mut string = &[][..];
                for field in Fields::new(self.bytes()?) {
                    if let (1, Raw::Bytes(b)) = field? {
                        string = b;
                    }
                }
                visit_text(string, visitor)
            }
            Ty::RawJson => {
                let mut json = &[][..];
                for field in Fields::new(self.bytes()?) {
                    if let (1, Raw::Bytes(b)) = field? {
                        json = b;
                    }
                }
                if json.is_empty() {
                    return visitor.visit_unit();
                }
                // A JSON value in memory is a few times its text.
                charge(json.len() as u64 * 4)?;
                let embedded = |e: serde_json::Error| DecodeError {
                    message: "embedded JSON".to_owned(),
                    json: Some(e),
                };
                if DEEP_STACK.get() {
                    crate::deep::nesting(json).map_err(embedded)?;
                    return crate::deep::deserialize_json_unbounded(json, visitor)
                        .map_err(embedded);
                }
                // As serde_json decodes it, on this stack; past its depth
                // limit, the whole object again on a deep stack (`top_level`).
                let mut de = serde_json::Deserializer::from_slice(json);
                match de::Deserializer::deserialize_any(&mut de, visitor)
                    .and_then(|v| de.end().map(|()| v))
                {
                    Err(e) if crate::deep::too_deep(&e) => {
                        DEEP_JSON.set(crate::deep::MAX_JSON_NESTING);
                        err("embedded JSON nested deeper than serde_json's limit")
                    }
                    decoded => decoded.map_err(embedded),
                }
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    /// A string read as an enum's unit variant, as serde_json reads one
    /// (kube's `Status.status` is the enum `StatusSummary`).
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _: &'static str,
        _: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        match self.ty {
            Ty::String => {
                let text = go_lossy_utf8(self.bytes()?).into_owned();
                visitor.visit_enum(IntoDeserializer::<DecodeError>::into_deserializer(text))
            }
            _ => self.deserialize_any(visitor),
        }
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier ignored_any
    }
}

/// Whether `message` stands for one of its fields' values rather than for
/// a JSON object: its fields have no JSON names (see `generated.rs`): a Go
/// named slice that go-to-protobuf wraps (`repeated items = 1`), or one of
/// apiextensions' `JSONSchemaPropsOr*` unions.
fn is_value_message(message: &Message) -> bool {
    !message.fields.is_empty()
        && message
            .fields
            .iter()
            .all(|f| f.json.is_empty() && f.flags & INLINE == 0)
}

/// The JSON value a value message stands for: that of its highest-numbered
/// field present in the bytes (a repeated one when it has an element), as
/// the unions' `MarshalJSON` choose; when none is, the zero of its first
/// field, or null if that is a pointer.
fn value_of<'de, V: Visitor<'de>>(
    message: &'static Message,
    bytes: &'de [u8],
    visitor: V,
) -> Result<V::Value> {
    let access = MessageAccess::new(message, bytes, 0)?;
    let last = access.entries.iter().map(|(f, _)| f.number).max();
    let chosen = match last {
        Some(n) => message.fields.iter().find(|f| f.number == n),
        None => message.fields.first(),
    };
    let Some(field) = chosen else {
        return visitor.visit_unit();
    };
    let occurrences: Vec<_> = access
        .entries
        .iter()
        .filter(|(f, _)| std::ptr::eq(*f, field))
        .copied()
        .collect();
    if field.flags & REPEATED != 0 {
        return de::Deserializer::deserialize_any(
            SeqDe {
                ty: field.ty,
                occurrences: &occurrences,
            },
            visitor,
        );
    }
    let raw = match occurrences.last() {
        Some(&(_, raw)) => raw,
        None if field.flags & POINTER != 0 => return visitor.visit_unit(),
        None => zero(field.ty),
    };
    de::Deserializer::deserialize_any(
        ValueDe {
            ty: field.ty,
            raw,
            skip: 0,
        },
        visitor,
    )
}

/// A `Time` or `MicroTime` (`{1: seconds, 2: nanos}`) as its JSON string:
/// RFC 3339 in UTC, to the second (`Time`) or with six fractional digits
/// (`MicroTime`), as metav1 marshals them.
fn time(message: &[u8], micro: bool) -> Result<String> {
    let (mut seconds, mut nanos) = (0i64, 0i64);
    for field in Fields::new(message) {
        match field? {
            (1, Raw::Varint(v)) => seconds = v as i64,
            (2, Raw::Varint(v)) => nanos = i64::from(v as i32),
            _ => {}
        }
    }
    // Go's JSON encoding refuses a time outside years 0-9999, and
    // k8s-openapi writes a year outside them in a form it cannot read back.
    const YEARS_0_TO_9999: std::ops::RangeInclusive<i64> = -62_167_219_200..=253_402_300_799;
    if !YEARS_0_TO_9999.contains(&seconds) {
        return err(format!("time {seconds} s is outside the years 0-9999"));
    }
    let at = k8s_openapi::jiff::Timestamp::from_second(seconds)
        .or_else(|e| err(format!("time {seconds} s out of range: {e}")))?;
    // jiff writes `YYYY-MM-DDTHH:MM:SSZ` for whole seconds.
    let mut text = at.to_string();
    if micro {
        text.pop();
        text.push_str(&format!(".{:06}Z", nanos.clamp(0, 999_999_999) / 1000));
    }
    Ok(text)
}

fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> shift & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ConfigMap, PodSpec};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps;

    use super::super::envelope::message_named;
    use super::*;

    fn put_varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    /// Field `number` holding `bytes` (length-delimited).
    fn ld(number: u64, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, number << 3 | 2);
        put_varint(&mut out, bytes.len() as u64);
        out.extend_from_slice(bytes);
        out
    }

    const SCHEMA: &str = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps";

    /// A schema whose `properties` nest `depth` levels: `{type: object,
    /// properties: {a: ...}}` down to `{type: string}`.
    fn deep_schema(depth: usize) -> Vec<u8> {
        let mut inner = ld(5, b"string");
        for _ in 0..depth {
            let entry = [ld(1, b"a"), ld(2, &inner)].concat();
            inner = [ld(5, b"object"), ld(29, &entry)].concat();
        }
        inner
    }

    fn depth_of(mut schema: &JSONSchemaProps) -> usize {
        let mut depth = 0;
        while let Some(next) = schema.properties.as_ref().and_then(|p| p.get("a")) {
            depth += 1;
            schema = next;
        }
        depth
    }

    /// Runs `f` on a thread of `stack` bytes, as a tokio worker or any
    /// thread a user makes would.
    fn on_stack<R: Send + 'static>(stack: usize, f: impl FnOnce() -> R + Send + 'static) -> R {
        std::thread::Builder::new()
            .stack_size(stack)
            .spawn(f)
            .unwrap()
            .join()
            .unwrap()
    }

    #[test]
    fn strings_that_are_not_utf8_read_as_gos_json_writes_them() {
        // Go replaces each byte that does not start a valid sequence, so a
        // truncated 4-byte sequence is three U+FFFD (Rust's lossy: one).
        for (bytes, text) in [
            (&b"plain"[..], "plain"),
            (b"a\xffb", "a\u{FFFD}b"),
            (b"\xf0\x9f\x98", "\u{FFFD}\u{FFFD}\u{FFFD}"),
            (b"\xed\xa0\x80", "\u{FFFD}\u{FFFD}\u{FFFD}"), // a surrogate
            (b"\xc0\xafx\xe2\x82\xac", "\u{FFFD}\u{FFFD}x\u{20AC}"), // overlong, then a valid euro
            (b"\xf0\x9f\x98\x80\xff", "\u{1F600}\u{FFFD}"),
        ] {
            assert_eq!(go_lossy_utf8(bytes), text, "{bytes:?}");
        }
    }

    #[test]
    fn a_config_map_with_bytes_that_are_not_utf8_decodes_with_replacement_characters() {
        // ConfigMap{metadata: {name: "c\xff"}, data: {"k\xfe": "v\xfd"}}
        let meta = ld(1, b"c\xff");
        let entry = [ld(1, b"k\xfe"), ld(2, b"v\xfd")].concat();
        let bytes = [ld(1, &meta), ld(2, &entry)].concat();
        let message = message_named("k8s.io.api.core.v1.ConfigMap").unwrap();
        let cm: ConfigMap = from_typed_object(message, &bytes, false, None).unwrap();
        assert_eq!(cm.metadata.name.as_deref(), Some("c\u{FFFD}"));
        assert_eq!(cm.data.unwrap()["k\u{FFFD}"], "v\u{FFFD}");
    }

    #[test]
    fn a_schema_nested_thousands_of_levels_decodes_on_a_small_stack() {
        // 5 000 levels of properties is about what the server accepts in
        // JSON (10 000 levels of nesting); before the stack grew, 80
        // aborted a debug build on a 2 MiB stack.
        let message = message_named(SCHEMA).unwrap();
        let bytes = deep_schema(5_000);
        let depth = on_stack(256 << 10, move || {
            let schema: JSONSchemaProps = from_message(message, &bytes).unwrap();
            let depth = depth_of(&schema);
            // Dropping recurses too: on a stack of its own.
            stacker::grow(256 << 20, move || drop(schema));
            depth
        });
        assert_eq!(depth, 5_000);
    }

    #[test]
    fn embedded_json_nested_as_deep_as_the_server_sends_decodes_on_a_small_stack() {
        // A schema's `default` (field 8, raw JSON) nested 10 000 levels: past
        // serde_json's limit, so the object is decoded again on a deep stack.
        let depth = crate::deep::MAX_JSON_NESTING - 16;
        let json = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        let bytes = [ld(5, b"array"), ld(8, &ld(1, json.as_bytes()))].concat();
        let message = message_named(SCHEMA).unwrap();
        let nested = on_stack(2 << 20, move || {
            let schema: JSONSchemaProps = from_message(message, &bytes).unwrap();
            let mut depth = 0;
            let mut v = &schema.default.as_ref().unwrap().0;
            while let Some(inner) = v.as_array().and_then(|a| a.first()) {
                depth += 1;
                v = inner;
            }
            // A Value this deep drops within 2 MiB (measured).
            drop(schema);
            depth
        });
        assert_eq!(nested, depth);
        // Shallow embedded JSON is read as it always was.
        let bytes = [ld(5, b"array"), ld(8, &ld(1, b"[[1]]"))].concat();
        let schema: JSONSchemaProps = from_message(message, &bytes).unwrap();
        assert_eq!(schema.default.unwrap().0, serde_json::json!([[1]]));
    }

    #[test]
    fn embedded_json_that_does_not_decode_is_the_errors_source() {
        use std::error::Error as _;
        let bytes = [ld(5, b"array"), ld(8, &ld(1, b"[1,"))].concat();
        let message = message_named(SCHEMA).unwrap();
        let e = from_message::<JSONSchemaProps>(message, &bytes).unwrap_err();
        assert_eq!(e.message(), "embedded JSON");
        let source = e.source().expect("the JSON error is the source");
        assert!(source.is::<serde_json::Error>(), "{source:?}");
        // Said once: in the source, not in the message.
        let error = crate::Error::from(e);
        assert_eq!(error.to_string(), "undecodable protobuf: embedded JSON");
        let json = error.source().expect("the JSON error is still the source");
        assert!(json.is::<serde_json::Error>(), "{json:?}");
    }

    #[test]
    fn a_schema_nested_deeper_than_the_limit_is_an_error_not_an_abort() {
        let message = message_named(SCHEMA).unwrap();
        let bytes = deep_schema(MAX_NESTING as usize + 1);
        let e = on_stack(256 << 10, move || {
            from_message::<JSONSchemaProps>(message, &bytes).unwrap_err()
        });
        assert!(e.to_string().contains("nested more than"), "{e}");
    }

    #[test]
    fn the_estimated_sizes_are_within_a_factor_of_two_of_k8s_openapis() {
        use k8s_openapi::api::core::v1::{Container, Pod};
        for (name, real) in [
            ("k8s.io.api.core.v1.Container", size_of::<Container>()),
            ("k8s.io.api.core.v1.PodSpec", size_of::<PodSpec>()),
            ("k8s.io.api.core.v1.Pod", size_of::<Pod>()),
            ("k8s.io.api.core.v1.ConfigMap", size_of::<ConfigMap>()),
            (SCHEMA, size_of::<JSONSchemaProps>()),
        ] {
            let estimate = inline_size(message_named(name).unwrap()) as usize;
            assert!(
                estimate >= real / 2 && estimate <= real * 2,
                "{name}: estimated {estimate}, k8s-openapi's {real}"
            );
        }
    }

    #[test]
    fn empty_repeated_messages_cannot_decode_into_more_than_the_limit() {
        // PodSpec{containers: [{}, {}, ...]}: 2 bytes each on the wire, a
        // whole Container each in memory.
        let (ratio, name) = worst_ratio();
        assert!(ratio > 100, "{ratio} for {name}");
        let container = inline_size(message_named("k8s.io.api.core.v1.Container").unwrap());
        let count = (MAX_DECODED_BYTES / container + 1) as usize;
        let bytes = ld(2, &[]).repeat(count);
        let message = message_named("k8s.io.api.core.v1.PodSpec").unwrap();
        let e = from_message::<PodSpec>(message, &bytes).unwrap_err();
        assert!(e.to_string().contains("decodes into more than"), "{e}");
        // Under the limit, the same decodes.
        let bytes = ld(2, &[]).repeat(1000);
        let spec: PodSpec = from_message(message, &bytes).unwrap();
        assert_eq!(spec.containers.len(), 1000);
    }

    #[test]
    fn base64_pads_as_the_standard_alphabet_does() {
        for (raw, encoded) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"\xff\xfe\xfd\xfc", "//79/A=="),
        ] {
            assert_eq!(base64(raw), encoded);
        }
    }

    #[test]
    fn times_are_rfc3339_to_the_second_or_the_microsecond() {
        // {1: 1700000000, 2: 123456789}
        let mut msg = vec![0x08];
        let mut v = 1_700_000_000u64;
        while v >= 0x80 {
            msg.push((v as u8) | 0x80);
            v >>= 7;
        }
        msg.push(v as u8);
        msg.push(0x10);
        let mut v = 123_456_789u64;
        while v >= 0x80 {
            msg.push((v as u8) | 0x80);
            v >>= 7;
        }
        msg.push(v as u8);
        assert_eq!(time(&msg, false).unwrap(), "2023-11-14T22:13:20Z");
        assert_eq!(time(&msg, true).unwrap(), "2023-11-14T22:13:20.123456Z");
    }

    #[test]
    fn times_outside_the_years_0_to_9999_are_refused_as_gos_json_refuses_them() {
        let at = |seconds: i64| {
            let mut msg = vec![0x08];
            put_varint(&mut msg, seconds as u64);
            time(&msg, false)
        };
        assert_eq!(at(-62_167_219_200).unwrap(), "0000-01-01T00:00:00Z");
        // The last second jiff holds (Go's last is a day later; between
        // them the object is refused as out of jiff's range).
        assert_eq!(at(253_402_207_200).unwrap(), "9999-12-30T22:00:00Z");
        assert!(at(253_402_300_799).is_err());
        for seconds in [-62_167_219_201, 253_402_300_800] {
            let e = at(seconds).unwrap_err();
            assert!(e.to_string().contains("outside the years 0-9999"), "{e}");
        }
    }

    #[test]
    fn truncated_bytes_are_an_error_not_a_panic() {
        let mut fields = Fields::new(&[0x0a, 0x05, b'a']);
        assert!(fields.next().unwrap().is_err());
        let mut pos = 0;
        assert!(varint(&[0xff; 11], &mut pos).is_err());
    }
}
