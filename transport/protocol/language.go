package protocol

import "strconv"

// LanguageCode is the implementation language a peer announces in every
// RemotingCommand header (Java enum LanguageCode). The ROCKETMQ binary header
// carries the code as one byte; the JSON header carries the Java enum name.
type LanguageCode uint8

// The language codes defined by Java's LanguageCode enum, in code order.
const (
	LanguageJava   LanguageCode = 0
	LanguageCPP    LanguageCode = 1
	LanguageDotNet LanguageCode = 2
	LanguagePython LanguageCode = 3
	LanguageDelphi LanguageCode = 4
	LanguageErlang LanguageCode = 5
	LanguageRuby   LanguageCode = 6
	LanguageOther  LanguageCode = 7
	LanguageHTTP   LanguageCode = 8
	LanguageGo     LanguageCode = 9
	LanguagePHP    LanguageCode = 10
	LanguageOMS    LanguageCode = 11
	LanguageRust   LanguageCode = 12
	LanguageNodeJS LanguageCode = 13
)

// CurrentVersion is the MQVersion ordinal runnel sends in the version field of
// every command it originates: V5_3_3, the version current Java brokers, name
// servers and clients send. Java clients gate features on the broker's
// version, so a realistic value matters.
const CurrentVersion int32 = 479

var languageNames = [...]string{
	LanguageJava:   "JAVA",
	LanguageCPP:    "CPP",
	LanguageDotNet: "DOTNET",
	LanguagePython: "PYTHON",
	LanguageDelphi: "DELPHI",
	LanguageErlang: "ERLANG",
	LanguageRuby:   "RUBY",
	LanguageOther:  "OTHER",
	LanguageHTTP:   "HTTP",
	LanguageGo:     "GO",
	LanguagePHP:    "PHP",
	LanguageOMS:    "OMS",
	LanguageRust:   "RUST",
	LanguageNodeJS: "NODE_JS",
}

// Known reports whether l is one of the codes Java's LanguageCode enum
// defines (0 to 13).
func (l LanguageCode) Known() bool { return int(l) < len(languageNames) }

// String returns the Java enum name ("JAVA", "GO", "NODE_JS", …), or
// "LanguageCode(N)" for a code Java does not define.
func (l LanguageCode) String() string {
	if l.Known() {
		return languageNames[l]
	}
	return "LanguageCode(" + strconv.Itoa(int(l)) + ")"
}

// ParseLanguage returns the code of a Java enum name, matched exactly (Java's
// Enum.valueOf is case-sensitive). ok is false for a name Java does not
// define; the JSON header decoder maps such names to LanguageOther.
func ParseLanguage(name string) (l LanguageCode, ok bool) {
	// A switch compiles to length-then-content comparisons: no allocation.
	switch name {
	case "JAVA":
		return LanguageJava, true
	case "CPP":
		return LanguageCPP, true
	case "DOTNET":
		return LanguageDotNet, true
	case "PYTHON":
		return LanguagePython, true
	case "DELPHI":
		return LanguageDelphi, true
	case "ERLANG":
		return LanguageErlang, true
	case "RUBY":
		return LanguageRuby, true
	case "OTHER":
		return LanguageOther, true
	case "HTTP":
		return LanguageHTTP, true
	case "GO":
		return LanguageGo, true
	case "PHP":
		return LanguagePHP, true
	case "OMS":
		return LanguageOMS, true
	case "RUST":
		return LanguageRust, true
	case "NODE_JS":
		return LanguageNodeJS, true
	}
	return LanguageOther, false
}
