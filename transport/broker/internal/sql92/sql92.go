// Package sql92 is RocketMQ's SQL92 message selector: the language of
// org.apache.rocketmq.filter (SelectorParser.jj and the expression classes),
// parsed and evaluated with the same results, the same NULL and type rules
// and the same parse-time checks.
//
// The language: comparisons (=, <>, >, >=, <, <=), BETWEEN and NOT BETWEEN,
// IN and NOT IN over string literals, IS [NOT] NULL, CONTAINS, STARTSWITH,
// ENDSWITH and their NOT forms, AND, OR, NOT, unary + and -, parentheses;
// string ('it”s'), integer (Integer, Long beyond int32, an l/L suffix),
// floating (Double) and boolean literals and NULL; property names
// [a-zA-Z_$][a-zA-Z0-9_$]*; keywords in any case; -- and /* */ comments.
//
// Evaluation follows Java's three-valued logic: a missing property is
// NULL, a comparison with NULL is NULL (unknown), AND and OR short-circuit
// on FALSE and TRUE, NOT NULL is NULL, and a message matches only when the
// expression is TRUE. A broker's properties are strings; comparing one
// with a number parses it as the number's type (Integer, Long or Double),
// and a string that does not parse makes the evaluation fail (the message
// does not match), as do >, >=, < and <= between two strings that are not
// both numbers. Java quirks kept on purpose: an expression parses when a
// prefix of it does (trailing text is ignored), TRUE = prop always fails,
// two missing properties are equal, 0.0 is not a valid literal.
//
// Expr values are immutable and safe for concurrent use; Match does not
// allocate.
package sql92

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// node is one expression of the tree.
type node interface {
	eval(ctx Context) (Value, error)
	// boolean reports whether the node is a Java BooleanExpression.
	boolean() bool
	String() string
}

// Context supplies the values of properties.
type Context interface {
	// Get returns the value of property name, NullValue when absent.
	Get(name string) Value
}

// PropertiesContext is a Context over a raw properties string (protocol
// §4.2): every value is a String, as a broker sees them.
type PropertiesContext string

// Get implements Context.
func (p PropertiesContext) Get(name string) Value {
	if v, ok := protocol.PropertyValue(string(p), name); ok {
		return StringValue(v)
	}
	return NullValue
}

// MapContext is a Context over typed values (missing names are NULL).
type MapContext map[string]Value

// Get implements Context.
func (m MapContext) Get(name string) Value { return m[name] }

// Expr is a parsed selector.
type Expr struct {
	src  string
	root node
}

// Source returns the text Parse was given.
func (e *Expr) Source() string { return e.src }

// String returns the parsed tree in Java's toString form.
func (e *Expr) String() string { return e.root.String() }

// Evaluate evaluates e: TRUE, FALSE or NULL (as a Value), or the runtime
// error that stopped it.
func (e *Expr) Evaluate(ctx Context) (Value, error) { return e.root.eval(ctx) }

// Match reports whether e is TRUE for ctx; a failed evaluation does not
// match (RocketMQ's ExpressionMessageFilter).
func (e *Expr) Match(ctx Context) bool {
	v, err := e.root.eval(ctx)
	return err == nil && v.K == Bool && v.B
}

// MatchProperties is Match over a raw properties string.
func (e *Expr) MatchProperties(props string) bool { return e.Match(PropertiesContext(props)) }

// ---- nodes ----

// constNode is a literal. isBool marks Java's BooleanConstantExpression
// (TRUE, FALSE, NULL), a BooleanExpression.
type constNode struct {
	v      Value
	isBool bool
}

func (n *constNode) eval(Context) (Value, error) { return n.v, nil }
func (n *constNode) boolean() bool               { return n.isBool }
func (n *constNode) String() string {
	switch n.v.K {
	case Null:
		return "NULL"
	case Bool:
		if n.v.B {
			return "TRUE"
		}
		return "FALSE"
	case String:
		return "'" + strings.ReplaceAll(n.v.S, "'", "''") + "'"
	}
	return n.v.String()
}

type propNode struct{ name string }

func (n *propNode) eval(ctx Context) (Value, error) { return ctx.Get(n.name), nil }
func (n *propNode) boolean() bool                   { return false }
func (n *propNode) String() string                  { return n.name }

