//! Mutation tests of the protobuf decoder (`protobuf::decode` and
//! `protobuf::decode_list`): whatever bytes arrive, it answers `Ok` or an
//! error, and never panics, overflows its stack or aborts. The inputs are
//! real bodies captured from kube-apiserver (a Pod, a PodList of 3 and a
//! CustomResourceDefinition, see tests/fixtures/README.md), mutated several
//! times per case: bit flips, byte inserts and deletes, splices of a slice
//! of the input or of another fixture, truncation, and corrupted length
//! prefixes. Insertions, deletions and splices come in two flavours: raw
//! (every enclosing length is now wrong, so the decoder fails on framing)
//! and reframed (the length prefixes of every enclosing message are
//! rewritten, so the damage reaches the field deep inside that it hit).
//!
//! 2 000 cases per fixture by default, about 3 s in a debug build;
//! `PROPTEST_CASES=50000 cargo test -p kinformer-protobuf --test
//! mutations` runs 25 times as many (docs/reliability.md, Fuzzing).
//! No regression file is written: a failure prints the mutated body in
//! base64, and the panic message.

use std::cell::Cell;
use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kinformer_protobuf::{decode, decode_list};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{TestCaseError, TestCaseResult, TestRunner};

const POD: &[u8] = include_bytes!("fixtures/pod.pb");
const POD_LIST: &[u8] = include_bytes!("fixtures/podlist.pb");
const CRD: &[u8] = include_bytes!("fixtures/crd.pb");
const FIXTURES: [(&str, &[u8]); 3] = [("pod.pb", POD), ("podlist.pb", POD_LIST), ("crd.pb", CRD)];

/// Cases per fixture unless `PROPTEST_CASES` says otherwise.
const DEFAULT_CASES: u32 = 2_000;

/// proptest's defaults (which read `PROPTEST_CASES`, `PROPTEST_RNG_SEED`,
/// ...) with [`DEFAULT_CASES`] when `PROPTEST_CASES` is not set, and no
/// failure file written into the source tree.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = DEFAULT_CASES;
    }
    config.failure_persistence = None;
    config
}

// ---------------------------------------------------------------------------
// The framing of the bytes: where the length-delimited fields are.

/// One length-delimited field found in a body.
#[derive(Debug, Clone, Copy)]
struct Frame {
    /// Offset of its tag.
    tag: usize,
    /// Offset and size of its length prefix.
    len_at: usize,
    len_size: usize,
    /// Its payload: `start..end`.
    start: usize,
    end: usize,
    /// Whether the payload reads as a whole sequence of fields (a message,
    /// or bytes that happen to look like one).
    message: bool,
}

fn read_varint(buf: &[u8], pos: usize) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, &byte) in buf.get(pos..)?.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

fn write_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Every length-delimited field of `buf` after the `k8s\0` prefix, at every
/// depth where the enclosing payload reads as a message, in order of offset.
fn frames(buf: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    if buf.starts_with(b"k8s\0") {
        walk(buf, 4, buf.len(), 0, &mut out);
    }
    out
}

