//! Property tests of `strip_managed_fields_json` against serde_json itself:
//! over generated Kubernetes-shaped documents (objects, lists, watch events)
//! with escapes, unicode, nesting, keys spelled with escapes and decoy
//! `managedFields` below the object, the stripped bytes decode to exactly
//! what serde_json gives for the original less the object's own
//! `metadata.managedFields`; and input serde_json refuses stays refused.

use kinformer_informer::{JsonShape, strip_managed_fields_json};
use proptest::prelude::*;
use serde_json::Value;

/// A JSON text, with how each part is spelled, so that one value can be
/// written with escapes, odd whitespace or (for invalid documents) bytes
/// that are not JSON.
#[derive(Debug, Clone)]
enum J {
    Null,
    Bool(bool),
    Num(String),
    Str(Text),
    Arr(Vec<J>, Ws),
    Obj(Vec<(Text, J)>, Ws),
    /// Bytes serde_json refuses.
    Raw(Vec<u8>),
}

/// A string: each character written as it is, or escaped.
#[derive(Debug, Clone)]
struct Text(Vec<(char, bool)>);

/// The whitespace written around the tokens of one array or object.
#[derive(Debug, Clone, Copy)]
struct Ws(u8);

impl Ws {
    fn text(self) -> &'static [u8] {
        match self.0 % 5 {
            0 => b"",
            1 => b" ",
            2 => b"\n  ",
            3 => b"\t",
            _ => b"\r\n",
        }
    }
}

impl Text {
    fn plain(s: &str) -> Self {
        Text(s.chars().map(|c| (c, false)).collect())
    }

    fn render(&self, out: &mut Vec<u8>) {
        out.push(b'"');
        for &(c, escape) in &self.0 {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' if !escape => out.extend_from_slice(b"\\n"),
                '\t' if !escape => out.extend_from_slice(b"\\t"),
                '/' if escape => out.extend_from_slice(b"\\/"),
                c if escape || (c as u32) < 0x20 => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        out.extend_from_slice(format!("\\u{unit:04x}").as_bytes());
                    }
                }
                c => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
                }
            }
        }
        out.push(b'"');
    }
}

impl J {
    fn render(&self, out: &mut Vec<u8>) {
        match self {
            J::Null => out.extend_from_slice(b"null"),
            J::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
            J::Num(n) => out.extend_from_slice(n.as_bytes()),
            J::Str(t) => t.render(out),
            J::Raw(bytes) => out.extend_from_slice(bytes),
            J::Arr(items, ws) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(ws.text());
                    item.render(out);
                }
                out.extend_from_slice(ws.text());
                out.push(b']');
            }
            J::Obj(members, ws) => {
                out.push(b'{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(ws.text());
                    key.render(out);
                    out.extend_from_slice(ws.text());
                    out.push(b':');
                    out.extend_from_slice(ws.text());
                    value.render(out);
                }
                out.extend_from_slice(ws.text());
                out.push(b'}');
            }
        }
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.render(&mut out);
        out
    }
}

fn any_char() -> BoxedStrategy<char> {
    prop_oneof![
        4 => proptest::char::range('a', 'z'),
        1 => Just('"'),
        1 => Just('\\'),
        1 => Just('/'),
        1 => proptest::char::range('\u{0}', '\u{1f}'),
        1 => Just('\u{7f}'),
        1 => Just('é'),
        1 => Just('中'),
        1 => Just('\u{2028}'),
        1 => Just('😀'),
        1 => Just(':'),
        1 => Just('{'),
    ]
    .boxed()
}

/// Text with what tends to confuse a scanner: quotes, backslashes,
/// `"managedFields":` inside a value, unicode.
fn text() -> BoxedStrategy<Text> {
    prop_oneof![
        3 => proptest::collection::vec((any_char(), proptest::bool::weighted(0.2)), 0..12)
            .prop_map(Text),
        1 => Just(Text::plain("\"managedFields\":[")),
        1 => Just(Text::plain("{\"metadata\":{\"managedFields\":")),
        1 => Just(Text::plain("\\")),
    ]
    .boxed()
}

/// A key: one Kubernetes knows, a decoy, or any text; sometimes with its
/// characters written as `\u` escapes (the same key to serde).
fn key() -> BoxedStrategy<Text> {
    let known = prop_oneof![
        Just("metadata"),
        Just("managedFields"),
        Just("name"),
        Just("labels"),
        Just("spec"),
        Just("template"),
        Just("items"),
        Just("object"),
        Just("type"),
        Just("managedfields"),
        Just("managedFields "),
        Just("f:metadata"),
        Just("k:{\"type\":\"Ready\"}"),
    ];
    prop_oneof![
        4 => (known, proptest::collection::vec(proptest::bool::weighted(0.1), 16)).prop_map(
            |(k, escapes)| Text(k.chars().zip(escapes.into_iter().cycle()).collect())
        ),
        1 => text(),
    ]
    .boxed()
}

