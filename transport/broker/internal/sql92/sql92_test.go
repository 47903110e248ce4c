package sql92

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
)

// The vectors of Apache RocketMQ's own filter tests (filter/src/test/java/
// org/apache/rocketmq/filter/ExpressionTest.java and ParserTest.java,
// 5.3.3), with their contexts: typed values where the Java test puts
// Integers, Doubles or Booleans, strings where it puts strings. Java's
// eval helper counts a NULL or non-Boolean result as FALSE; so does
// Match. Where the Java evaluation throws, the vector says so (a broker
// then does not deliver the message).

type kv struct {
	k string
	v Value
}

func ctxOf(kvs ...kv) MapContext {
	m := MapContext{}
	for _, e := range kvs {
		m[e.k] = e.v
	}
	return m
}

func s(k, v string) kv          { return kv{k, StringValue(v)} }
func i(k string, v int32) kv    { return kv{k, IntValue(v)} }
func f(k string, v float64) kv  { return kv{k, DoubleValue(v)} }
func b(k string, v bool) kv     { return kv{k, BoolValue(v)} }
func null(k string) kv          { return kv{k, NullValue} }
func obj(k string) kv           { return kv{k, Value{K: Other}} }
func long(k string, v int64) kv { return kv{k, LongValue(v)} }
func mustParse(t *testing.T, e string) *Expr {
	t.Helper()
	x, err := Parse(e)
	if err != nil {
		t.Fatalf("Parse(%q): %v", e, err)
	}
	return x
}

// want is an expected outcome: TRUE, FALSE (FALSE or NULL) or an error.
type want int

const (
	wFalse want = iota
	wTrue
	wError
)

func check(t *testing.T, expr string, ctx Context, w want) {
	t.Helper()
	x := mustParse(t, expr)
	v, err := x.Evaluate(ctx)
	switch w {
	case wError:
		if err == nil {
			t.Errorf("%q on %v = %v, want an evaluation error", expr, ctx, v)
		} else if !errors.Is(err, errEval) {
			t.Errorf("%q on %v: error %v does not wrap errEval", expr, ctx, err)
		}
		if x.Match(ctx) {
			t.Errorf("%q on %v matched despite its error", expr, ctx)
		}
	default:
		if err != nil {
			t.Errorf("%q on %v: %v, want %v", expr, ctx, err, w == wTrue)
			return
		}
		if got := x.Match(ctx); got != (w == wTrue) {
			t.Errorf("%q on %v = %v (match %v), want %v", expr, ctx, v, got, w == wTrue)
		}
	}
}

const (
	andExpression        = "a=3 and b<>4 And c>5 AND d<=4"
	andExpressionHasBlnk = "a=3  and    b<>4 And c>5 AND d<=4"
	orExpression         = "a=3 or b<>4 Or c>5 OR d<=4"
	inExpression         = "a in ('3', '4', '5')"
	notInExpression      = "a not in ('3', '4', '5')"
	betweenExpression    = "a between 2 and 10"
	notBetweenExpression = "a not between 2 and 10"
	isNullExpression     = "a is null"
	isNotNullExpression  = "a is not null"
	equalExpression      = "a is not null and a='hello'"
	booleanExpression    = "a=TRUE OR b=FALSE"
	nullOrExpression     = "a is null OR a='hello'"
	stringHasString      = "TAGS is not null and TAGS='''''tag'''''"
)

