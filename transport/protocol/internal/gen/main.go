// Command gen generates the protocol package's code tables and typed custom
// headers from definitions/codes.def and definitions/headers.def (run by
// go generate in the protocol package directory).
//
// Usage: go run ./internal/gen [-defs definitions] [-out .]
//
// It writes zz_generated.go (codes, names, header structs with Encode and
// Decode) and zz_generated_test.go (the list of every header, for tests).
// Output depends only on the definitions, so regenerating is reproducible.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"go/format"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unicode"
)

type code struct {
	java   string
	value  int64
	goName string
}

type field struct {
	key, goName, typ string
	required         bool
	doc              string
}

type header struct {
	goName   string
	response bool
	codes    []string // Java names
	fields   []field
	line     int
}

func main() {
	defs := flag.String("defs", "definitions", "directory holding codes.def and headers.def")
	out := flag.String("out", ".", "directory to write zz_generated.go and zz_generated_test.go to")
	flag.Parse()
	if err := run(*defs, *out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(defs, out string) error {
	reqs, ress, err := parseCodes(filepath.Join(defs, "codes.def"))
	if err != nil {
		return err
	}
	headers, err := parseHeaders(filepath.Join(defs, "headers.def"), reqs, ress)
	if err != nil {
		return err
	}
	src, err := format.Source(generate(reqs, ress, headers))
	if err != nil {
		return fmt.Errorf("formatting zz_generated.go: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, "zz_generated.go"), src, 0o644); err != nil {
		return err
	}
	tsrc, err := format.Source(generateTest(headers))
	if err != nil {
		return fmt.Errorf("formatting zz_generated_test.go: %w", err)
	}
	return os.WriteFile(filepath.Join(out, "zz_generated_test.go"), tsrc, 0o644)
}

// lines yields the non-blank, non-comment lines of a file with their numbers;
// indented reports whether the line started with whitespace.
func lines(path string, fn func(n int, indented bool, f []string, raw string) error) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		raw := sc.Text()
		t := strings.TrimSpace(raw)
		if t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		indented := raw[0] == ' ' || raw[0] == '\t'
		if err := fn(n, indented, strings.Fields(t), t); err != nil {
			return fmt.Errorf("%s:%d: %w", path, n, err)
		}
	}
	return sc.Err()
}

func camel(javaName string) string {
	var sb strings.Builder
	for _, part := range strings.Split(javaName, "_") {
		if part == "" {
			continue
		}
		sb.WriteString(strings.ToUpper(part[:1]))
		sb.WriteString(strings.ToLower(part[1:]))
	}
	return sb.String()
}

func parseCodes(path string) (reqs, ress []code, err error) {
	seen := map[string]bool{}
	err = lines(path, func(_ int, _ bool, f []string, _ string) error {
		if len(f) != 3 && len(f) != 4 {
			return fmt.Errorf("want: request|response NAME CODE [GoName]")
		}
		v, err := strconv.ParseInt(f[2], 10, 32)
		if err != nil {
			return err
		}
		c := code{java: f[1], value: v, goName: camel(f[1])}
		if len(f) == 4 {
			c.goName = f[3]
		}
		key := f[0] + " " + c.java
		if seen[key] {
			return fmt.Errorf("duplicate %s", key)
		}
		seen[key] = true
		switch f[0] {
		case "request":
			reqs = append(reqs, c)
		case "response":
			ress = append(ress, c)
		default:
			return fmt.Errorf("unknown kind %q", f[0])
		}
		return nil
	})
	return reqs, ress, err
}

func parseHeaders(path string, reqs, ress []code) ([]*header, error) {
	known := map[string]bool{}
	for _, c := range reqs {
		known[c.java] = true
	}
	var hs []*header
	names := map[string]bool{}
	err := lines(path, func(n int, indented bool, f []string, raw string) error {
		if !indented {
			if len(f) < 3 || f[0] != "header" || (f[2] != "request" && f[2] != "response") {
				return fmt.Errorf("want: header GoName request|response CODE...")
			}
			if names[f[1]] {
				return fmt.Errorf("duplicate header %s", f[1])
			}
			names[f[1]] = true
			h := &header{goName: f[1], response: f[2] == "response", codes: f[3:], line: n}
			for _, c := range h.codes {
				if !known[c] {
					return fmt.Errorf("unknown request code %s", c)
				}
			}
			hs = append(hs, h)
			return nil
		}
		if len(hs) == 0 {
			return fmt.Errorf("field before any header")
		}
		if len(f) < 4 {
			return fmt.Errorf("want: key GoField type !|? doc")
		}
		h := hs[len(hs)-1]
		fl := field{key: f[0], goName: f[1], typ: f[2], required: f[3] == "!"}
		if f[3] != "!" && f[3] != "?" {
			return fmt.Errorf("required flag %q is neither ! nor ?", f[3])
		}
		switch fl.typ {
		case "string", "int32", "int64", "bool":
		default:
			return fmt.Errorf("unknown type %q", fl.typ)
		}
		if !unicode.IsUpper(rune(fl.goName[0])) {
			return fmt.Errorf("Go field %q is not exported", fl.goName)
		}
		if i := strings.Index(raw, " "+f[3]+" "); i >= 0 {
			fl.doc = strings.TrimSpace(raw[i+3:])
		}
		for _, o := range h.fields {
			if o.key == fl.key || o.goName == fl.goName {
				return fmt.Errorf("duplicate field %s in %s", fl.key, h.goName)
			}
		}
		h.fields = append(h.fields, fl)
		return nil
	})
	for _, h := range hs {
		req := 0
		for _, f := range h.fields {
			if f.required {
				req++
			}
		}
		if req > 64 {
			return nil, fmt.Errorf("%s: more than 64 required fields", h.goName)
		}
		if len(h.fields) == 0 {
			return nil, fmt.Errorf("%s: no fields", h.goName)
		}
	}
	return hs, err
}

type writer struct{ bytes.Buffer }

func (w *writer) p(format string, args ...any) { fmt.Fprintf(&w.Buffer, format+"\n", args...) }

func reqConst(java string, reqs []code) string {
	for _, c := range reqs {
		if c.java == java {
			return "Req" + c.goName
		}
	}
	return java
}

func generate(reqs, ress []code, hs []*header) []byte {
	var w writer
	w.p("// Code generated by internal/gen from definitions/codes.def and definitions/headers.def. DO NOT EDIT.")
	w.p("")
	w.p("package protocol")
	w.p("")
	w.p("// Request codes (Java RequestCode): the code of a request frame.")
	w.p("const (")
	for _, c := range reqs {
		w.p("\tReq%s int32 = %d // %s", c.goName, c.value, c.java)
	}
	w.p(")")
	w.p("")
	w.p("// Response codes (Java ResponseCode and RemotingSysResponseCode): the code")
	w.p("// of a response frame.")
	w.p("const (")
	for _, c := range ress {
		w.p("\tRes%s int32 = %d // %s", c.goName, c.value, c.java)
	}
	w.p(")")
	w.p("")
	for _, t := range []struct {
		fn, what string
		cs       []code
	}{{"RequestCodeName", "request", reqs}, {"ResponseCodeName", "response", ress}} {
		w.p("// %s returns the Java name of %s code c (\"%s\"), or \"\" for a", t.fn, t.what, t.cs[0].java)
		w.p("// code runnel does not know.")
		w.p("func %s(c int32) string {", t.fn)
		w.p("\tswitch c {")
		for _, c := range t.cs {
			w.p("\tcase %d:", c.value)
			w.p("\t\treturn %q", c.java)
		}
		w.p("\t}")
		w.p("\treturn \"\"")
		w.p("}")
		w.p("")
	}
	for _, h := range hs {
		genHeader(&w, h, reqs)
	}
	return w.Bytes()
}

func goType(f field) string {
	if f.required || f.typ == "string" {
		return f.typ
	}
	return "Opt[" + f.typ + "]"
}

func genHeader(w *writer, h *header, reqs []code) {
	var consts []string
	for _, c := range h.codes {
		consts = append(consts, reqConst(c, reqs))
	}
	kind := "requests"
	if h.response {
		kind = "responses to"
	}
	w.p("// %s is the custom header (extFields) of %s %s.", h.goName, kind, strings.Join(consts, ", "))
	w.p("// Required fields are plain values; optional numbers and booleans are Opt")
	w.p("// values, so that absent differs from zero; an optional string is absent")
	w.p("// when empty.")
	w.p("type %s struct {", h.goName)
	for _, f := range h.fields {
		req := "optional"
		if f.required {
			req = "required"
		}
		w.p("\t%s %s // %q, %s: %s", f.goName, goType(f), f.key, req, f.doc)
	}
	w.p("}")
	w.p("")
	w.p("// Encode sets h's fields as extFields of c: required fields always,")
	w.p("// optional ones when set (or non-empty).")
	w.p("func (h *%s) Encode(c *Command) {", h.goName)
	for _, f := range h.fields {
		ref := "h." + f.goName
		if !f.required {
			if f.typ == "string" {
				w.p("\tif %s != \"\" {", ref)
			} else {
				w.p("\tif %s.Set {", ref)
				ref += ".V"
			}
		}
		switch f.typ {
		case "string":
			w.p("\tc.SetExt(%q, %s)", f.key, ref)
		case "int32":
			w.p("\tc.SetExtInt(%q, int64(%s))", f.key, ref)
		case "int64":
			w.p("\tc.SetExtInt(%q, %s)", f.key, ref)
		case "bool":
			w.p("\tc.SetExtBool(%q, %s)", f.key, ref)
		}
		if !f.required {
			w.p("\t}")
		}
	}
	w.p("}")
	w.p("")
	w.p("// Decode sets h from c's extFields, ignoring unknown keys. A missing")
	w.p("// required field or an unparsable number is an error wrapping ErrBadHeader")
	w.p("// that names the key; booleans follow Java's parseBoolean.")
	w.p("func (h *%s) Decode(c *Command) error {", h.goName)
	w.p("\t*h = %s{}", h.goName)
	nreq := 0
	for _, f := range h.fields {
		if f.required {
			nreq++
		}
	}
	if nreq > 0 {
		w.p("\tvar seen uint64")
	}
	w.p("\tfor it := c.exts(); it.next(); {")
	w.p("\t\tf := &it.f")
	w.p("\t\tswitch f.Key {")
	bit := 0
	for _, f := range h.fields {
		w.p("\t\tcase %q:", f.key)
		var val string
		switch f.typ {
		case "string":
			val = "f.Value"
		case "bool":
			val = "parseBool(f.Value)"
		case "int32", "int64":
			w.p("\t\t\tv, err := parseInt%s(f.Key, f.Value)", f.typ[3:])
			w.p("\t\t\tif err != nil {")
			w.p("\t\t\t\treturn err")
			w.p("\t\t\t}")
			val = "v"
		}
		if f.required || f.typ == "string" {
			w.p("\t\t\th.%s = %s", f.goName, val)
		} else {
			w.p("\t\t\th.%s = Opt[%s]{V: %s, Set: true}", f.goName, f.typ, val)
		}
		if f.required {
			w.p("\t\t\tseen |= 1 << %d", bit)
			bit++
		}
	}
	w.p("\t\t}")
	w.p("\t}")
	if nreq > 0 {
		w.p("\tif seen != 1<<%d-1 {", nreq)
		bit = 0
		for _, f := range h.fields {
			if f.required {
				w.p("\t\tif seen&(1<<%d) == 0 {", bit)
				w.p("\t\t\treturn missingField(%q)", f.key)
				w.p("\t\t}")
				bit++
			}
		}
		w.p("\t}")
	}
	w.p("\treturn nil")
	w.p("}")
	w.p("")
}

func generateTest(hs []*header) []byte {
	var w writer
	w.p("// Code generated by internal/gen from definitions/headers.def. DO NOT EDIT.")
	w.p("")
	w.p("package protocol")
	w.p("")
	w.p("// generatedHeader is one generated header type and its required keys.")
	w.p("type generatedHeader struct {")
	w.p("\th        CustomHeader")
	w.p("\trequired []string")
	w.p("}")
	w.p("")
	w.p("// allHeaders returns a new zero value of every generated header.")
	w.p("func allHeaders() []generatedHeader {")
	w.p("\treturn []generatedHeader{")
	for _, h := range hs {
		var req []string
		for _, f := range h.fields {
			if f.required {
				req = append(req, strconv.Quote(f.key))
			}
		}
		w.p("\t\t{new(%s), []string{%s}},", h.goName, strings.Join(req, ", "))
	}
	w.p("\t}")
	w.p("}")
	return w.Bytes()
}
