//! The shape of every built-in Kubernetes message, as the decoder needs it:
//! for each protobuf field, its number, its JSON name and what the Go field
//! behind it is (a pointer? `omitempty`? inlined?). The data
//! (`generated.rs`) is written by `cargo xtask proto-schema` from the Go
//! types of the pinned k8s.io modules by reflection, so it carries the Go
//! struct tags that the `.proto` files do not: which zero values JSON
//! leaves out, which fields JSON inlines into their parent.

/// One protobuf message (a Go struct).
#[derive(Debug)]
pub(crate) struct Message {
    /// The protobuf name, `k8s.io.api.core.v1.Pod`.
    pub name: &'static str,
    /// By ascending field number.
    pub fields: &'static [Field],
}

/// One field of a message.
#[derive(Debug)]
pub(crate) struct Field {
    /// The protobuf field number.
    pub number: u32,
    /// The JSON name (unused when `INLINE`).
    pub json: &'static str,
    /// What the field holds (each element's type when `REPEATED`).
    pub ty: Ty,
    /// `REPEATED`, `POINTER`, `OMITEMPTY`, `INLINE`, `OMITZERO`.
    pub flags: u8,
}

/// A Go slice (not `[]byte`): the field repeats, one element per occurrence.
pub(crate) const REPEATED: u8 = 1;
/// A Go pointer: the field is in the bytes exactly when it is set, and then
/// in the JSON too, even when its value is zero.
pub(crate) const POINTER: u8 = 2;
/// `json:",omitempty"`: JSON leaves out a zero scalar, an empty string, an
/// empty slice or map (not a struct).
pub(crate) const OMITEMPTY: u8 = 4;
/// `json:",inline"`: the message's fields are the parent's in JSON.
pub(crate) const INLINE: u8 = 8;
/// `json:",omitzero"`: JSON leaves out a zero value, a struct included.
pub(crate) const OMITZERO: u8 = 16;

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ty {
    /// `string` (any Go string type).
    String,
    /// `[]byte`: base64 in JSON.
    Bytes,
    /// `bool`.
    Bool,
    /// `int32` (varint).
    Int32,
    /// `int64` (varint).
    Int64,
    /// `float64` (fixed64).
    Float64,
    /// A message: index into [`MESSAGES`](super::generated::MESSAGES).
    Message(u16),
    /// A Go map: index into [`MAPS`](super::generated::MAPS), its key and value types.
    Map(u16),
    /// `metav1.Time`: `{seconds, nanos}`, RFC 3339 to the second in JSON; empty is the zero time (null).
    Time,
    /// `metav1.MicroTime`: `{seconds, nanos}`, RFC 3339 to the microsecond in JSON.
    MicroTime,
    /// `intstr.IntOrString`: `{type, intVal, strVal}`, a number or a string in JSON.
    IntOrString,
    /// `resource.Quantity`: `{string}`, that string in JSON.
    Quantity,
    /// `runtime.RawExtension`, `metav1.FieldsV1`, apiextensions `JSON`:
    /// field 1 holds JSON bytes, embedded as they are.
    RawJson,
}

/// A built-in kind whose protobuf the schema knows ([`kind_of`](crate::kind_of)
/// finds it): its `apiVersion` and `kind`, its message and its list's.
#[derive(Debug)]
pub struct Kind {
    /// `v1`, `apps/v1`.
    pub(crate) api_version: &'static str,
    /// `Pod`.
    pub(crate) kind: &'static str,
    /// Index into `MESSAGES`.
    pub(crate) message: u16,
    /// Index into `MESSAGES` of `<Kind>List`.
    pub(crate) list: u16,
}

impl Kind {
    /// Its `apiVersion`: `v1`, `apps/v1`.
    pub fn api_version(&self) -> &'static str {
        self.api_version
    }

    /// Its `kind`: `Pod`.
    pub fn kind(&self) -> &'static str {
        self.kind
    }
}
