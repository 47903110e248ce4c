// Package lint holds runnel's project-specific style checks, written as a Go
// test so that `make test` and `make lint` enforce them everywhere.
package lint

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// repoRoot is the top of the work tree (two levels up from this package).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

type goFile struct {
	rel  string // slash-separated path relative to the repo root
	file *ast.File
	fset *token.FileSet
}

func (g goFile) isTest() bool { return strings.HasSuffix(g.rel, "_test.go") }

// underAny reports whether the file lies under one of the given folders.
func (g goFile) underAny(dirs ...string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(g.rel, d+"/") {
			return true
		}
	}
	return false
}

func parseAll(t *testing.T) []goFile {
	t.Helper()
	root := repoRoot(t)
	var files []goFile
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		fset := token.NewFileSet()
		f, perr := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if perr != nil {
			return perr
		}
		rel, _ := filepath.Rel(root, path)
		files = append(files, goFile{rel: filepath.ToSlash(rel), file: f, fset: fset})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no Go files found: wrong repository root?")
	}
	return files
}

func importNames(f *ast.File) map[string]string {
	m := make(map[string]string) // local name -> import path
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		m[name] = p
	}
	return m
}

// TestForbiddenImports bans packages that runnel code must not use.
func TestForbiddenImports(t *testing.T) {
	banned := map[string]string{
		"github.com/pkg/errors": "use the standard library errors package with %w",
		"log":                   "use an injected *slog.Logger",
	}
	for _, g := range parseAll(t) {
		for _, imp := range g.file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			why, bad := banned[p]
			if !bad {
				continue
			}
			if p == "log" && (g.isTest() || g.underAny("cmd", "examples")) {
				continue
			}
			t.Errorf("%s imports %q: %s", g.rel, p, why)
		}
	}
}

var rawAtomic = regexp.MustCompile(`^(Add|Load|Store|Swap|CompareAndSwap|And|Or)(Int32|Int64|Uint32|Uint64|Uintptr|Pointer)$`)

// TestBannedCalls bans raw atomics, bare sleeps, fmt printing in libraries
// and panics built from formatted strings.
func TestBannedCalls(t *testing.T) {
	for _, g := range parseAll(t) {
		names := importNames(g.file)
		ast.Inspect(g.file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			pos := g.fset.Position(call.Pos())
			where := g.rel + ":" + strconv.Itoa(pos.Line)
			if id, ok := call.Fun.(*ast.Ident); ok && id.Name == "panic" && len(call.Args) == 1 {
				if inner, ok := call.Args[0].(*ast.CallExpr); ok {
					if sel, ok := inner.Fun.(*ast.SelectorExpr); ok {
						if x, ok := sel.X.(*ast.Ident); ok && names[x.Name] == "fmt" && sel.Sel.Name == "Sprintf" {
							t.Errorf("%s: panic(fmt.Sprintf(...)): return an error instead", where)
						}
					}
				}
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			switch names[x.Name] {
			case "sync/atomic":
				if rawAtomic.MatchString(sel.Sel.Name) {
					t.Errorf("%s: atomic.%s: use the atomic.Int64-style types", where, sel.Sel.Name)
				}
			case "time":
				if sel.Sel.Name == "Sleep" && !g.isTest() && !g.underAny("internal/backoff", "examples", "cmd") {
					t.Errorf("%s: time.Sleep in library code: wait on a timer with ctx or a quit channel", where)
				}
			case "fmt":
				if strings.HasPrefix(sel.Sel.Name, "Print") && !g.isTest() && !g.underAny("cmd", "examples", "internal/interop/cmd") {
					t.Errorf("%s: fmt.%s outside cmd/ and examples/: use the injected logger or an io.Writer", where, sel.Sel.Name)
				}
			}
			return true
		})
	}
}

// TestNoMachinePaths keeps this machine's paths and registry hosts out of
// every tracked file.
func TestNoMachinePaths(t *testing.T) {
	root := repoRoot(t)
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git work tree?)", err)
	}
	// Built from pieces so that this file does not match itself.
	needles := []string{"/work/" + "main", "/work/" + "shared", "/root/" + "go/", "/tmp/" + "bash_jobs"}
	for _, rel := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if rel == "" || strings.HasPrefix(rel, "LICENSE") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			continue // deleted in the work tree
		}
		s := string(b)
		for _, n := range needles {
			if strings.Contains(s, n) {
				t.Errorf("%s contains the machine path %q", rel, n)
			}
		}
	}
}

