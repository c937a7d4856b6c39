// Command proto-schema writes the protobuf schema table that kinformer's
// protobuf decoder uses (crates/protobuf/src/generated.rs, in the
// types of crates/protobuf/src/schema.rs).
//
// It walks, by reflection, every type registered in client-go's scheme, in
// apiextensions-apiserver's v1 and v1beta1 schemes and a few meta/v1 types,
// and reads each struct field's `protobuf` and `json` tags: the tags carry
// what the .proto files do not (pointer or value, omitempty, omitzero,
// inline). Anything it cannot map exactly makes it fail, naming the types.
//
// Usage: go run . [-o path/to/generated.rs]   (default: stdout)
package main

import (
	"bytes"
	"encoding"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextv1beta1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1beta1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/scheme"
)

// Rust flag constants (schema.rs), in bit order.
const (
	fRepeated  = 1
	fPointer   = 2
	fOmitEmpty = 4
	fInline    = 8
	fOmitZero  = 16
)

var flagNames = []struct {
	bit  int
	name string
}{{fRepeated, "REPEATED"}, {fPointer, "POINTER"}, {fOmitEmpty, "OMITEMPTY"}, {fInline, "INLINE"}, {fOmitZero, "OMITZERO"}}

// Go types with a Ty of their own: not recursed into.
var special = map[reflect.Type]string{
	reflect.TypeFor[metav1.Time]():          "Time",
	reflect.TypeFor[metav1.MicroTime]():     "MicroTime",
	reflect.TypeFor[metav1.Duration]():      "Duration",
	reflect.TypeFor[intstr.IntOrString]():   "IntOrString",
	reflect.TypeFor[resource.Quantity]():    "Quantity",
	reflect.TypeFor[runtime.RawExtension](): "RawJson",
	reflect.TypeFor[metav1.FieldsV1]():      "RawJson",
	reflect.TypeFor[apiextv1.JSON]():        "RawJson",
	reflect.TypeFor[apiextv1beta1.JSON]():   "RawJson",
}

// Structs whose MarshalJSON turns them into one of their fields' values (a
// union): modelled as wrappers (see the header written below).
var unions = map[reflect.Type]bool{
	reflect.TypeFor[apiextv1.JSONSchemaPropsOrArray]():            true,
	reflect.TypeFor[apiextv1.JSONSchemaPropsOrBool]():             true,
	reflect.TypeFor[apiextv1.JSONSchemaPropsOrStringArray]():      true,
	reflect.TypeFor[apiextv1beta1.JSONSchemaPropsOrArray]():       true,
	reflect.TypeFor[apiextv1beta1.JSONSchemaPropsOrBool]():        true,
	reflect.TypeFor[apiextv1beta1.JSONSchemaPropsOrStringArray](): true,
}

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
	byteType      = reflect.TypeFor[byte]()
)

// A field as written out.
type field struct {
	number int
	json   string
	ty     string // Rust Ty expression, or a placeholder resolved at emit time
	msg    reflect.Type
	mapIdx int
	flags  int
	// The name in the protobuf tag, checked against generated.proto.
	protoName string
}

type message struct {
	t       reflect.Type
	name    string
	fields  []field
	comment string
}

type gen struct {
	messages map[reflect.Type]*message
	order    []reflect.Type // discovery order, for error messages only
	errs     []string
	notes    map[string]bool
	maps     []mapEntry
	mapIndex map[string]int
	protos   *protoSet
}

type mapEntry struct {
	key, val tyRef
}

// A Ty before message indices are known.
type tyRef struct {
	ty  string       // "String", "Time", ... or "Message" / "Map"
	msg reflect.Type // when Message
	m   int          // when Map
}

// customJSON: t (or *t) marshals itself to JSON, not as its Go shape says.
func customJSON(t reflect.Type) bool {
	for _, i := range []reflect.Type{jsonMarshaler, textMarshaler} {
		if t.Implements(i) || reflect.PointerTo(t).Implements(i) {
			return true
		}
	}
	return false
}

func (g *gen) fail(format string, args ...any) {
	g.errs = append(g.errs, fmt.Sprintf(format, args...))
}

