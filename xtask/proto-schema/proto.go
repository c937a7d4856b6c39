package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"regexp"
	"strconv"
	"strings"
)

// The generated.proto files of the packages, read to check every field the
// reflection walk finds (the Go tags' wire types are not kept up to date)
// and to tell go-to-protobuf's wrapped slices from repeated fields.

type protoField struct {
	label string // "optional", "repeated" or "" (map)
	typ   string // as written: "string", "PodSpec", ".k8s.io...ObjectMeta", "map<string, string>"
	name  string
}

type protoFile struct {
	pkg      string
	messages map[string]map[int]protoField
}

type protoSet struct {
	dirs  map[string]string // Go import path -> directory
	files map[string]*protoFile
}

// loadDirs lists the directory of every package this program is built from.
func loadDirs() (map[string]string, error) {
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}\t{{.Dir}}", ".")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps: %v", err)
	}
	dirs := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		if p, d, ok := strings.Cut(l, "\t"); ok {
			dirs[p] = d
		}
	}
	return dirs, nil
}

var (
	reMessage = regexp.MustCompile(`^message (\w+) \{$`)
	reField   = regexp.MustCompile(`^\s+(?:(optional|repeated) )?(map<[^>]+>|[\w.]+) (\w+) = (\d+);$`)
)

// file parses the generated.proto of a Go package (nil if it has none).
func (s *protoSet) file(pkg string) *protoFile {
	if f, ok := s.files[pkg]; ok {
		return f
	}
	s.files[pkg] = nil
	dir, ok := s.dirs[pkg]
	if !ok {
		return nil
	}
	data, err := os.ReadFile(filepath.Join(dir, "generated.proto"))
	if err != nil {
		return nil
	}
	f := &protoFile{messages: map[string]map[int]protoField{}}
	var cur map[int]protoField
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		l := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(l), "//") || strings.TrimSpace(l) == "" {
			continue
		}
		if p, ok := strings.CutPrefix(l, "package "); ok {
			f.pkg = strings.TrimSuffix(p, ";")
			continue
		}
		if m := reMessage.FindStringSubmatch(l); m != nil {
			cur = map[int]protoField{}
			f.messages[m[1]] = cur
			continue
		}
		if l == "}" {
			cur = nil
			continue
		}
		if cur == nil {
			continue
		}
		m := reField.FindStringSubmatch(l)
		if m == nil {
			fmt.Fprintf(os.Stderr, "proto-schema: %s: cannot parse %q\n", pkg, l)
			os.Exit(1)
		}
		n, _ := strconv.Atoi(m[4])
		cur[n] = protoField{label: m[1], typ: m[2], name: m[3]}
	}
	s.files[pkg] = f
	return f
}

// check compares every message with its generated.proto one.
func (g *gen) check(msgs []*message) {
	for _, m := range msgs {
		pf := g.protos.file(m.t.PkgPath())
		if pf == nil {
			g.fail("%s: no generated.proto in %s", m.name, m.t.PkgPath())
			continue
		}
		if pf.pkg+"."+m.t.Name() != m.name {
			g.fail("%s: generated.proto says package %s", m.name, pf.pkg)
		}
		pm := pf.messages[m.t.Name()]
		if pm == nil {
			g.fail("%s: not in generated.proto", m.name)
			continue
		}
		ours := map[int]bool{}
		for _, f := range m.fields {
			ours[f.number] = true
			where := fmt.Sprintf("%s field %d", m.name, f.number)
			p, ok := pm[f.number]
			if !ok {
				g.fail("%s: not in generated.proto", where)
				continue
			}
			if f.protoName != "" && f.protoName != p.name {
				g.fail("%s: Go tag name %s, generated.proto %s", where, f.protoName, p.name)
			}
			repeated := f.flags&fRepeated != 0
			switch {
			case f.ty == "Map":
				e := g.maps[f.mapIdx]
				want := "map<" + g.protoType(e.key) + ", " + g.protoType(e.val) + ">"
				if got := resolve(pf.pkg, p.typ); p.label != "" || got != want {
					g.fail("%s: %s %s in generated.proto, want %s", where, p.label, got, want)
				}
			default:
				want := g.protoType(tyRef{ty: f.ty, msg: f.msg})
				wantLabel := "optional"
				if repeated {
					wantLabel = "repeated"
				}
				if got := resolve(pf.pkg, p.typ); got != want || p.label != wantLabel {
					g.fail("%s: %s %s in generated.proto, want %s %s", where, p.label, got, wantLabel, want)
				}
			}
		}
		for n, p := range pm {
			if !ours[n] {
				g.fail("%s: generated.proto field %d %s %s not found in the Go type", m.name, n, p.typ, p.name)
			}
		}
	}
}

// resolve makes a proto type name absolute (without the leading '.'),
// inside map<...> too.
func resolve(pkg, typ string) string {
	if inner, ok := strings.CutPrefix(typ, "map<"); ok {
		k, v, _ := strings.Cut(strings.TrimSuffix(inner, ">"), ",")
		return "map<" + resolve(pkg, strings.TrimSpace(k)) + ", " + resolve(pkg, strings.TrimSpace(v)) + ">"
	}
	if t, ok := strings.CutPrefix(typ, "."); ok {
		return t
	}
	switch typ {
	case "string", "bytes", "bool", "int32", "int64", "uint32", "uint64", "double", "float",
		"sint32", "sint64", "fixed32", "fixed64", "sfixed32", "sfixed64":
		return typ
	}
	return pkg + "." + typ
}

// protoType: the generated.proto type a Ty stands for.
func (g *gen) protoType(r tyRef) string {
	switch r.ty {
	case "String":
		return "string"
	case "Bytes":
		return "bytes"
	case "Bool":
		return "bool"
	case "Int32":
		return "int32"
	case "Int64":
		return "int64"
	case "Uint32":
		return "uint32"
	case "Uint64":
		return "uint64"
	case "Float64":
		return "double"
	}
	if r.msg == nil {
		return "?" + r.ty
	}
	if pf := g.protos.file(r.msg.PkgPath()); pf != nil && pf.pkg != "" {
		return pf.pkg + "." + r.msg.Name()
	}
	return protoName(r.msg)
}