/// Whether `buf[start..end]` is a whole sequence of fields; if so its
/// length-delimited fields (and theirs, recursively) are added to `out`.
fn walk(buf: &[u8], start: usize, end: usize, depth: u32, out: &mut Vec<Frame>) -> bool {
    let mark = out.len();
    let fail = |out: &mut Vec<Frame>| {
        out.truncate(mark);
        false
    };
    if depth > 200 {
        return fail(out);
    }
    let buf = &buf[..end];
    let mut pos = start;
    while pos < end {
        let tag_at = pos;
        let Some((tag, n)) = read_varint(buf, pos) else {
            return fail(out);
        };
        pos += n;
        if tag >> 3 == 0 {
            return fail(out);
        }
        match tag & 7 {
            0 => match read_varint(buf, pos) {
                Some((_, n)) => pos += n,
                None => return fail(out),
            },
            1 => pos += 8,
            5 => pos += 4,
            2 => {
                let Some((len, n)) = read_varint(buf, pos) else {
                    return fail(out);
                };
                let payload = pos + n;
                let Some(payload_end) = usize::try_from(len)
                    .ok()
                    .and_then(|len| payload.checked_add(len))
                    .filter(|e| *e <= end)
                else {
                    return fail(out);
                };
                let i = out.len();
                out.push(Frame {
                    tag: tag_at,
                    len_at: pos,
                    len_size: n,
                    start: payload,
                    end: payload_end,
                    message: false,
                });
                // An empty payload reads as an empty message and as an
                // empty string alike: not counted as a message.
                out[i].message =
                    payload < payload_end && walk(buf, payload, payload_end, depth + 1, out);
                pos = payload_end;
            }
            _ => return fail(out),
        }
    }
    pos == end || fail(out)
}

/// The fields whose payload holds `buf[at..at + delete]`.
fn holding(buf: &[u8], at: usize, delete: usize) -> Vec<Frame> {
    frames(buf)
        .into_iter()
        .filter(|f| f.start <= at && at + delete <= f.end)
        .collect()
}

/// `target` and the fields around it.
fn around(buf: &[u8], target: Frame) -> Vec<Frame> {
    frames(buf)
        .into_iter()
        .filter(|f| f.start <= target.start && target.end <= f.end)
        .collect()
}

/// Replaces `buf[at..at + delete]` with `insert` after rewriting the length
/// prefix of each field of `reframe` (fields that hold the range) to what
/// its payload becomes.
fn edit(buf: &mut Vec<u8>, at: usize, delete: usize, insert: &[u8], mut reframe: Vec<Frame>) {
    let at = at.min(buf.len());
    let delete = delete.min(buf.len() - at);
    // What the payload of the field being rewritten grows by: the edit,
    // and the prefixes already rewritten inside it. Innermost first: each
    // prefix is before the ones inside it, so rewriting it moves none of
    // the prefixes still to rewrite.
    let edit_delta = insert.len() as i128 - delete as i128;
    let mut delta = edit_delta;
    reframe.sort_by_key(|f| std::cmp::Reverse(f.len_at));
    for f in reframe {
        debug_assert!(f.start <= at && at + delete <= f.end);
        let len = ((f.end - f.start) as i128 + delta).max(0) as u64;
        let mut prefix = Vec::new();
        write_varint(len, &mut prefix);
        delta += prefix.len() as i128 - f.len_size as i128;
        buf.splice(f.len_at..f.len_at + f.len_size, prefix);
    }
    // The edit moved by what the prefixes before it grew.
    let at = (at as i128 + delta - edit_delta) as usize;
    buf.splice(at..at + delete, insert.iter().copied());
}

/// [`edit`], with the fields that hold the range reframed or not.
fn edit_at(buf: &mut Vec<u8>, at: usize, delete: usize, insert: &[u8], reframe: bool) {
    let at = at.min(buf.len());
    let delete = delete.min(buf.len() - at);
    let fields = if reframe {
        holding(buf, at, delete)
    } else {
        Vec::new()
    };
    edit(buf, at, delete, insert, fields);
}

// ---------------------------------------------------------------------------
// Mutations.

/// What a corrupted length prefix says.
#[derive(Debug, Clone, Copy)]
enum Length {
    Zero,
    OneLess,
    OneMore,
    Double,
    /// 2^31, 2^32 - 1, 2^32 + the length: what breaks 32-bit arithmetic.
    I32Max,
    U32Max,
    Wrapped,
    U64Max,
    /// The same value with a redundant continuation byte (valid protobuf).
    NonMinimal,
    /// Eleven bytes with the continuation bit: no varint at all.
    Overlong,
}