fn number() -> BoxedStrategy<String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<u64>().prop_map(|n| n.to_string()),
        Just("-0".to_owned()),
        Just("1.5".to_owned()),
        Just("-0.25e3".to_owned()),
        Just("1E-7".to_owned()),
        Just("6.02e+23".to_owned()),
        Just("123456789012345678901234567890".to_owned()),
    ]
    .boxed()
}

/// Any JSON value, nested a few levels.
fn value() -> BoxedStrategy<J> {
    let leaf = prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number().prop_map(J::Num),
        text().prop_map(J::Str),
    ];
    leaf.prop_recursive(4, 24, 5, |inner| {
        prop_oneof![
            (proptest::collection::vec(inner.clone(), 0..5), any::<u8>())
                .prop_map(|(items, ws)| J::Arr(items, Ws(ws))),
            (proptest::collection::vec((key(), inner), 0..5), any::<u8>())
                .prop_map(|(members, ws)| J::Obj(members, Ws(ws))),
        ]
    })
    .boxed()
}

/// An object with the given members and a few more, in any order.
fn object_with(members: Vec<(&'static str, J)>) -> BoxedStrategy<J> {
    (
        proptest::collection::vec((key(), value()), 0..3),
        any::<u8>(),
    )
        .prop_flat_map(move |(extra, ws)| {
            let mut all: Vec<(Text, J)> = members
                .iter()
                .map(|(k, v)| (Text::plain(k), v.clone()))
                .collect();
            all.extend(extra);
            Just(all)
                .prop_shuffle()
                .prop_map(move |m| J::Obj(m, Ws(ws)))
        })
        .boxed()
}

/// A managedFields value, as the server writes it, or any value.
fn managed_fields() -> BoxedStrategy<J> {
    let entry = (text(), value()).prop_flat_map(|(manager, fields)| {
        object_with(vec![
            ("manager", J::Str(manager)),
            ("operation", J::Str(Text::plain("Update"))),
            ("fieldsV1", fields),
        ])
    });
    prop_oneof![
        3 => (proptest::collection::vec(entry, 0..3), any::<u8>())
            .prop_map(|(e, ws)| J::Arr(e, Ws(ws))),
        1 => value(),
    ]
    .boxed()
}

/// A `metadata` object: a name, maybe managedFields (maybe twice), decoys.
fn metadata() -> BoxedStrategy<J> {
    (
        text(),
        proptest::option::weighted(0.8, managed_fields()),
        proptest::option::weighted(0.1, managed_fields()),
        proptest::option::weighted(0.3, value()),
    )
        .prop_flat_map(|(name, mf, again, decoy)| {
            let mut members = vec![("name", J::Str(name))];
            members.extend(mf.map(|mf| ("managedFields", mf)));
            members.extend(again.map(|mf| ("managedFields", mf)));
            members.extend(decoy.map(|d| ("managedfields", d)));
            object_with(members)
        })
        .boxed()
}

/// A Kubernetes object, with managedFields below it that must stay: a pod
/// template's metadata, a custom resource's own data.
fn kube_object() -> BoxedStrategy<J> {
    (metadata(), metadata(), managed_fields(), value())
        .prop_flat_map(|(meta, template_meta, nested_mf, status)| {
            let template = J::Obj(vec![(Text::plain("metadata"), template_meta)], Ws(0));
            let x = J::Obj(
                vec![(
                    Text::plain("metadata"),
                    J::Obj(vec![(Text::plain("managedFields"), nested_mf)], Ws(1)),
                )],
                Ws(0),
            );
            let spec = J::Obj(
                vec![(Text::plain("template"), template), (Text::plain("x"), x)],
                Ws(2),
            );
            object_with(vec![
                ("apiVersion", J::Str(Text::plain("v1"))),
                ("kind", J::Str(Text::plain("Pod"))),
                ("metadata", meta),
                ("spec", spec),
                ("status", status),
            ])
        })
        .boxed()
}

fn document() -> BoxedStrategy<(JsonShape, J)> {
    prop_oneof![
        kube_object().prop_map(|o| (JsonShape::Object, o)),
        (proptest::collection::vec(kube_object(), 0..4), metadata()).prop_flat_map(
            |(items, list_meta)| {
                object_with(vec![
                    ("kind", J::Str(Text::plain("PodList"))),
                    // A list's own metadata is not an object's: it stays.
                    ("metadata", list_meta),
                    ("items", J::Arr(items, Ws(2))),
                ])
                .prop_map(|l| (JsonShape::List, l))
            }
        ),
        (kube_object(), text()).prop_flat_map(|(object, kind)| {
            object_with(vec![("type", J::Str(kind)), ("object", object)])
                .prop_map(|e| (JsonShape::WatchEvent, e))
        }),
    ]
    .boxed()
}

/// What serde_json gives for `doc`, less the object's own managedFields.
fn expected(doc: &[u8], shape: JsonShape) -> serde_json::Result<Value> {
    fn strip_object(v: &mut Value) {
        if let Some(Value::Object(meta)) = v.get_mut("metadata") {
            meta.remove("managedFields");
        }
    }
    let mut v: Value = serde_json::from_slice(doc)?;
    match shape {
        JsonShape::Object => strip_object(&mut v),
        JsonShape::List => {
            if let Some(Value::Array(items)) = v.get_mut("items") {
                items.iter_mut().for_each(strip_object);
            }
        }
        JsonShape::WatchEvent => {
            if let Some(object) = v.get_mut("object") {
                strip_object(object);
            }
        }
    }
    Ok(v)
}

/// Bytes serde_json refuses, wherever they stand.
fn invalid() -> BoxedStrategy<J> {
    let snippets: Vec<&'static [u8]> = vec![
        b"01",
        b"1.",
        b"-",
        b"1e400",
        b"1.7976931348623158e308",
        b"\"\\ud800\"",
        b"\"\\udc00\"",
        b"\"\\ud800\\u0041\"",
        b"\"\\x\"",
        b"\"\\u12\"",
        b"tru",
        b"nul",
        b"[1,]",
        b"{\"a\":1,}",
        b"{\"a\" 1}",
        b"{1:2}",
        b"\"\x01\"",
        b"\"\xff\"",
        b"\xff",
        b"[",
        b"}",
    ];
    prop_oneof![
        proptest::sample::select(snippets).prop_map(|s| J::Raw(s.to_vec())),
        Just(J::Raw([vec![b'['; 130], vec![b']'; 130]].concat())),
    ]
    .boxed()
}