// negNode is unary minus: NULL for anything but a number.
type negNode struct{ x node }

func (n *negNode) eval(ctx Context) (Value, error) {
	v, err := n.x.eval(ctx)
	if err != nil {
		return NullValue, err
	}
	switch v.K {
	case Int:
		return Value{K: Int, I: int64(-int32(v.I))}, nil // Java int negation wraps
	case Long:
		return LongValue(-v.I), nil
	case Double:
		return DoubleValue(-v.F), nil
	}
	return NullValue, nil
}
func (n *negNode) boolean() bool  { return false }
func (n *negNode) String() string { return "(- " + n.x.String() + ")" }

type notNode struct{ x node }

func (n *notNode) eval(ctx Context) (Value, error) {
	v, err := n.x.eval(ctx)
	if err != nil || v.K == Null {
		return NullValue, err
	}
	if v.K != Bool {
		return NullValue, errNotComparable // Java's (Boolean) cast
	}
	return BoolValue(!v.B), nil
}
func (n *notNode) boolean() bool  { return true }
func (n *notNode) String() string { return "(NOT " + n.x.String() + ")" }

// castNode turns a property into a boolean: NULL when absent, its value
// when a Boolean, else FALSE (a string never is).
type castNode struct{ x node }

func (n *castNode) eval(ctx Context) (Value, error) {
	v, err := n.x.eval(ctx)
	if err != nil || v.K == Null {
		return NullValue, err
	}
	if v.K != Bool {
		return FalseValue, nil
	}
	return v, nil
}
func (n *castNode) boolean() bool  { return true }
func (n *castNode) String() string { return n.x.String() }

type logicNode struct {
	and  bool
	l, r node
}

func asBool(v Value) (Value, error) {
	if v.K != Null && v.K != Bool {
		return NullValue, errNotComparable
	}
	return v, nil
}

func (n *logicNode) eval(ctx Context) (Value, error) {
	lv, err := n.l.eval(ctx)
	if err == nil {
		lv, err = asBool(lv)
	}
	if err != nil {
		return NullValue, err
	}
	if lv.K == Bool && lv.B != n.and { // AND: FALSE decides; OR: TRUE decides
		return lv, nil
	}
	rv, err := n.r.eval(ctx)
	if err == nil {
		rv, err = asBool(rv)
	}
	if err != nil {
		return NullValue, err
	}
	if rv.K == Bool && rv.B != n.and {
		return rv, nil
	}
	if lv.K == Null || rv.K == Null {
		return NullValue, nil
	}
	return BoolValue(n.and), nil
}
func (n *logicNode) boolean() bool { return true }
func (n *logicNode) String() string {
	op := "||"
	if n.and {
		op = "&&"
	}
	return "(" + n.l.String() + " " + op + " " + n.r.String() + ")"
}

// cmpOp is a comparison of ComparisonExpression.
type cmpOp uint8

const (
	opEq cmpOp = iota
	opGt
	opGe
	opLt
	opLe
)

var cmpSymbols = [...]string{opEq: "==", opGt: ">", opGe: ">=", opLt: "<", opLe: "<="}

type cmpNode struct {
	op   cmpOp
	l, r node
}

func (n *cmpNode) eval(ctx Context) (Value, error) {
	if n.op == opEq {
		return n.evalEq(ctx)
	}
	lv, err := n.l.eval(ctx)
	if err != nil || lv.K == Null {
		return NullValue, err
	}
	rv, err := n.r.eval(ctx)
	if err != nil || rv.K == Null {
		return NullValue, err
	}
	if lv.K == Other || rv.K == Other {
		return NullValue, errNotComparable
	}
	if lv.K == String && rv.K == String {
		// Strings are compared as numbers, or not at all.
		lf, err := parseJavaDouble(lv.S)
		if err == nil {
			var rf float64
			if rf, err = parseJavaDouble(rv.S); err == nil {
				return n.result(compareDouble(lf, rf)), nil
			}
		}
		return NullValue, &EvalError{Msg: "It's illegal to compare string by '>=', '>', '<', '<='. lv=" + lv.S + ", rv=" + rv.S}
	}
	c, err := compareValues(lv, rv)
	if err != nil {
		return NullValue, err
	}
	return n.result(c), nil
}