fn length() -> impl Strategy<Value = Length> {
    prop_oneof![
        Just(Length::Zero),
        Just(Length::OneLess),
        Just(Length::OneMore),
        Just(Length::Double),
        Just(Length::I32Max),
        Just(Length::U32Max),
        Just(Length::Wrapped),
        Just(Length::U64Max),
        Just(Length::NonMinimal),
        Just(Length::Overlong),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    FlipBit {
        at: Index,
        bit: u8,
    },
    Insert {
        at: Index,
        bytes: Vec<u8>,
        reframe: bool,
    },
    Delete {
        at: Index,
        len: usize,
        reframe: bool,
    },
    /// Copies `len` bytes of a donor (the input itself or a fixture) to
    /// `to`, inserted or over the bytes there.
    Splice {
        donor: Index,
        from: Index,
        len: usize,
        to: Index,
        overwrite: bool,
        reframe: bool,
    },
    /// Copies a whole length-delimited field of a donor (tag, length and
    /// payload) to the start or end of a message of the input, `copies`
    /// times, enclosing lengths fixed up: a field of one kind where another
    /// is expected, or a repeated field repeated more.
    SpliceField {
        donor: Index,
        field: Index,
        into: Index,
        at_end: bool,
        copies: u8,
    },
    Truncate {
        at: Index,
    },
    /// Rewrites the length prefix of a length-delimited field, leaving the
    /// bytes after it as they are.
    CorruptLength {
        field: Index,
        to: Length,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<Index>(), 0u8..8).prop_map(|(at, bit)| Op::FlipBit { at, bit }),
        2 => (
            any::<Index>(),
            prop::collection::vec(any::<u8>(), 1..12),
            any::<bool>()
        )
            .prop_map(|(at, bytes, reframe)| Op::Insert { at, bytes, reframe }),
        2 => (any::<Index>(), 1usize..24, any::<bool>())
            .prop_map(|(at, len, reframe)| Op::Delete { at, len, reframe }),
        2 => (
            any::<Index>(),
            any::<Index>(),
            1usize..300,
            any::<Index>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(donor, from, len, to, overwrite, reframe)| Op::Splice {
                donor,
                from,
                len,
                to,
                overwrite,
                reframe
            }),
        2 => (
            any::<Index>(),
            any::<Index>(),
            any::<Index>(),
            any::<bool>(),
            1u8..4
        )
            .prop_map(|(donor, field, into, at_end, copies)| Op::SpliceField {
                donor,
                field,
                into,
                at_end,
                copies
            }),
        1 => any::<Index>().prop_map(|at| Op::Truncate { at }),
        3 => (any::<Index>(), length()).prop_map(|(field, to)| Op::CorruptLength { field, to }),
    ]
}

/// One case: a fixture, what is done to it, and how it is decoded.
#[derive(Clone)]
struct Case {
    fixture: usize,
    ops: Vec<Op>,
    drop_managed_fields: bool,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("fixture", &FIXTURES[self.fixture].0)
            .field("ops", &self.ops)
            .field("drop_managed_fields", &self.drop_managed_fields)
            .field("body_base64", &BASE64.encode(self.body()))
            .finish()
    }
}

fn case(fixture: usize) -> impl Strategy<Value = Case> {
    (prop::collection::vec(op(), 1..=8), any::<bool>()).prop_map(move |(ops, drop)| Case {
        fixture,
        ops,
        drop_managed_fields: drop,
    })
}

impl Case {
    fn body(&self) -> Vec<u8> {
        let mut buf = FIXTURES[self.fixture].1.to_vec();
        for op in &self.ops {
            apply(&mut buf, op);
        }
        buf
    }
}