func (g *gen) note(format string, args ...any) {
	g.notes[fmt.Sprintf(format, args...)] = true
}

// protoName is go-to-protobuf's message name: the Go package path with '/'
// as '.' and '-' as '_' (a proto package cannot hold '-'), then the type.
func protoName(t reflect.Type) string {
	p := strings.ReplaceAll(t.PkgPath(), "/", ".")
	p = strings.ReplaceAll(p, "-", "_")
	return p + "." + t.Name()
}

type ptag struct {
	number int
	name   string
}

// parseProto reads a field's number and name from its protobuf tag; the
// wire type and opt/rep there are not reliable (not kept up to date).
func parseProto(tag string) (ptag, error) {
	parts := strings.Split(tag, ",")
	if len(parts) < 2 {
		return ptag{}, fmt.Errorf("short protobuf tag %q", tag)
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil {
		return ptag{}, fmt.Errorf("protobuf tag %q: %v", tag, err)
	}
	p := ptag{number: n}
	for _, o := range parts[2:] {
		if v, ok := strings.CutPrefix(o, "name="); ok {
			p.name = v
		}
	}
	return p, nil
}

// scalar maps a Go scalar kind to its Ty.
func scalar(t reflect.Type) (ty string, ok bool) {
	switch t.Kind() {
	case reflect.String:
		return "String", true
	case reflect.Bool:
		return "Bool", true
	case reflect.Int32:
		return "Int32", true
	case reflect.Int64:
		return "Int64", true
	case reflect.Uint32:
		return "Uint32", true
	case reflect.Uint64:
		return "Uint64", true
	case reflect.Float64:
		return "Float64", true
	}
	return "", false
}

// isWrapper: a named slice type that go-to-protobuf wraps in a message
// `{ repeated <elem> items = 1; }` (metav1.Verbs, authentication ExtraValue...,
// marked +protobuf.nullable=true, which reflection cannot see): its package's
// generated.proto has a message of its name.
func (g *gen) isWrapper(t reflect.Type) bool {
	if t.Kind() != reflect.Slice || t.Name() == "" || t.Elem() == byteType {
		return false
	}
	pf := g.protos.file(t.PkgPath())
	return pf != nil && pf.messages[t.Name()] != nil
}

// value resolves the Ty of one (non-repeated, non-pointer) value of Go type
// t, registering messages as needed. (The wire types and opt/rep in the Go
// tags are not kept up to date by go-to-protobuf, so only their numbers are
// used; every field is checked against generated.proto afterwards.)
func (g *gen) value(t reflect.Type, where string) (tyRef, bool) {
	if s, ok := special[t]; ok {
		return tyRef{ty: s, msg: t}, true
	}
	switch {
	case t.Kind() == reflect.Slice && t.Elem() == byteType:
		return tyRef{ty: "Bytes"}, true
	case t.Kind() == reflect.Struct:
		g.visit(t)
		return tyRef{ty: "Message", msg: t}, true
	case g.isWrapper(t):
		g.visitWrapper(t)
		return tyRef{ty: "Message", msg: t}, true
	case t.Kind() == reflect.Map:
		g.fail("%s: map %s as a value (map of maps?)", where, t)
		return tyRef{}, false
	case t.Kind() == reflect.Slice:
		g.fail("%s: slice %s as a value (slice of slices, or a map of slices?)", where, t)
		return tyRef{}, false
	}
	ty, ok := scalar(t)
	if !ok {
		g.fail("%s: cannot map Go type %s (kind %s)", where, t, t.Kind())
		return tyRef{}, false
	}
	if customJSON(t) {
		g.fail("%s: %s has a custom MarshalJSON/MarshalText", where, t)
	}
	return tyRef{ty: ty}, true
}

func (g *gen) mapTy(t reflect.Type, where string) (int, bool) {
	kt, vt := t.Key(), t.Elem()
	if vt.Kind() == reflect.Pointer {
		g.fail("%s: map of pointers %s", where, t)
		return 0, false
	}
	if vt.Kind() == reflect.Slice && vt.Elem() != byteType && vt.Name() == "" {
		g.fail("%s: map value is an unnamed slice %s (go-to-protobuf cannot wrap it)", where, vt)
		return 0, false
	}
	k, ok1 := g.value(kt, where+" (key)")
	v, ok2 := g.value(vt, where+" (value)")
	if !ok1 || !ok2 {
		return 0, false
	}
	if k.ty != "String" && k.ty != "Int32" && k.ty != "Int64" && k.ty != "Bool" {
		g.fail("%s: map key %s", where, kt)
	}
	e := mapEntry{k, v}
	id := func(r tyRef) string {
		if r.ty == "Message" {
			return protoName(r.msg)
		}
		return r.ty
	}
	key := id(k) + "|" + id(v)
	if i, ok := g.mapIndex[key]; ok {
		return i, true
	}
	g.maps = append(g.maps, e)
	g.mapIndex[key] = len(g.maps) - 1
	return len(g.maps) - 1, true
}

func (g *gen) visitWrapper(t reflect.Type) {
	if _, ok := g.messages[t]; ok {
		return
	}
	m := &message{t: t, name: protoName(t)}
	g.messages[t] = m
	g.order = append(g.order, t)
	if customJSON(t) {
		g.fail("%s: wrapped slice with a custom MarshalJSON", t)
	}
	et := t.Elem()
	elem, ok := g.value(et, t.String()+".items")
	if !ok {
		return
	}
	m.fields = []field{g.fieldOf(1, "", elem, fRepeated)}
	m.comment = fmt.Sprintf("synthetic: Go `%s` is `[]%s`, which go-to-protobuf wraps in `message %s { repeated items = 1; }`; JSON is the bare array", t.Name(), et, t.Name())
}

func (g *gen) fieldOf(number int, jsonName string, r tyRef, flags int) field {
	return field{number: number, json: jsonName, ty: r.ty, msg: r.msg, mapIdx: r.m, flags: flags}
}

func (g *gen) visit(t reflect.Type) {
	if _, ok := g.messages[t]; ok {
		return
	}
	if t.Name() == "" {
		g.fail("anonymous struct type %s", t)
		return
	}
	m := &message{t: t, name: protoName(t)}
	g.messages[t] = m
	g.order = append(g.order, t)
	union := unions[t]
	if !union && customJSON(t) {
		g.fail("%s: custom MarshalJSON on a type without a Ty of its own", t)
	}
	if union {
		m.comment = fmt.Sprintf("union: Go `%s` has a custom MarshalJSON that writes one of its fields' values (json \"\")", t.Name())
	}
	tagged, exported := 0, 0
	seen := map[int]string{}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		exported++
		where := t.String() + "." + sf.Name
		ptagStr, hasProto := sf.Tag.Lookup("protobuf")
		jtag, hasJSON := sf.Tag.Lookup("json")
		if !hasProto {
			if hasJSON && jtag != "-" && !sf.Anonymous {
				g.note("no protobuf tag (not in the bytes): %s `json:%q`", where, jtag)
			}
			continue
		}
		tagged++
		p, err := parseProto(ptagStr)
		if err != nil {
			g.fail("%s: %v", where, err)
			continue
		}
		if prev, dup := seen[p.number]; dup {
			g.fail("%s: field number %d also used by %s", where, p.number, prev)
		}
		seen[p.number] = sf.Name

		flags := 0
		jsonName := sf.Name
		jparts := strings.Split(jtag, ",")
		switch {
		case union:
			jsonName = ""
			if hasJSON {
				g.fail("%s: union field with a json tag", where)
			}
		case !hasJSON:
			if sf.Anonymous {
				flags |= fInline
				jsonName = ""
			} else {
				g.fail("%s: protobuf field without a json tag", where)
			}
		case jparts[0] == "-":
			g.fail("%s: protobuf field with json:\"-\"", where)
		default:
			jsonName = jparts[0]
			for _, o := range jparts[1:] {
				switch o {
				case "omitempty":
					flags |= fOmitEmpty
				case "omitzero":
					flags |= fOmitZero
				case "inline":
					flags |= fInline
				case "string":
					g.fail("%s: json \",string\"", where)
				default:
					g.fail("%s: unknown json option %q", where, o)
				}
			}
			if jsonName == "" {
				if flags&fInline != 0 || sf.Anonymous {
					flags |= fInline
				} else {
					jsonName = sf.Name
					g.note("json name defaults to the Go name: %s", where)
				}
			}
			if flags&fInline != 0 {
				jsonName = ""
			}
		}

		ft := sf.Type
		if ft.Kind() == reflect.Pointer {
			flags |= fPointer
			ft = ft.Elem()
			if ft.Kind() == reflect.Slice || ft.Kind() == reflect.Map || ft.Kind() == reflect.Pointer {
				g.fail("%s: pointer to %s", where, ft.Kind())
				continue
			}
		}
		var r tyRef
		var ok bool
		switch {
		case ft.Kind() == reflect.Map:
			r.ty = "Map"
			r.m, ok = g.mapTy(ft, where)
		case ft.Kind() == reflect.Slice && ft.Elem() != byteType && !g.isWrapper(ft):
			flags |= fRepeated
			et := ft.Elem()
			if et.Kind() == reflect.Pointer {
				g.fail("%s: slice of pointers %s", where, ft)
				continue
			}
			if et.Kind() == reflect.Slice && et.Elem() != byteType {
				g.fail("%s: slice of slices %s", where, ft)
				continue
			}
			r, ok = g.value(et, where)
		default:
			r, ok = g.value(ft, where)
		}
		if !ok {
			continue
		}
		if flags&fInline != 0 && r.ty != "Message" {
			g.fail("%s: inline field of Ty %s", where, r.ty)
		}
		f := g.fieldOf(p.number, jsonName, r, flags)
		f.protoName = p.name
		m.fields = append(m.fields, f)
	}
	if exported > 0 && tagged == 0 {
		g.fail("%s: struct reached through protobuf with no protobuf-tagged fields (custom proto marshalling?)", t)
	}
	sort.Slice(m.fields, func(i, j int) bool { return m.fields[i].number < m.fields[j].number })
}