// TestNoProcessSpawning fails when the broker, the name server or the ACL
// package can start a process: they must not import os/exec, nor call
// os.StartProcess or syscall's exec and fork functions, directly or through
// another runnel package they import (RocketMQ's CVE-2023-33246 turned a
// remote config write into command execution; here there is nothing to
// turn). Test files are exempt: tests may re-execute binaries.
func TestNoProcessSpawning(t *testing.T) {
	const module = "github.com/runnel-dev/runnel/"
	guarded := []string{"transport/broker", "transport/namesrv", "transport/acl"}
	bannedCalls := map[string]map[string]bool{
		"os":      {"StartProcess": true},
		"syscall": {"Exec": true, "ForkExec": true, "StartProcess": true},
	}
	// Per runnel package directory: its runnel imports and its own offences.
	imports := map[string][]string{}
	offences := map[string][]string{}
	for _, g := range parseAll(t) {
		if g.isTest() {
			continue
		}
		dir := g.rel[:max(strings.LastIndex(g.rel, "/"), 0)]
		for _, imp := range g.file.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			if p == "os/exec" {
				offences[dir] = append(offences[dir], g.rel+" imports os/exec")
			}
			if rest, ok := strings.CutPrefix(p, module); ok {
				imports[dir] = append(imports[dir], rest)
			}
		}
		names := importNames(g.file)
		ast.Inspect(g.file, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); ok && bannedCalls[names[x.Name]][sel.Sel.Name] {
				pos := g.fset.Position(sel.Pos())
				offences[dir] = append(offences[dir], g.rel+":"+strconv.Itoa(pos.Line)+" uses "+names[x.Name]+"."+sel.Sel.Name)
			}
			return true
		})
	}
	for _, root := range guarded {
		// Every package at or under root, and every runnel package they reach.
		seen := map[string]string{} // package -> the package that imports it (itself for roots)
		var queue []string
		for dir := range mergeKeys(imports, offences) {
			if dir == root || strings.HasPrefix(dir, root+"/") {
				seen[dir], queue = dir, append(queue, dir)
			}
		}
		if len(queue) == 0 {
			continue // not written yet
		}
		for len(queue) > 0 {
			dir := queue[0]
			queue = queue[1:]
			for _, o := range offences[dir] {
				if seen[dir] == dir {
					t.Errorf("%s: %s", root, o)
				} else {
					t.Errorf("%s imports %s (via %s): %s", root, dir, seen[dir], o)
				}
			}
			for _, imp := range imports[dir] {
				if _, ok := seen[imp]; !ok {
					seen[imp], queue = dir, append(queue, imp)
				}
			}
		}
	}
	if len(imports) == 0 {
		t.Fatal("no runnel package found: the check would pass vacuously")
	}
}

// mergeKeys returns the union of the keys of two maps.
func mergeKeys[V any](a, b map[string]V) map[string]bool {
	out := make(map[string]bool, len(a)+len(b))
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

// TestCoreDependencies keeps what a user's go.mod lists small (issue 22
// item 11): since Go 1.17 a module's go.mod lists only the modules that
// provide packages its packages import, so a job importing runnel's core
// packages gets the modules of their import graph and nothing else of
// runnel's go.mod. The optional adapters (PostgreSQL, AMQP and watermill,
// OpenTelemetry, the OTLP exporter, the CLI) must stay out of that graph;
// Pebble (which brings the Prometheus client) and validator are the core's.
func TestCoreDependencies(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go command not found")
	}
	adapters := []string{
		"github.com/jackc/pgx", "github.com/rabbitmq/amqp091-go", "github.com/ThreeDotsLabs/watermill",
		"github.com/spf13/cobra", "github.com/spf13/pflag", "github.com/schollz/progressbar",
		"go.opentelemetry.io/otel/exporters/otlp", "google.golang.org/grpc", "google.golang.org/genproto",
	}
	for _, c := range []struct {
		pkgs   []string
		banned []string
	}{
		{[]string{"./pipeline", "./pipeline/window", "./source", "./source/rocketmq", "./source/sourcetest",
			"./sink", "./sink/rocketmq", "./sink/sinktest", "./state", "./checkpoint", "./transport/client", "./embedded"},
			append([]string{"go.opentelemetry.io/otel"}, adapters...)},
		// Instrumentation without the OTLP exporter (otel/otelenv has it).
		{[]string{"./otel"}, adapters},
	} {
		args := append([]string{"list", "-deps", "-f", "{{if .Module}}{{.Module.Path}}{{end}}"}, c.pkgs...)
		cmd := exec.Command("go", args...)
		cmd.Dir = repoRoot(t)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go list %v: %v", c.pkgs, err)
		}
		for _, mod := range strings.Fields(string(out)) {
			for _, b := range c.banned {
				if mod == b || strings.HasPrefix(mod, b+"/") {
					t.Errorf("%v depend on module %s (an optional adapter's)", c.pkgs, mod)
				}
			}
		}
	}
}