// evalEq is doCreateEqual's evaluate.
func (n *cmpNode) evalEq(ctx Context) (Value, error) {
	lv, err := n.l.eval(ctx)
	if err != nil {
		return NullValue, err
	}
	rv, err := n.r.eval(ctx)
	if err != nil {
		return NullValue, err
	}
	switch {
	case lv.isNull() && rv.isNull():
		return TrueValue, nil
	case lv.isNull():
		return NullValue, nil
	case rv.isNull():
		return FalseValue, nil
	case lv.equals(rv):
		return TrueValue, nil
	case lv.K == Other || rv.K == Other:
		return FalseValue, nil
	}
	c, err := compareValues(lv, rv)
	if err != nil {
		return NullValue, err
	}
	return BoolValue(c == 0), nil
}

func (n *cmpNode) result(c int) Value {
	switch n.op {
	case opGt:
		return BoolValue(c > 0)
	case opGe:
		return BoolValue(c >= 0)
	case opLt:
		return BoolValue(c < 0)
	case opLe:
		return BoolValue(c <= 0)
	}
	return BoolValue(c == 0)
}
func (n *cmpNode) boolean() bool { return true }
func (n *cmpNode) String() string {
	return "(" + n.l.String() + " " + cmpSymbols[n.op] + " " + n.r.String() + ")"
}

// strOp is CONTAINS, STARTSWITH or ENDSWITH.
type strOp uint8

const (
	sContains strOp = iota
	sStartsWith
	sEndsWith
)

var strSymbols = [...]string{sContains: "CONTAINS", sStartsWith: "STARTSWITH", sEndsWith: "ENDSWITH"}

type strNode struct {
	op     strOp
	not    bool
	x      node
	search string
}

func (n *strNode) eval(ctx Context) (Value, error) {
	if n.search == "" {
		return FalseValue, nil
	}
	v, err := n.x.eval(ctx)
	if err != nil {
		return NullValue, err
	}
	if v.K != String {
		return FalseValue, nil
	}
	var hit bool
	switch n.op {
	case sContains:
		hit = strings.Contains(v.S, n.search)
	case sStartsWith:
		hit = strings.HasPrefix(v.S, n.search)
	default:
		hit = strings.HasSuffix(v.S, n.search)
	}
	return BoolValue(hit != n.not), nil
}
func (n *strNode) boolean() bool { return true }
func (n *strNode) String() string {
	sym := strSymbols[n.op]
	if n.not {
		sym = "NOT " + sym
	}
	return "(" + sym + " " + n.x.String() + ")"
}

type inNode struct {
	x    *propNode
	list []string
	not  bool
}

func (n *inNode) eval(ctx Context) (Value, error) {
	v, _ := n.x.eval(ctx)
	if v.K != String {
		return NullValue, nil // NULL, or not a String
	}
	return BoolValue(slices.Contains(n.list, v.S) != n.not), nil
}
func (n *inNode) boolean() bool { return true }
func (n *inNode) String() string {
	sym := "IN"
	if n.not {
		sym = "NOT IN"
	}
	return n.x.String() + " " + sym + " ( " + strings.Join(n.list, ", ") + " )"
}

// ---- parser ----

// ParseError is a selector that does not parse (or fails one of the
// parser's checks): RocketMQ's MQFilterException "Invalid MessageSelector.".
type ParseError struct {
	Expr string
	Msg  string
}

func (e *ParseError) Error() string { return "Invalid MessageSelector. " + e.Msg }

// Parse parses a selector as RocketMQ's SelectorParser does.
func Parse(src string) (*Expr, error) {
	p := &parser{lx: lexer{src: src}}
	root, err := p.selector()
	if err != nil {
		msg := err.Error()
		if pe, ok := err.(*ParseError); ok {
			msg = pe.Msg
		}
		return nil, &ParseError{Expr: src, Msg: msg}
	}
	return &Expr{src: src, root: root}, nil
}

type parser struct {
	lx   lexer
	la   [2]token
	nla  int // tokens looked ahead in la
	last token
}

