package sql92

import (
	"fmt"
	"strings"
)

// tokKind is a token of RocketMQ's SelectorParser.jj.
type tokKind uint8

const (
	tEOF tokKind = iota
	tNot
	tAnd
	tOr
	tBetween
	tIn
	tTrue
	tFalse
	tNull
	tIs
	tContains
	tStartsWith
	tEndsWith
	tDecimal
	tFloat
	tString
	tID
	tEq    // =
	tNe    // <>
	tGt    // >
	tGe    // >=
	tLt    // <
	tLe    // <=
	tLP    // (
	tComma // ,
	tRP    // )
	tPlus  // +
	tMinus // -
)

var keywords = map[string]tokKind{
	"NOT": tNot, "AND": tAnd, "OR": tOr, "BETWEEN": tBetween, "IN": tIn, "TRUE": tTrue,
	"FALSE": tFalse, "NULL": tNull, "IS": tIs, "CONTAINS": tContains, "STARTSWITH": tStartsWith,
	"ENDSWITH": tEndsWith,
}

var tokNames = [...]string{
	tEOF: "<EOF>", tNot: "NOT", tAnd: "AND", tOr: "OR", tBetween: "BETWEEN", tIn: "IN", tTrue: "TRUE",
	tFalse: "FALSE", tNull: "NULL", tIs: "IS", tContains: "CONTAINS", tStartsWith: "STARTSWITH",
	tEndsWith: "ENDSWITH", tDecimal: "<DECIMAL_LITERAL>", tFloat: "<FLOATING_POINT_LITERAL>",
	tString: "<STRING_LITERAL>", tID: "<ID>", tEq: `"="`, tNe: `"<>"`, tGt: `">"`, tGe: `">="`,
	tLt: `"<"`, tLe: `"<="`, tLP: `"("`, tComma: `","`, tRP: `")"`, tPlus: `"+"`, tMinus: `"-"`,
}

type token struct {
	kind  tokKind
	image string // the matched text (for literals and identifiers)
	pos   int    // byte offset in the source
}

// lexer produces tokens on demand, as JavaCC's token manager does: the
// parser asks for at most two tokens ahead, so text after the end of the
// expression is never looked at (Java ignores it, unless the very next
// token is not lexable).
type lexer struct {
	src string
	pos int
}

type lexError struct {
	pos int
	ch  string
}

func (e *lexError) Error() string {
	return fmt.Sprintf("lexical error at column %d: encountered %q", e.pos+1, e.ch)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' }

func isIDStart(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '$'
}

func isIDPart(c byte) bool { return isIDStart(c) || isDigit(c) }

// next returns the next token, skipping white space and comments.
func (l *lexer) next() (token, error) {
	s := l.src
	for {
		for l.pos < len(s) && isSpace(s[l.pos]) {
			l.pos++
		}
		if l.pos >= len(s) {
			return token{kind: tEOF, pos: l.pos}, nil
		}
		// "--" to the end of the line, which must end: without a line
		// break the longest match is the "-" token.
		if strings.HasPrefix(s[l.pos:], "--") {
			if i := strings.IndexAny(s[l.pos+2:], "\n\r"); i >= 0 {
				l.pos += 2 + i + 1
				continue
			}
		}
		if strings.HasPrefix(s[l.pos:], "/*") {
			i := strings.Index(s[l.pos+2:], "*/")
			if i < 0 {
				return token{}, &lexError{pos: l.pos, ch: "/"}
			}
			l.pos += 2 + i + 2
			continue
		}
		break
	}
	start := l.pos
	c := s[start]
	one := func(k tokKind, n int) (token, error) {
		l.pos += n
		return token{kind: k, image: s[start:l.pos], pos: start}, nil
	}
	switch {
	case c == '=':
		return one(tEq, 1)
	case c == '<':
		if start+1 < len(s) && s[start+1] == '>' {
			return one(tNe, 2)
		}
		if start+1 < len(s) && s[start+1] == '=' {
			return one(tLe, 2)
		}
		return one(tLt, 1)
	case c == '>':
		if start+1 < len(s) && s[start+1] == '=' {
			return one(tGe, 2)
		}
		return one(tGt, 1)
	case c == '(':
		return one(tLP, 1)
	case c == ')':
		return one(tRP, 1)
	case c == ',':
		return one(tComma, 1)
	case c == '+':
		return one(tPlus, 1)
	case c == '-':
		return one(tMinus, 1)
	case c == '\'':
		i := start + 1
		for {
			if i >= len(s) {
				return token{}, &lexError{pos: start, ch: "'"}
			}
			if s[i] == '\'' {
				if i+1 < len(s) && s[i+1] == '\'' {
					i += 2
					continue
				}
				break
			}
			i++
		}
		return one(tString, i+1-start)
	case isDigit(c) || (c == '.' && start+1 < len(s) && isDigit(s[start+1])):
		return l.number()
	case isIDStart(c):
		i := start + 1
		for i < len(s) && isIDPart(s[i]) {
			i++
		}
		if k, ok := keywords[strings.ToUpper(s[start:i])]; ok {
			return one(k, i-start)
		}
		return one(tID, i-start)
	}
	r := s[start:]
	if n := utf8Len(r); n > 0 {
		r = r[:n]
	}
	return token{}, &lexError{pos: start, ch: r}
}

// number lexes DECIMAL_LITERAL or FLOATING_POINT_LITERAL, the longest
// match of:
//
//	DECIMAL: "0" | [1-9][0-9]* [lL]?
//	FLOAT:   [0-9]+ "." [0-9]* EXP? | "." [0-9]+ EXP? | [0-9]+ EXP
//	EXP:     [eE] [+-]? [0-9]+
func (l *lexer) number() (token, error) {
	s, start := l.src, l.pos
	i := start
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	digits := i - start
	isFloat := false
	if i < len(s) && s[i] == '.' {
		isFloat = true
		i++
		for i < len(s) && isDigit(s[i]) {
			i++
		}
	}
	if n := expLen(s[i:]); n > 0 {
		isFloat = true
		i += n
	}
	if isFloat {
		l.pos = i
		return token{kind: tFloat, image: s[start:i], pos: start}, nil
	}
	if s[start] == '0' {
		l.pos = start + 1
		return token{kind: tDecimal, image: "0", pos: start}, nil
	}
	i = start + digits
	if i < len(s) && (s[i] == 'l' || s[i] == 'L') {
		i++
	}
	l.pos = i
	return token{kind: tDecimal, image: s[start:i], pos: start}, nil
}

// expLen is the length of an exponent at the start of s, 0 when none.
func expLen(s string) int {
	if s == "" || (s[0] != 'e' && s[0] != 'E') {
		return 0
	}
	i := 1
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		i++
	}
	j := i
	for j < len(s) && isDigit(s[j]) {
		j++
	}
	if j == i {
		return 0
	}
	return j
}

// utf8Len is the byte length of the first UTF-8 sequence of s (1 for a
// bad byte).
func utf8Len(s string) int {
	for i := range s {
		if i > 0 {
			return i
		}
	}
	return len(s)
}