fn apply(buf: &mut Vec<u8>, op: &Op) {
    let donor = |i: &Index, buf: &[u8]| -> Vec<u8> {
        match i.index(FIXTURES.len() + 1) {
            0 => buf.to_vec(),
            n => FIXTURES[n - 1].1.to_vec(),
        }
    };
    match op {
        Op::FlipBit { at, bit } => {
            if !buf.is_empty() {
                let i = at.index(buf.len());
                buf[i] ^= 1 << bit;
            }
        }
        Op::Insert { at, bytes, reframe } => {
            let i = at.index(buf.len() + 1);
            edit_at(buf, i, 0, bytes, *reframe);
        }
        Op::Delete { at, len, reframe } => {
            if !buf.is_empty() {
                let i = at.index(buf.len());
                edit_at(buf, i, *len, &[], *reframe);
            }
        }
        Op::Splice {
            donor: d,
            from,
            len,
            to,
            overwrite,
            reframe,
        } => {
            let source = donor(d, buf);
            if source.is_empty() {
                return;
            }
            let start = from.index(source.len());
            let slice = &source[start..(start + len).min(source.len())];
            let i = to.index(buf.len() + 1);
            let delete = if *overwrite { slice.len() } else { 0 };
            edit_at(buf, i, delete, slice, *reframe);
        }
        Op::SpliceField {
            donor: d,
            field,
            into,
            at_end,
            copies,
        } => {
            let source = donor(d, buf);
            let fields = frames(&source);
            let messages: Vec<Frame> = frames(buf).into_iter().filter(|f| f.message).collect();
            if fields.is_empty() || messages.is_empty() {
                return;
            }
            let f = fields[field.index(fields.len())];
            let target = messages[into.index(messages.len())];
            let bytes = source[f.tag..f.end].repeat(usize::from(*copies));
            let at = if *at_end { target.end } else { target.start };
            let fields = around(buf, target);
            edit(buf, at, 0, &bytes, fields);
        }
        Op::Truncate { at } => {
            let i = at.index(buf.len() + 1);
            buf.truncate(i);
        }
        Op::CorruptLength { field, to } => {
            let fields = frames(buf);
            if fields.is_empty() {
                return;
            }
            let f = fields[field.index(fields.len())];
            let old = (f.end - f.start) as u64;
            let mut prefix = Vec::new();
            match to {
                Length::Zero => write_varint(0, &mut prefix),
                Length::OneLess => write_varint(old.saturating_sub(1), &mut prefix),
                Length::OneMore => write_varint(old + 1, &mut prefix),
                Length::Double => write_varint(old * 2, &mut prefix),
                Length::I32Max => write_varint(1 << 31, &mut prefix),
                Length::U32Max => write_varint(u64::from(u32::MAX), &mut prefix),
                Length::Wrapped => write_varint((1 << 32) + old, &mut prefix),
                Length::U64Max => write_varint(u64::MAX, &mut prefix),
                Length::NonMinimal => {
                    write_varint(old, &mut prefix);
                    if let Some(last) = prefix.last_mut() {
                        *last |= 0x80;
                    }
                    prefix.push(0);
                }
                Length::Overlong => prefix.extend_from_slice(&[0xff; 11]),
            }
            buf.splice(f.len_at..f.len_at + f.len_size, prefix);
        }
    }
}

// ---------------------------------------------------------------------------
// The property.

/// What the decoder of the fixture's own kind answered over a run.
#[derive(Default)]
struct Tally {
    ok: Cell<u32>,
    err: Cell<u32>,
    lists_with_a_failed_item: Cell<u32>,
}

fn bump(c: &Cell<u32>) {
    c.set(c.get() + 1);
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned())
}

/// `f` run with its panic turned into a failure naming the body.
fn no_panic<T>(what: &str, body: &[u8], f: impl FnOnce() -> T) -> Result<T, TestCaseError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| {
        TestCaseError::fail(format!(
            "{what} panicked: {}; body (base64): {}",
            panic_message(&*p),
            BASE64.encode(body)
        ))
    })
}

fn check_error(what: &str, body: &[u8], e: &dyn std::fmt::Display) -> TestCaseResult {
    prop_assert!(
        !e.to_string().is_empty(),
        "{what} returned an error without a message; body (base64): {}",
        BASE64.encode(body)
    );
    Ok(())
}

