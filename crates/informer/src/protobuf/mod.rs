//! Kubernetes protobuf (`application/vnd.kubernetes.protobuf`) decoded into
//! the k8s-openapi types, for the built-in kinds.
//!
//! Written by hand rather than generated with prost: k8s-openapi's types
//! are what users hold, and a second family of generated types would need
//! a conversion as large as the types themselves. Instead one serde
//! `Deserializer` ([`decode`]) walks the protobuf bytes with a schema
//! (`generated.rs`, written by `cargo xtask proto-schema` from the Go types
//! of the pinned k8s.io modules) and feeds k8s-openapi's own `Deserialize`
//! impls the map its JSON would be.

pub(crate) mod decode;
pub(crate) mod envelope;
#[allow(clippy::all)]
pub(crate) mod generated;
pub(crate) mod schema;