func TestRocketMQExpressionVectors(t *testing.T) {
	type vec struct {
		expr string
		ctx  MapContext
		want want
	}
	var vs []vec
	add := func(expr string, ctx MapContext, w want) { vs = append(vs, vec{expr, ctx, w}) }
	three := func(ctx MapContext, not bool, search string, w want) {
		for _, op := range []string{"contains", "startswith", "endswith"} {
			if not {
				op = "not " + op
			}
			add("value "+op+" '"+search+"'", ctx, w)
		}
	}

	// testContains_StartsWith_EndsWith_has / _not / has_not / hasEmpty …
	axb := ctxOf(s("value", "axb"))
	add("value contains 'x'", axb, wTrue)
	add("value startswith 'ax'", axb, wTrue)
	add("value endswith 'xb'", axb, wTrue)
	add("value not contains 'x'", axb, wFalse)
	add("value not startswith 'ax'", axb, wFalse)
	add("value not endswith 'xb'", axb, wFalse)
	abb := ctxOf(s("value", "abb"))
	three(abb, false, "x", wFalse)
	three(abb, true, "x", wTrue)
	three(axb, false, "", wFalse)
	three(axb, true, "", wFalse)
	// null_has_1 (value present as null), null_has_2 (absent)
	three(ctxOf(null("value")), false, "x", wFalse)
	three(ctxOf(null("value")), true, "x", wFalse)
	three(ctxOf(), false, "x", wFalse)
	three(ctxOf(), true, "x", wFalse)
	// number_has, boolean_has, object_has
	three(ctxOf(f("value", 1.23)), false, "x", wFalse)
	three(ctxOf(f("value", 1.23)), true, "x", wFalse)
	three(ctxOf(b("value", true)), false, "x", wFalse)
	three(ctxOf(b("value", true)), true, "x", wFalse)
	three(ctxOf(obj("value")), false, "x", wFalse)
	// string_has_string and friends
	whatever := ctxOf(s("whatever", "whatever"))
	add("'axb' contains 'x'", whatever, wTrue)
	add("'axb' startswith 'ax'", whatever, wTrue)
	add("'axb' endswith 'xb'", whatever, wTrue)
	add("'axb' not contains 'x'", whatever, wFalse)
	add("'axb' not startswith 'ax'", whatever, wFalse)
	add("'axb' not endswith 'xb'", whatever, wFalse)
	for _, op := range []string{"contains", "startswith", "endswith"} {
		add("'axb' "+op+" 'u'", whatever, wFalse)
		add("'axb' not "+op+" 'u'", whatever, wTrue)
		add("'axb' "+op+" ''", whatever, wFalse)
		add("'axb' not "+op+" ''", whatever, wFalse)
		add("' ' "+op+" ' '", whatever, wTrue)
		add("' ' not "+op+" ' '", whatever, wFalse)
		add("'axb' "+op+" '.'", whatever, wFalse)
		add("'axb' not "+op+" '.'", whatever, wTrue)
		add(`'s' `+op+` '\'`, whatever, wFalse)
	}
	// testContainsAllInOne, testStartsWithAllInOne, testEndsWithAllInOne
	all := ctxOf(s("a", "3"), i("b", 3), s("c", "axbdc"))
	add("a not in ('4', '4', '5') and b between 3 and 10 and c not contains 'axbc'", all, wTrue)
	add("a not in ('4', '4', '5') and b between 3 and 10 and c not startswith 'axbc'", all, wTrue)
	add("a not in ('4', '4', '5') and b between 3 and 10 and c not endswith 'axbc'", all, wTrue)
	// testEvaluate_stringHasString
	add(stringHasString, ctxOf(s("TAGS", "''tag''")), wTrue)
	// testEvaluate_stringCompare: Java throws at the second evaluation;
	// the later blocks are what the test writes down (FALSE = no match).
	add("a between up and low", ctxOf(s("a", "3.14")), wFalse)
	add("a between up and low", ctxOf(s("a", "3.14"), s("up", "up"), s("low", "low")), wError)
	add("key is not null and key between 0 and 100", ctxOf(s("key", "con")), wError)
	add("a between 0 and 100", ctxOf(s("a", "abc")), wError)
	add("a=b", ctxOf(s("a", "3.14"), s("b", "3.14")), wTrue)
	add("a<>b", ctxOf(s("a", "3.14"), s("b", "3.14")), wFalse)
	add("a<>b", ctxOf(s("a", "3.14"), s("b", "3.141")), wTrue)
	// testEvaluate_exponent, floatNumber, twoVariable(Gt)
	add("a > 3.1E10", ctxOf(s("a", strconv.FormatFloat(3.1415*math.Pow(10, 10), 'E', -1, 64))), wTrue)
	add("a > 3.1E10", ctxOf(s("a", "3.1415E10")), wTrue)
	add("a > 3.14", ctxOf(s("a", "3.1415")), wTrue)
	add("a > b", ctxOf(s("a", "10"), s("b", "20")), wFalse)
	add("a > b", ctxOf(s("b", "10"), s("a", "20")), wTrue)
	// testEvaluate_nullOr
	add(nullOrExpression, ctxOf(), wTrue)
	add(nullOrExpression, ctxOf(s("a", "hello")), wTrue)
	add(nullOrExpression, ctxOf(s("a", "abc")), wFalse)
	// testEvaluate_boolean
	add(booleanExpression, ctxOf(s("a", "true"), s("b", "false")), wTrue)
	add(booleanExpression, ctxOf(s("a", "false"), s("b", "true")), wFalse)
	// testEvaluate_equal
	add(equalExpression, ctxOf(s("a", "hello")), wTrue)
	add(equalExpression, ctxOf(), wFalse)
	// testEvaluate_andTrue / andFalse
	add(andExpression, ctxOf(i("a", 3), i("b", 5), i("c", 6), i("d", 1)), wTrue)
	add(andExpression, ctxOf(s("a", "3"), s("b", "5"), s("c", "6"), s("d", "1")), wTrue)
	add(andExpression, ctxOf(i("a", 4), i("b", 5), i("c", 6), i("d", 1)), wFalse)
	add(andExpression, ctxOf(s("a", "4"), s("b", "5"), s("c", "6"), s("d", "1")), wFalse)
	// testEvaluate_orTrue / orFalse
	add(orExpression, ctxOf(i("a", 3)), wTrue)
	add(orExpression, ctxOf(i("a", 4), i("b", 5)), wTrue)
	add(orExpression, ctxOf(i("a", 4), i("b", 4), i("c", 6)), wTrue)
	add(orExpression, ctxOf(i("a", 4), i("b", 4), i("c", 3), i("d", 2)), wTrue)
	add(orExpression, ctxOf(i("a", 4), i("b", 4), i("c", 3), i("d", 10)), wFalse)
	// in / not in / between / not between / is (not) null
	for _, v := range []string{"3", "4", "5"} {
		add(inExpression, ctxOf(s("a", v)), wTrue)
		add(notInExpression, ctxOf(s("a", v)), wFalse)
	}
	add(inExpression, ctxOf(s("a", "8")), wFalse)
	add(notInExpression, ctxOf(s("a", "8")), wTrue)
	for _, v := range []string{"2", "10", "3"} {
		add(betweenExpression, ctxOf(s("a", v)), wTrue)
		add(notBetweenExpression, ctxOf(s("a", v)), wFalse)
	}
	for _, v := range []string{"1", "11"} {
		add(betweenExpression, ctxOf(s("a", v)), wFalse)
		add(notBetweenExpression, ctxOf(s("a", v)), wTrue)
	}
	add(isNullExpression, ctxOf(s("abc", "2")), wTrue)
	add(isNullExpression, ctxOf(s("a", "2")), wFalse)
	add(isNotNullExpression, ctxOf(s("a", "2")), wTrue)
	add(isNotNullExpression, ctxOf(s("abc", "2")), wFalse)
	// testEvaluate_now compares with NowExpression, which the grammar has
	// no syntax for ("now" is a property name); its typed form:
	add("a <= b", ctxOf(long("a", 1700000000000), long("b", 1700000000001)), wTrue)

	for _, v := range vs {
		check(t, v.expr, v.ctx, v.want)
	}
}