/// Decodes `body` as an object and as a list of `K`: each returns, and each
/// error says something. Returns which of the two decoded.
fn check<K>(name: &str, body: &[u8], drop: bool, tally: &Tally) -> Result<[bool; 2], TestCaseError>
where
    K: kube_client::Resource<DynamicType = ()> + serde::de::DeserializeOwned + 'static,
{
    let what = format!("decode::<{name}>");
    let object = match no_panic(&what, body, || decode::<K>(body, &(), drop))? {
        Ok(_) => true,
        Err(e) => {
            check_error(&what, body, &e)?;
            false
        }
    };
    let what = format!("decode_list::<{name}>");
    let list = match no_panic(&what, body, || decode_list::<K>(body, &(), drop))? {
        Ok(list) => {
            let mut failed = false;
            for item in &list.items {
                if let Err(e) = item {
                    failed = true;
                    check_error(&format!("{what} (an item)"), body, e)?;
                }
            }
            if failed {
                bump(&tally.lists_with_a_failed_item);
            }
            true
        }
        Err(e) => {
            check_error(&what, body, &e)?;
            false
        }
    };
    Ok([object, list])
}

/// Runs the property over mutations of one fixture; returns the tally.
fn mutations_of(fixture: usize) -> Tally {
    let tally = Tally::default();
    let config = config();
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let result = runner.run(&case(fixture), |case| {
        let body = case.body();
        let drop = case.drop_managed_fields;
        let [pod, pods] = check::<Pod>("Pod", &body, drop, &tally)?;
        let [crd, _] =
            check::<CustomResourceDefinition>("CustomResourceDefinition", &body, drop, &tally)?;
        bump(if [pod, pods, crd][fixture] {
            &tally.ok
        } else {
            &tally.err
        });
        Ok(())
    });
    if let Err(e) = result {
        panic!("{}: {e}", FIXTURES[fixture].0);
    }
    println!(
        "{}: {cases} cases, each decoded 4 ways; as its own kind: {} Ok, {} errors; \
         {} lists Ok with an undecodable item",
        FIXTURES[fixture].0,
        tally.ok.get(),
        tally.err.get(),
        tally.lists_with_a_failed_item.get()
    );
    // Enough cases to expect both answers: the harness reached the decoder.
    if cases >= 200 {
        assert!(tally.ok.get() > 0, "no mutated body decoded");
        assert!(tally.err.get() > 0, "no mutated body was refused");
    }
    tally
}

#[test]
fn mutated_pods_decode_to_a_value_or_an_error_never_a_panic() {
    mutations_of(0);
}

#[test]
fn mutated_pod_lists_decode_to_a_value_or_an_error_and_a_bad_item_is_an_error_in_its_place() {
    let tally = mutations_of(1);
    if config().cases >= 200 {
        assert!(
            tally.lists_with_a_failed_item.get() > 0,
            "no mutated list decoded with an undecodable item: the mutations do not reach the items"
        );
    }
}

#[test]
fn mutated_custom_resource_definitions_decode_to_a_value_or_an_error_never_a_panic() {
    mutations_of(2);
}

// ---------------------------------------------------------------------------
// The harness is live: the fixtures decode, and the reframing is right.