// peek returns the i-th token ahead (0 or 1).
func (p *parser) peek(i int) (token, error) {
	for p.nla <= i {
		t, err := p.lx.next()
		if err != nil {
			return token{}, err
		}
		p.la[p.nla] = t
		p.nla++
	}
	return p.la[i], nil
}

func (p *parser) peekKind(i int) (tokKind, error) {
	t, err := p.peek(i)
	return t.kind, err
}

// take consumes the next token, which must be of kind k.
func (p *parser) take(k tokKind) (token, error) {
	t, err := p.peek(0)
	if err != nil {
		return token{}, err
	}
	if t.kind != k {
		return token{}, unexpected(t, tokNames[k])
	}
	p.la[0] = p.la[1]
	p.nla--
	p.last = t
	return t, nil
}

func unexpected(t token, want string) error {
	what := tokNames[t.kind]
	if t.image != "" {
		what = strconv.Quote(t.image)
	}
	return fmt.Errorf("encountered %s at column %d, expected %s", what, t.pos+1, want)
}

func checkErr(format string, args ...any) error {
	return &ParseError{Msg: fmt.Sprintf(format, args...)}
}

// selector is JmsSelector: orExpression, as a boolean. Tokens after it
// are not read.
func (p *parser) selector() (node, error) {
	n, err := p.orExpr()
	if err != nil {
		return nil, err
	}
	return asBooleanExpr(n)
}

func asBooleanExpr(n node) (node, error) {
	if n.boolean() {
		return n, nil
	}
	if pn, ok := n.(*propNode); ok {
		return &castNode{x: pn}, nil
	}
	return nil, checkErr("Expression will not result in a boolean value: %s", n)
}

func (p *parser) orExpr() (node, error) { return p.logicChain(tOr, p.andExpr) }

func (p *parser) andExpr() (node, error) { return p.logicChain(tAnd, p.equalityExpr) }

// logicChain parses operand (op operand)*, left-associative, for op tAnd
// or tOr.
func (p *parser) logicChain(op tokKind, operand func() (node, error)) (node, error) {
	left, err := operand()
	if err != nil {
		return nil, err
	}
	for {
		k, err := p.peekKind(0)
		if err != nil {
			return nil, err
		}
		if k != op {
			return left, nil
		}
		if _, err := p.take(op); err != nil {
			return nil, err
		}
		right, err := operand()
		if err != nil {
			return nil, err
		}
		if left, err = logic(op == tAnd, left, right); err != nil {
			return nil, err
		}
	}
}

func logic(and bool, l, r node) (node, error) {
	lb, err := asBooleanExpr(l)
	if err != nil {
		return nil, err
	}
	rb, err := asBooleanExpr(r)
	if err != nil {
		return nil, err
	}
	return &logicNode{and: and, l: lb, r: rb}, nil
}

var nullConst = &constNode{v: NullValue, isBool: true}

func (p *parser) equalityExpr() (node, error) {
	left, err := p.comparisonExpr()
	if err != nil {
		return nil, err
	}
	for {
		k, err := p.peekKind(0)
		if err != nil {
			return nil, err
		}
		switch k {
		case tEq, tNe:
			_, _ = p.take(k)
			right, err := p.comparisonExpr()
			if err != nil {
				return nil, err
			}
			eq, err := createEqual(left, right)
			if err != nil {
				return nil, err
			}
			if k == tNe {
				left = &notNode{x: eq}
			} else {
				left = eq
			}
		case tIs:
			k1, err := p.peekKind(1)
			if err != nil {
				return nil, err
			}
			_, _ = p.take(tIs)
			if k1 == tNull {
				_, _ = p.take(tNull)
				left = &cmpNode{op: opEq, l: left, r: nullConst}
				continue
			}
			if _, err := p.take(tNot); err != nil {
				return nil, err
			}
			if _, err := p.take(tNull); err != nil {
				return nil, err
			}
			left = &notNode{x: &cmpNode{op: opEq, l: left, r: nullConst}}
		default:
			return left, nil
		}
	}
}

