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

use std::fmt;

use serde::de::{self, DeserializeSeed, IntoDeserializer, MapAccess, SeqAccess, Visitor};

use super::generated::{MAPS, MESSAGES};
use super::schema::{Field, INLINE, Message, OMITEMPTY, OMITZERO, POINTER, REPEATED, Ty};

/// Protobuf bytes that do not decode into the object they should be, or a
/// type whose protobuf kinformer does not know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtobufError(pub(crate) String);

impl fmt::Display for ProtobufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtobufError {}

impl de::Error for ProtobufError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Self(msg.to_string())
    }
}

type Result<T, E = ProtobufError> = std::result::Result<T, E>;

fn err<T>(what: impl fmt::Display) -> Result<T> {
    Err(ProtobufError(what.to_string()))
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
    T::deserialize(MessageDe {
        message: message_at(message)?,
        bytes,
        drop_managed_fields: false,
        type_meta: None,
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
    T::deserialize(MessageDe {
        message: message_at(message)?,
        bytes,
        drop_managed_fields,
        type_meta,
    })
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
    type Error = ProtobufError;

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
    type Error = ProtobufError;

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
    type Error = ProtobufError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        let packed = !matches!(
            self.ty,
            Ty::String | Ty::Bytes | Ty::Message(_) | Ty::Map(_)
        ) && !matches!(self.ty, t if special(t));
        let mut elements = Vec::with_capacity(self.occurrences.len());
        for &(_, raw) in self.occurrences {
            match raw {
                // Packed scalars: one occurrence holds many.
                Raw::Bytes(b) if packed => {
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
    type Error = ProtobufError;

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
    type Error = ProtobufError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
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
    type Error = ProtobufError;

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

fn utf8(bytes: &[u8]) -> Result<&str> {
    std::str::from_utf8(bytes).or_else(|e| err(format!("a string that is not UTF-8: {e}")))
}

impl<'de> de::Deserializer<'de> for ValueDe<'de> {
    type Error = ProtobufError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.ty {
            Ty::String => visitor.visit_borrowed_str(utf8(self.bytes()?)?),
            Ty::Bytes => visitor.visit_string(base64(self.bytes()?)),
            Ty::Bool => visitor.visit_bool(self.number()? != 0),
            // int32 and int64 are sign-extended to 64 bits on the wire.
            Ty::Int32 | Ty::Int64 => visitor.visit_i64(self.number()? as i64),
            Ty::Float64 => visitor.visit_f64(f64::from_bits(self.number()?)),
            Ty::Message(m) => {
                let message = message_at(m)?;
                if is_value_message(message) {
                    return value_of(message, self.bytes()?, visitor);
                }
                visitor.visit_map(MessageAccess::new(message, self.bytes()?, self.skip)?)
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
                    visitor.visit_borrowed_str(utf8(string)?)
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
                visitor.visit_borrowed_str(utf8(string)?)
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
                let mut de = serde_json::Deserializer::from_slice(json);
                de::Deserializer::deserialize_any(&mut de, visitor)
                    .map_err(|e| ProtobufError(format!("embedded JSON: {e}")))
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

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct enum
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
    use super::*;

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
    fn truncated_bytes_are_an_error_not_a_panic() {
        let mut fields = Fields::new(&[0x0a, 0x05, b'a']);
        assert!(fields.next().unwrap().is_err());
        let mut pos = 0;
        assert!(varint(&[0xff; 11], &mut pos).is_err());
    }
}