func TestRocketMQParserVectors(t *testing.T) {
	valid := []string{
		andExpression, orExpression, inExpression, "(a not in ('6', '4', '5')) or (b in ('3', '4', '5'))",
		"(a between 2 and 10) AND (b not between 6 and 9)", isNullExpression, isNotNullExpression,
		"a <= now", "a=3 and b contains 'xxx' and c not contains 'xxx'",
	}
	for _, e := range valid {
		if _, err := Parse(e); err != nil {
			t.Errorf("Parse(%q): %v", e, err)
		}
	}
	var huge strings.Builder
	huge.WriteString("1")
	for range 2048 {
		huge.WriteString("111111111111111111111111111111111111111111111111111")
	}
	huge.WriteString(".")
	for range 2048 {
		huge.WriteString("111111111111111111111111111111111111111111111111111")
	}
	invalid := []string{
		"a and between 2 and 10",       // testParse_invalid
		"a > 100000000000000000000000", // testParse_decimalOverFlow
		"a > " + huge.String(),         // testParse_floatOverFlow
		" a between 10 and 0",          // testParse_illegalBetween
		"value contains x",             // testContains_has_not_string_1
		"value not contains x",         //
		"value contains 123",           // testContains_has_not_string_2
		"value not contains 123",       //
		"'axb' contains ",              // testContains_string_has_nothing
		"'axb' not contains ",          //
	}
	for _, e := range invalid {
		x, err := Parse(e)
		if err == nil {
			t.Errorf("Parse(%.60q) = %s, want an error", e, x)
			continue
		}
		var pe *ParseError
		if !errors.As(err, &pe) || !strings.HasPrefix(err.Error(), "Invalid MessageSelector.") {
			t.Errorf("Parse(%.60q): %v is not a ParseError", e, err)
		}
	}
	// testEquals: blanks do not matter, operators do.
	e1, e2, e3 := mustParse(t, andExpression), mustParse(t, andExpressionHasBlnk), mustParse(t, orExpression)
	if e1.String() != e2.String() || e1.String() == e3.String() {
		t.Errorf("trees: %s | %s | %s", e1, e2, e3)
	}
}