// createEqual is ComparisonExpression.createEqual with its checks.
func createEqual(l, r node) (node, error) {
	for _, n := range []node{l, r} {
		if c, ok := n.(*constNode); ok && c.v.K == Null {
			return nil, checkErr("'%s' cannot be compared.", n)
		}
	}
	lc, lok := l.(*constNode)
	_, rok := r.(*constNode)
	if lok && rok && lc.isBool && !r.boolean() {
		return nil, checkErr("'%s' cannot be compared with '%s'", l, r)
	}
	return &cmpNode{op: opEq, l: l, r: r}, nil
}

// checkLessThan is checkLessThanOperand: only numbers (or values not known
// until evaluation) can be ordered.
func checkLessThan(n node) error {
	if c, ok := n.(*constNode); ok {
		if c.v.isNumber() {
			return nil
		}
		return checkErr("Value '%s' cannot be compared.", n)
	}
	if n.boolean() {
		return checkErr("Value '%s' cannot be compared.", n)
	}
	return nil
}

func createOrder(op cmpOp, l, r node) (node, error) {
	if err := checkLessThan(l); err != nil {
		return nil, err
	}
	if err := checkLessThan(r); err != nil {
		return nil, err
	}
	return &cmpNode{op: op, l: l, r: r}, nil
}

func (p *parser) comparisonExpr() (node, error) {
	left, err := p.unaryExpr()
	if err != nil {
		return nil, err
	}
	for {
		k, err := p.peekKind(0)
		if err != nil {
			return nil, err
		}
		not := false
		switch k {
		case tGt, tGe, tLt, tLe:
			_, _ = p.take(k)
			right, err := p.unaryExpr()
			if err != nil {
				return nil, err
			}
			op := map[tokKind]cmpOp{tGt: opGt, tGe: opGe, tLt: opLt, tLe: opLe}[k]
			if left, err = createOrder(op, left, right); err != nil {
				return nil, err
			}
			continue
		case tNot:
			k1, err := p.peekKind(1)
			if err != nil {
				return nil, err
			}
			switch k1 {
			case tContains, tStartsWith, tEndsWith, tBetween, tIn:
			default:
				t, _ := p.peek(1)
				return nil, unexpected(t, "CONTAINS, STARTSWITH, ENDSWITH, BETWEEN or IN")
			}
			_, _ = p.take(tNot)
			not, k = true, k1
		case tContains, tStartsWith, tEndsWith, tBetween, tIn:
		default:
			return left, nil
		}
		_, _ = p.take(k)
		switch k {
		case tContains, tStartsWith, tEndsWith:
			s, err := p.stringLiteral()
			if err != nil {
				return nil, err
			}
			op := map[tokKind]strOp{tContains: sContains, tStartsWith: sStartsWith, tEndsWith: sEndsWith}[k]
			left = &strNode{op: op, not: not, x: left, search: s}
		case tBetween:
			low, err := p.unaryExpr()
			if err != nil {
				return nil, err
			}
			if _, err := p.take(tAnd); err != nil {
				return nil, err
			}
			high, err := p.unaryExpr()
			if err != nil {
				return nil, err
			}
			if left, err = createBetween(not, left, low, high); err != nil {
				return nil, err
			}
		case tIn:
			if _, err := p.take(tLP); err != nil {
				return nil, err
			}
			var list []string
			for {
				s, err := p.stringLiteral()
				if err != nil {
					return nil, err
				}
				list = append(list, s)
				k, err := p.peekKind(0)
				if err != nil {
					return nil, err
				}
				if k != tComma {
					break
				}
				_, _ = p.take(tComma)
			}
			if _, err := p.take(tRP); err != nil {
				return nil, err
			}
			pn, ok := left.(*propNode)
			if !ok {
				return nil, checkErr("Expected a property for In expression, got: %s", left)
			}
			left = &inNode{x: pn, list: list, not: not}
		}
	}
}

