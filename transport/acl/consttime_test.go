package acl_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestSignatureComparedInConstantTime fails when a computed signature is
// compared with the request's in any way but a constant-time one: in the
// package's own (non-test) code, every result of scratch.signature must go
// straight to hmac.Equal or subtle.ConstantTimeCompare, except in Sign and
// Signature, which produce signatures and compare nothing. A comparison
// with == on strings or bytes.Equal stops at the first differing byte, and
// its timing tells an attacker how much of a forged signature is right.
// The test also requires at least one such comparison, so that it cannot
// pass on code that no longer verifies at all.
func TestSignatureComparedInConstantTime(t *testing.T) {
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	compared := 0
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			producer := fn.Recv == nil && (fn.Name.Name == "Sign" || fn.Name.Name == "Signature")
			// The calls that are arguments of a constant-time comparison.
			safe := map[*ast.CallExpr]bool{}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if !ok || !isConstantTimeCompare(call) {
					return true
				}
				for _, a := range call.Args {
					if c, ok := a.(*ast.CallExpr); ok && isSignatureCall(c) {
						safe[c] = true
						compared++
					}
				}
				return true
			})
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				call, ok := n.(*ast.CallExpr)
				if ok && isSignatureCall(call) && !safe[call] && !producer {
					t.Errorf("%s: %s uses a computed signature other than as an argument of hmac.Equal or subtle.ConstantTimeCompare",
						fset.Position(call.Pos()), fn.Name.Name)
				}
				return true
			})
		}
	}
	if compared == 0 {
		t.Error("no signature is compared with hmac.Equal or subtle.ConstantTimeCompare")
	}
}

// isSignatureCall reports a call x.signature(...) (the scratch method
// computing a signature).
func isSignatureCall(c *ast.CallExpr) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "signature"
}

// isConstantTimeCompare reports a call hmac.Equal(...) or
// subtle.ConstantTimeCompare(...).
func isConstantTimeCompare(c *ast.CallExpr) bool {
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && (x.Name == "hmac" && sel.Sel.Name == "Equal" || x.Name == "subtle" && sel.Sel.Name == "ConstantTimeCompare")
}