// TestSQL92JavaRules covers the type and NULL rules of the Java classes
// beyond RocketMQ's vectors, each traced through the Java source.
func TestSQL92JavaRules(t *testing.T) {
	p := func(kvs ...kv) MapContext { return ctxOf(kvs...) }
	for _, c := range []struct {
		expr string
		ctx  MapContext
		want want
	}{
		// Strings parse as the other side's type; a bad number fails.
		{"a = 3", p(s("a", "3")), wTrue},
		{"a = 3", p(s("a", "03")), wTrue},
		{"a = 3", p(s("a", "+3")), wTrue},
		{"a = 3", p(s("a", "3.0")), wError},
		{"a = 3", p(s("a", " 3")), wError},
		{"a = 3", p(s("a", "x")), wError},
		{"a = 3.0", p(s("a", " 3 ")), wTrue}, // Double.valueOf trims
		{"a = 3.0", p(s("a", "3f")), wTrue},
		{"a > 1.5", p(s("a", "Infinity")), wTrue},
		{"a > 1.5", p(s("a", "inf")), wError},
		{"a > 1", p(s("a", "3000000000")), wError},          // Integer.valueOf overflows
		{"a > 3000000000", p(s("a", "3000000001")), wTrue},  // a Long literal
		{"a > 2147483647", p(s("a", "2147483648")), wError}, // an Integer literal: Integer.valueOf
		{"a = 'x'", p(s("a", "x")), wTrue},
		{"a <> 'x'", p(s("a", "y")), wTrue},
		{"a > 'x'", p(s("a", "y")), wFalse}, // fails at parse? no: a constant string on a side is refused
		// A comparison with NULL is unknown; NOT unknown is unknown.
		{"a > 1", p(), wFalse},
		{"NOT (a > 1)", p(), wFalse},
		{"NOT (a > 1) OR TRUE", p(), wTrue},
		{"a > 1 AND FALSE", p(), wFalse},
		{"a = b", p(), wTrue}, // two missing properties are equal (lv == rv)
		{"a = b", p(s("b", "1")), wFalse},
		{"a <> b", p(s("a", "1")), wTrue},
		// Short circuit: the failing right side is never evaluated.
		{"FALSE AND a > 1", p(s("a", "x")), wFalse},
		{"TRUE OR a > 1", p(s("a", "x")), wTrue},
		{"a > 1 OR TRUE", p(s("a", "x")), wError},
		// Booleans: 'true' in any case; TRUE = prop casts the Boolean.
		{"a = TRUE", p(s("a", "TRUE")), wTrue},
		{"a = TRUE", p(s("a", "yes")), wFalse},
		{"TRUE = a", p(s("a", "true")), wError},
		{"1 = TRUE", p(), wFalse},
		// A bare property is FALSE unless it is a Boolean value.
		{"a", p(s("a", "true")), wFalse},
		{"a", p(b("a", true)), wTrue},
		{"NOT a", p(s("a", "true")), wTrue},
		// IN needs a String.
		{"a IN ('1')", p(i("a", 1)), wFalse},
		{"a NOT IN ('1')", p(i("a", 1)), wFalse},
		{"a NOT IN ('1')", p(), wFalse},
		// Mixed numeric types convert up.
		{"a = 3", p(long("a", 3)), wTrue},
		{"a = 3", p(f("a", 3)), wTrue},
		{"a < 3", p(b("a", true)), wTrue}, // uncomparable classes: -1
		{"-a > -5", p(i("a", 3)), wTrue},
		{"-a > -5", p(s("a", "3")), wFalse}, // - of a string is NULL
		{"a = -2147483648", p(s("a", "-2147483648")), wTrue},
		// Keywords in any case; comments; trailing text ignored.
		{"a Is NoT nUlL", p(s("a", "1")), wTrue},
		{"/* c */ a = 1 -- c\n AND b = 2", p(s("a", "1"), s("b", "2")), wTrue},
		{"a = 1 b = 2", p(s("a", "1")), wTrue},
		{"a = 1 --", p(s("a", "1")), wTrue},
		{"(a = 1) AND ($x_1 = 'y')", p(s("a", "1"), s("$x_1", "y")), wTrue},
		{"a = 1.", p(s("a", "1")), wTrue},
		{"a = .5e1", p(s("a", "5")), wTrue},
		{"a = 5L", p(s("a", "5")), wTrue},
	} {
		if c.expr == "a > 'x'" {
			if _, err := Parse(c.expr); err == nil {
				t.Errorf("Parse(%q) succeeded; a string cannot be ordered", c.expr)
			}
			continue
		}
		check(t, c.expr, c.ctx, c.want)
	}
	for _, e := range []string{
		"", "a", "3", "'x'", "a = NULL", "NULL = a", "TRUE = 1", "a > TRUE", "a > 'x'", "(a > 1) > 2",
		"a IN ()", "a IN (1)", "'x' IN ('x')", "a = 0.0", "a > 1e-400", "a = 1 #", "a !=  1", "a == 1",
		"a is 5", "a NOT b", "a BETWEEN 1", "a BETWEEN 'x' AND 2", "a BETWEEN NULL AND 2", "a.b = 1",
		"'unterminated", "/* open", "NOT 3", "a AND 3", "-a", "a = 9223372036854775808", "a = 0L",
	} {
		switch e {
		case "a", "a = 0L":
			// "a" is a valid selector (a boolean cast); "a = 0L" parses
			// as "a = 0" followed by the ignored identifier L.
			if _, err := Parse(e); err != nil {
				t.Errorf("Parse(%q): %v", e, err)
			}
			continue
		}
		if x, err := Parse(e); err == nil {
			t.Errorf("Parse(%q) = %s, want an error", e, x)
		}
	}
}

