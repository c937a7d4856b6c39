//! Any bytes, decoded as a protobuf Pod, PodList, CustomResourceDefinition
//! and CustomResourceDefinitionList, with or without managedFields: the
//! decoder returns `Ok` or an error that says why, and never panics,
//! overflows its stack or aborts. The longer-running companion of
//! `crates/protobuf/tests/mutations.rs`; seed it with the fixtures
//! of `crates/protobuf/tests/fixtures/` (see docs/reliability.md, Fuzzing).

#![no_main]

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_protobuf::{Error, ProtobufList, decode, decode_list};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    // The last byte chooses whether managedFields are decoded, so that both
    // paths see every kind of body.
    let drop = body.last().is_some_and(|b| b & 1 == 1);
    check(decode::<Pod>(body, &(), drop).map(|_| ()));
    check_list(decode_list::<Pod>(body, &(), drop));
    check(decode::<CustomResourceDefinition>(body, &(), drop).map(|_| ()));
    check_list(decode_list::<CustomResourceDefinition>(body, &(), drop));
});

/// An error says why.
fn check<E: std::fmt::Display>(result: Result<(), E>) {
    if let Err(e) = result {
        assert!(!e.to_string().is_empty(), "an error without a message");
    }
}

/// A list is a value or an error, and so is each of its items.
fn check_list<K>(list: Result<ProtobufList<K>, Error>) {
    match list {
        Ok(list) => {
            for item in list.items {
                check(item.map(|_| ()));
            }
        }
        Err(e) => check(Err(e)),
    }
}