type kind struct {
	apiVersion, kind string
	msg, list        reflect.Type
}

func main() {
	out := flag.String("o", "", "write here (default: stdout)")
	flag.Parse()

	dirs, err := loadDirs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "proto-schema:", err)
		os.Exit(1)
	}
	g := &gen{messages: map[reflect.Type]*message{}, notes: map[string]bool{}, mapIndex: map[string]int{},
		protos: &protoSet{dirs: dirs, files: map[string]*protoFile{}}}

	ext := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{apiextv1.AddToScheme, apiextv1beta1.AddToScheme} {
		if err := add(ext); err != nil {
			fmt.Fprintln(os.Stderr, "proto-schema:", err)
			os.Exit(1)
		}
	}
	known := map[schema.GroupVersionKind]reflect.Type{}
	for _, s := range []*runtime.Scheme{scheme.Scheme, ext} {
		for gvk, t := range s.AllKnownTypes() {
			if gvk.Version == runtime.APIVersionInternal {
				continue
			}
			known[gvk] = t
		}
	}
	gvks := make([]schema.GroupVersionKind, 0, len(known))
	for gvk := range known {
		gvks = append(gvks, gvk)
	}
	sort.Slice(gvks, func(i, j int) bool { return gvks[i].String() < gvks[j].String() })

	// Top-level types that have protobuf tags at all (some registered types,
	// e.g. internal event types, are JSON-only).
	hasProto := func(t reflect.Type) bool {
		for i := 0; i < t.NumField(); i++ {
			if _, ok := t.Field(i).Tag.Lookup("protobuf"); ok {
				return true
			}
		}
		return false
	}
	var skipped []string
	for _, gvk := range gvks {
		t := known[gvk]
		if t.Kind() != reflect.Struct || !hasProto(t) {
			skipped = append(skipped, gvk.String()+" "+t.String())
			continue
		}
		g.visit(t)
	}
	for _, t := range []reflect.Type{
		reflect.TypeFor[metav1.Status](),
		reflect.TypeFor[metav1.WatchEvent](),
		reflect.TypeFor[metav1.List](),
		reflect.TypeFor[metav1.APIResourceList](),
		reflect.TypeFor[metav1.APIGroupList](),
		reflect.TypeFor[metav1.APIGroup](),
		reflect.TypeFor[metav1.APIVersions](),
		reflect.TypeFor[metav1.PartialObjectMetadata](),
		reflect.TypeFor[metav1.PartialObjectMetadataList](),
	} {
		g.visit(t)
	}

	var kinds []kind
	for _, gvk := range gvks {
		if strings.HasSuffix(gvk.Kind, "List") {
			continue
		}
		t, lt := known[gvk], known[gvk.GroupVersion().WithKind(gvk.Kind+"List")]
		if lt == nil || g.messages[t] == nil || g.messages[lt] == nil {
			continue
		}
		// A list of the kind (metav1's APIGroupList, registered in v1 next
		// to APIGroup, holds `groups`).
		if items, ok := lt.FieldByName("Items"); !ok || items.Type.Kind() != reflect.Slice || items.Type.Elem() != t {
			continue
		}
		kinds = append(kinds, kind{gvk.GroupVersion().String(), gvk.Kind, t, lt})
	}
	sort.Slice(kinds, func(i, j int) bool {
		if kinds[i].apiVersion != kinds[j].apiVersion {
			return kinds[i].apiVersion < kinds[j].apiVersion
		}
		return kinds[i].kind < kinds[j].kind
	})

	// Index the messages by name.
	msgs := make([]*message, 0, len(g.messages))
	for _, m := range g.messages {
		msgs = append(msgs, m)
	}
	sort.Slice(msgs, func(i, j int) bool { return msgs[i].name < msgs[j].name })
	index := map[reflect.Type]int{}
	for i, m := range msgs {
		if i > 0 && msgs[i-1].name == m.name {
			fmt.Fprintf(os.Stderr, "proto-schema: two Go types named %s\n", m.name)
			os.Exit(1)
		}
		index[m.t] = i
	}
	g.check(msgs)
	if len(g.errs) > 0 {
		sort.Strings(g.errs)
		fmt.Fprintf(os.Stderr, "proto-schema: %d shapes cannot be mapped:\n", len(g.errs))
		for _, e := range g.errs {
			fmt.Fprintln(os.Stderr, "  "+e)
		}
		os.Exit(1)
	}

	if len(msgs) > 1<<16 || len(g.maps) > 1<<16 {
		fmt.Fprintln(os.Stderr, "proto-schema: more than 65536 messages or maps")
		os.Exit(1)
	}
	ty := func(r tyRef) string {
		switch r.ty {
		case "Message":
			return fmt.Sprintf("Ty::Message(%d)", index[r.msg])
		case "Map":
			return fmt.Sprintf("Ty::Map(%d)", r.m)
		}
		return "Ty::" + r.ty
	}
	flagStr := func(f int) string {
		var s []string
		for _, fn := range flagNames {
			if f&fn.bit != 0 {
				s = append(s, fn.name)
			}
		}
		if len(s) == 0 {
			return "0"
		}
		return strings.Join(s, " | ")
	}

	// %q is Rust's string syntax only for plain ASCII.
	for _, m := range msgs {
		for _, f := range m.fields {
			for _, c := range m.name + f.json {
				if c < ' ' || c > '~' || c == '"' || c == '\\' {
					fmt.Fprintf(os.Stderr, "proto-schema: %s: name %q needs escaping\n", m.name, f.json)
					os.Exit(1)
				}
			}
		}
	}

	var b bytes.Buffer
	fmt.Fprintf(&b, "// Generated by `cargo xtask proto-schema` (xtask/proto-schema) from the Go types of\n")
	for _, v := range moduleVersions() {
		fmt.Fprintf(&b, "// %s\n", v)
	}
	b.WriteString(`// by reflection. Do not edit. (The tables are #[rustfmt::skip]: one line a
// field; rustfmt would spread each over six.)
//
// Conventions beyond schema.rs:
// - Message names are go-to-protobuf's: the Go package path with '/' as '.'
//   and '-' as '_', then the type name.
// - A message whose fields all have an empty json name (and no INLINE flag)
//   is not a JSON object but the value of one of its fields:
//   - a Go named slice that go-to-protobuf wraps in a message
//     (metav1.Verbs, ExtraValue...: "synthetic" below): its one field,
//     items = 1, REPEATED; the JSON is the array (` + "`[]`" + ` when empty);
//   - apiextensions JSONSchemaPropsOr{Array,Bool,StringArray} ("union"
//     below), whose MarshalJSON writes the value of the highest-numbered
//     field present in the bytes (a repeated field counts when it has an
//     element); when none is, the zero of field 1 if it is not a POINTER
//     (` + "`false`" + ` for OrBool's allows), else null.
`)
	b.WriteString("\nuse super::schema::{Field, INLINE, Kind, Message, OMITEMPTY, OMITZERO, POINTER, REPEATED, Ty};\n\n")
	fmt.Fprintf(&b, "/// Every message, by name; `Ty::Message(i)` is `MESSAGES[i]`.\n")
	b.WriteString("#[rustfmt::skip]\npub(crate) static MESSAGES: &[Message] = &[\n")
	nFields := 0
	for i, m := range msgs {
		if m.comment != "" {
			fmt.Fprintf(&b, "    // %d: %s\n", i, m.comment)
		}
		fmt.Fprintf(&b, "    Message { name: %q, fields: &[", m.name)
		if len(m.fields) > 0 {
			b.WriteString("\n")
		}
		for _, f := range m.fields {
			nFields++
			fmt.Fprintf(&b, "        Field { number: %d, json: %q, ty: %s, flags: %s },\n", f.number, f.json, ty(tyRef{ty: f.ty, msg: f.msg, m: f.mapIdx}), flagStr(f.flags))
		}
		if len(m.fields) > 0 {
			b.WriteString("    ")
		}
		b.WriteString("] },\n")
	}
	b.WriteString("];\n\n")
	b.WriteString("/// Every Go map's (key, value) types; `Ty::Map(i)` is `MAPS[i]`.\n")
	b.WriteString("#[rustfmt::skip]\npub(crate) static MAPS: &[(Ty, Ty)] = &[\n")
	for _, e := range g.maps {
		fmt.Fprintf(&b, "    (%s, %s),\n", ty(e.key), ty(e.val))
	}
	b.WriteString("];\n\n")
	b.WriteString("/// Every built-in kind with a `<Kind>List` in its group-version, by (apiVersion, kind).\n")
	b.WriteString("#[rustfmt::skip]\npub(crate) static KINDS: &[Kind] = &[\n")
	for _, k := range kinds {
		fmt.Fprintf(&b, "    Kind { api_version: %q, kind: %q, message: %d, list: %d },\n", k.apiVersion, k.kind, index[k.msg], index[k.list])
	}
	b.WriteString("];\n")

	if *out == "" {
		os.Stdout.Write(b.Bytes())
	} else if err := os.WriteFile(*out, b.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "proto-schema:", err)
		os.Exit(1)
	}
	notes := make([]string, 0, len(g.notes))
	for n := range g.notes {
		notes = append(notes, n)
	}
	sort.Strings(notes)
	verbose := os.Getenv("PROTO_SCHEMA_VERBOSE") != ""
	if verbose {
		for _, n := range notes {
			fmt.Fprintln(os.Stderr, "note:", n)
		}
		for _, s := range skipped {
			fmt.Fprintln(os.Stderr, "skipped (no protobuf tags):", s)
		}
	}
	fmt.Fprintf(os.Stderr, "proto-schema: %d messages, %d fields, %d maps, %d kinds (%d notes, %d registered types without protobuf tags; PROTO_SCHEMA_VERBOSE=1 lists them)\n",
		len(msgs), nFields, len(g.maps), len(kinds), len(notes), len(skipped))
}

// moduleVersions: the k8s.io modules this binary was built from.
func moduleVersions() []string {
	var vs []string
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "k8s.io/api", "k8s.io/apimachinery", "k8s.io/client-go", "k8s.io/apiextensions-apiserver":
				v := d.Version
				if d.Replace != nil {
					v = d.Replace.Version
				}
				vs = append(vs, d.Path+" "+v)
			}
		}
	}
	sort.Strings(vs)
	if len(vs) == 0 {
		vs = []string{"(module versions unknown: see xtask/proto-schema/go.mod)"}
	}
	return vs
}