func TestSQL92PropertiesContext(t *testing.T) {
	x := mustParse(t, "TAGS = 'a' AND k > 10 AND u IS NULL")
	props := "TAGS\x01a\x02k\x0111\x02UNIQ_KEY\x01id\x02"
	if !x.MatchProperties(props) {
		t.Error("no match on the properties string")
	}
	if x.MatchProperties("TAGS\x01b\x02k\x0111\x02") {
		t.Error("matched another tag")
	}
	if n := testing.AllocsPerRun(100, func() { x.MatchProperties(props) }); n != 0 {
		t.Errorf("MatchProperties allocates %v times", n)
	}
}

func FuzzSQL92Parse(f *testing.F) {
	for _, e := range []string{andExpression, orExpression, inExpression, betweenExpression, stringHasString,
		"a not between -1 and 2.5e3", "/* x */ NOT a IS NULL -- y\n", "a startswith 'x''y'"} {
		f.Add(e, "a\x013\x02b\x01x\x02")
	}
	f.Fuzz(func(t *testing.T, expr, props string) {
		x, err := Parse(expr)
		if err != nil {
			return
		}
		// Evaluation never panics; a match is a TRUE evaluation.
		v, err := x.Evaluate(PropertiesContext(props))
		if m := x.MatchProperties(props); m != (err == nil && v.K == Bool && v.B) {
			t.Fatalf("%q: match %v, evaluation %v %v", expr, m, v, err)
		}
	})
}