#[test]
fn the_unmutated_fixtures_decode_to_the_objects_the_server_sent() {
    let pod = decode::<Pod>(POD, &(), false).unwrap();
    assert_eq!(pod.metadata.name.as_deref(), Some("web-0"));
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.containers.len(), 2);
    assert_eq!(spec.volumes.as_ref().map(Vec::len), Some(3));
    let managers: Vec<_> = pod
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.manager.as_deref())
        .collect();
    assert_eq!(managers, ["kubectl", "kubelet"]);
    let status = pod.status.as_ref().unwrap();
    assert_eq!(status.container_statuses.as_ref().map(Vec::len), Some(2));
    let stripped = decode::<Pod>(POD, &(), true).unwrap();
    assert!(stripped.metadata.managed_fields.is_none());
    assert_eq!(stripped.spec, pod.spec);

    let list = decode_list::<Pod>(POD_LIST, &(), false).unwrap();
    assert!(list.resource_version.is_some());
    let names: Vec<_> = list
        .items
        .iter()
        .map(|item| item.as_ref().unwrap().metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["plain", "web-0", "web-1"]);

    let crd = decode::<CustomResourceDefinition>(CRD, &(), false).unwrap();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("widgets.fuzz.kinformer.io")
    );
    assert_eq!(crd.spec.versions.len(), 2);
    let schema = crd.spec.versions[0]
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap();
    let spec = &schema.properties.as_ref().unwrap()["spec"];
    let ratio = &spec.properties.as_ref().unwrap()["ratio"];
    assert_eq!((ratio.minimum, ratio.maximum), (Some(0.05), Some(99.75)));
    assert!(ratio.default.is_some());
    assert_eq!(
        spec.properties.as_ref().unwrap()["color"]
            .enum_
            .as_ref()
            .map(Vec::len),
        Some(4)
    );
    let parts = &spec.properties.as_ref().unwrap()["parts"];
    assert_eq!(parts.x_kubernetes_list_type.as_deref(), Some("map"));
    assert!(schema.x_kubernetes_validations.is_some());

    // Each fixture decodes only as its own kind.
    assert!(decode::<CustomResourceDefinition>(POD, &(), false).is_err());
    assert!(decode::<Pod>(POD_LIST, &(), false).is_err());
    assert!(decode_list::<Pod>(CRD, &(), false).is_err());
}

/// Whether a payload is printable text: some strings read as messages
/// ("512Mi" is field 6, fixed32 "12Mi").
fn is_text(payload: &[u8]) -> bool {
    std::str::from_utf8(payload).is_ok_and(|s| s.chars().all(|c| !c.is_control()))
}

#[test]
fn an_unknown_field_inserted_reframed_into_any_message_of_a_pod_leaves_it_decoding_the_same() {
    let original = decode::<Pod>(POD, &(), false).unwrap();
    // Field 999, varint 1: unknown in every Kubernetes message.
    let unknown = [0xb8, 0x3e, 0x01];
    let messages: Vec<Frame> = frames(POD).into_iter().filter(|f| f.message).collect();
    assert!(messages.len() > 100, "{} messages", messages.len());
    let (mut same, mut failures) = (0, Vec::new());
    for (i, f) in messages.iter().enumerate() {
        let text = is_text(&POD[f.start..f.end]);
        for at in [f.start, f.end] {
            let mut body = POD.to_vec();
            edit(&mut body, at, 0, &unknown, around(POD, *f));
            assert_eq!(frames(&body).len(), frames(POD).len(), "message {i}");
            match decode::<Pod>(&body, &(), false) {
                Ok(pod) if pod == original => same += 1,
                // The text gained the bytes instead: changed, or refused.
                _ if text => {}
                Ok(_) => failures.push(format!("message {i} at {at}: decodes differently")),
                Err(e) => failures.push(format!("message {i} at {at}: {e}")),
            }
        }
    }
    assert!(same > 200, "{same} inserts decoded the same");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_raw_insert_breaks_the_framing_and_a_reframed_one_does_not() {
    let deep = frames(POD)
        .into_iter()
        .filter(|f| f.message && !is_text(&POD[f.start..f.end]))
        .max_by_key(|f| f.start)
        .unwrap();
    let mut raw = POD.to_vec();
    edit_at(&mut raw, deep.start, 0, &[0xb8, 0x3e, 0x01], false);
    assert!(decode::<Pod>(&raw, &(), false).is_err());
    let mut reframed = POD.to_vec();
    edit_at(&mut reframed, deep.start, 0, &[0xb8, 0x3e, 0x01], true);
    assert!(decode::<Pod>(&reframed, &(), false).is_ok());
}