// createBetween is createBetween (value >= low AND value <= high, with the
// check that constant bounds are in order) or createNotBetween.
func createBetween(not bool, v, low, high node) (node, error) {
	if not {
		lt, err := createOrder(opLt, v, low)
		if err != nil {
			return nil, err
		}
		gt, err := createOrder(opGt, v, high)
		if err != nil {
			return nil, err
		}
		return &logicNode{and: false, l: lt, r: gt}, nil
	}
	lc, lok := low.(*constNode)
	hc, hok := high.(*constNode)
	if lok && hok {
		if lc.v.K == Null || hc.v.K == Null {
			return nil, checkErr("Illegal values of between, values can not be null!")
		}
		if lc.v.K != Other && hc.v.K != Other {
			c, err := compareValues(hc.v, lc.v)
			if err != nil {
				return nil, checkErr("%v", err)
			}
			if c < 0 {
				return nil, checkErr("Illegal values of between, left value(%s) must less than or equal to right value(%s)", lc.v, hc.v)
			}
		}
	}
	ge, err := createOrder(opGe, v, low)
	if err != nil {
		return nil, err
	}
	le, err := createOrder(opLe, v, high)
	if err != nil {
		return nil, err
	}
	return &logicNode{and: true, l: ge, r: le}, nil
}

func (p *parser) unaryExpr() (node, error) {
	k, err := p.peekKind(0)
	if err != nil {
		return nil, err
	}
	switch k {
	case tPlus:
		_, _ = p.take(tPlus)
		return p.unaryExpr()
	case tMinus:
		_, _ = p.take(tMinus)
		x, err := p.unaryExpr()
		if err != nil {
			return nil, err
		}
		return &negNode{x: x}, nil
	case tNot:
		_, _ = p.take(tNot)
		x, err := p.unaryExpr()
		if err != nil {
			return nil, err
		}
		b, err := asBooleanExpr(x)
		if err != nil {
			return nil, err
		}
		return &notNode{x: b}, nil
	}
	return p.primaryExpr()
}

func (p *parser) primaryExpr() (node, error) {
	t, err := p.peek(0)
	if err != nil {
		return nil, err
	}
	switch t.kind {
	case tID:
		_, _ = p.take(tID)
		return &propNode{name: t.image}, nil
	case tLP:
		_, _ = p.take(tLP)
		n, err := p.orExpr()
		if err != nil {
			return nil, err
		}
		if _, err := p.take(tRP); err != nil {
			return nil, err
		}
		return n, nil
	case tString:
		s, err := p.stringLiteral()
		if err != nil {
			return nil, err
		}
		return &constNode{v: StringValue(s)}, nil
	case tDecimal:
		_, _ = p.take(tDecimal)
		return decimalLiteral(t.image)
	case tFloat:
		_, _ = p.take(tFloat)
		return floatLiteral(t.image)
	case tTrue:
		_, _ = p.take(tTrue)
		return &constNode{v: TrueValue, isBool: true}, nil
	case tFalse:
		_, _ = p.take(tFalse)
		return &constNode{v: FalseValue, isBool: true}, nil
	case tNull:
		_, _ = p.take(tNull)
		return nullConst, nil
	}
	return nil, unexpected(t, "a literal, a property or (")
}

func (p *parser) stringLiteral() (string, error) {
	t, err := p.take(tString)
	if err != nil {
		return "", err
	}
	return strings.ReplaceAll(t.image[1:len(t.image)-1], "''", "'"), nil
}

// decimalLiteral is createFromDecimal: a Long, narrowed to an Integer
// when it fits.
func decimalLiteral(text string) (node, error) {
	text = strings.TrimRight(text, "lL")
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return nil, checkErr("NumberFormatException: For input string: %q", text)
	}
	if n >= math.MinInt32 && n <= math.MaxInt32 {
		return &constNode{v: Value{K: Int, I: n}}, nil
	}
	return &constNode{v: LongValue(n)}, nil
}

// floatLiteral is createFloat: a Double in [Double.MIN_VALUE,
// Double.MAX_VALUE] (so 0.0 is refused, as in Java).
func floatLiteral(text string) (node, error) {
	f, err := strconv.ParseFloat(text, 64)
	if err != nil && !isRange(err) {
		return nil, checkErr("NumberFormatException: For input string: %q", text)
	}
	if f > math.MaxFloat64 {
		return nil, checkErr("%s is greater than %v", text, math.MaxFloat64)
	}
	if f < math.SmallestNonzeroFloat64 {
		return nil, checkErr("%s is less than %v", text, math.SmallestNonzeroFloat64)
	}
	return &constNode{v: DoubleValue(f)}, nil
}

func isRange(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}