/// A document with something serde_json refuses put into one of its
/// managedFields (or elsewhere), and a few bytes deleted, inserted or cut.
fn mutated() -> BoxedStrategy<(JsonShape, Vec<u8>)> {
    (
        document(),
        invalid(),
        proptest::bool::ANY,
        proptest::collection::vec((0u8..4, any::<prop::sample::Index>(), any::<u8>()), 0..3),
    )
        .prop_map(|((shape, doc), bad, plant, edits)| {
            let mut bytes = doc.bytes();
            if plant {
                // Into the first managedFields written, or at the start.
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let at = text
                    .find("\"managedFields\"")
                    .and_then(|k| text[k..].find(':').map(|c| k + c + 1))
                    .unwrap_or(0);
                let mut planted = bytes[..at].to_vec();
                planted.extend_from_slice(&bad.bytes());
                planted.push(b',');
                planted.extend_from_slice(&bytes[at..]);
                bytes = planted;
            }
            for (op, at, byte) in edits {
                if bytes.is_empty() {
                    break;
                }
                let i = at.index(bytes.len());
                let b = b",:{}[]\"\\0 e\xff"[byte as usize % 12];
                match op {
                    0 => {
                        bytes.remove(i);
                    }
                    1 => bytes.insert(i, b),
                    2 => bytes.truncate(i),
                    _ => bytes[i] = b,
                }
            }
            (shape, bytes)
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn stripped_json_decodes_to_the_original_without_the_objects_own_managed_fields(
        (shape, doc) in document()
    ) {
        let doc = doc.bytes();
        let want = expected(&doc, shape).expect("generated documents are valid JSON");
        let stripped = strip_managed_fields_json(&doc, shape);
        let got: Value = serde_json::from_slice(&stripped)
            .map_err(|e| TestCaseError::fail(format!("stripped output does not decode: {e}")))?;
        prop_assert_eq!(got, want);
    }

    #[test]
    fn invalid_json_stays_invalid_and_valid_json_is_stripped_exactly(
        (shape, doc) in mutated()
    ) {
        let stripped = strip_managed_fields_json(&doc, shape);
        match expected(&doc, shape) {
            Ok(want) => {
                let got: Value = serde_json::from_slice(&stripped).map_err(|e| {
                    TestCaseError::fail(format!("stripped output does not decode: {e}"))
                })?;
                prop_assert_eq!(got, want);
            }
            Err(_) => {
                prop_assert!(
                    serde_json::from_slice::<Value>(&stripped).is_err(),
                    "invalid input came out valid: {}",
                    String::from_utf8_lossy(&stripped)
                );
            }
        }
    }
}
