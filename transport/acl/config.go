package acl

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"reflect"
	"strings"

	"github.com/go-playground/validator/v10"
)

// MaxConfigSize bounds an ACL file; a larger one is refused before it is
// parsed.
const MaxConfigSize = 4 << 20

// ErrInvalidConfig is wrapped by every error LoadConfig, ParseConfig and
// Config.Validate return for a configuration that cannot be used.
var ErrInvalidConfig = errors.New("acl: invalid configuration")

// Config is the content of an ACL file (JSON; see the package
// documentation for an example). It is plain data: build a Policy from it
// with NewPolicy, or let LoadPolicy read it from a file.
type Config struct {
	// AllowCIDRs, when not empty, is the global IP allow-list: a request
	// from an address outside every prefix ("10.0.0.0/8", "::1/128") is
	// refused before its signature is looked at. It grants nothing: an
	// allowed address still needs a valid signature (see the package
	// documentation for how this differs from RocketMQ).
	AllowCIDRs []string `json:"allowCIDRs" validate:"dive,required,cidr"`
	// AcceptUnsignedSecurityToken also accepts signatures that do not
	// cover the SecurityToken extField, as the official Go client
	// (rocketmq-client-go) computes them. See the package documentation.
	AcceptUnsignedSecurityToken bool `json:"acceptUnsignedSecurityToken"`
	// Accounts are the identities requests are signed with. At least one.
	Accounts []Account `json:"accounts" validate:"required,min=1,dive"`
}

// Account is one identity: its keys and what it may do.
type Account struct {
	// AccessKey names the account in the AccessKey extField (6 to 128
	// printable ASCII characters, no spaces, unique in the file).
	AccessKey string `json:"accessKey" validate:"required,min=6,max=128,printascii,excludesall= "`
	// SecretKey is the HMAC-SHA1 key requests are signed with (6 to 256
	// characters). Keep the file readable by the server's user only.
	SecretKey string `json:"secretKey" validate:"required,min=6,max=256"`
	// Admin accounts may use every request code, including the admin-only
	// ones, and have PUB|SUB on every topic and group.
	Admin bool `json:"admin"`
	// DefaultTopicPerm applies to topics missing from TopicPerms; DENY when
	// empty.
	DefaultTopicPerm string `json:"defaultTopicPerm" validate:"omitempty,perm"`
	// DefaultGroupPerm applies to groups missing from GroupPerms; DENY when
	// empty.
	DefaultGroupPerm string `json:"defaultGroupPerm" validate:"omitempty,perm"`
	// TopicPerms maps topic names to PUB, SUB, PUB|SUB or DENY.
	TopicPerms map[string]string `json:"topicPerms" validate:"dive,keys,required,max=127,endkeys,required,perm"`
	// GroupPerms maps consumer group names to SUB (or PUB|SUB) or DENY.
	// A group's retry topic %RETRY%<group> is governed by the group's
	// permission.
	GroupPerms map[string]string `json:"groupPerms" validate:"dive,keys,required,max=255,endkeys,required,perm"`
}

// LoadConfig reads, parses and validates the ACL file at path. Errors wrap
// ErrInvalidConfig (or the file system error) and name the file.
func LoadConfig(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("acl: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, fmt.Errorf("acl: reading %s: %w", path, err)
	}
	if len(b) > MaxConfigSize {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalidConfig, path, MaxConfigSize)
	}
	cfg, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// ParseConfig parses and validates an ACL configuration in JSON. Unknown
// fields are errors (a misspelt key must not silently grant or deny).
func ParseConfig(b []byte) (*Config, error) {
	if len(b) > MaxConfigSize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrInvalidConfig, MaxConfigSize)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var cfg Config
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalidConfig, jsonErrorText(b, err))
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: data after the top-level object", ErrInvalidConfig)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// jsonErrorText adds the line and column to JSON syntax and type errors.
func jsonErrorText(b []byte, err error) string {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "the JSON ends early (unclosed object or array?)"
	}
	var off int64 = -1
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		off = te.Offset
	}
	if off < 0 || off > int64(len(b)) {
		return err.Error()
	}
	line := 1 + bytes.Count(b[:off], []byte("\n"))
	col := off - int64(bytes.LastIndexByte(b[:off], '\n'))
	return fmt.Sprintf("line %d column %d: %v", line, col, err)
}

// Validate checks c: the field rules in its validate tags, then the rules
// across fields (unique access keys, resource names, no retry topics in
// TopicPerms). The error wraps ErrInvalidConfig and lists every problem
// found, by JSON path ("accounts[1].secretKey: …"); it never contains a
// secret key.
func (c *Config) Validate() error {
	v := validator.New(validator.WithRequiredStructEnabled())
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			return f.Name
		}
		return name
	})
	if err := v.RegisterValidation("perm", func(fl validator.FieldLevel) bool {
		_, err := ParsePerm(fl.Field().String())
		return err == nil
	}); err != nil {
		return fmt.Errorf("acl: registering the perm validator: %w", err)
	}
	var problems []string
	if err := v.Struct(c); err != nil {
		var ves validator.ValidationErrors
		if !errors.As(err, &ves) {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		for _, fe := range ves {
			problems = append(problems, describe(fe))
		}
	}
	problems = append(problems, c.crossFieldProblems()...)
	if len(problems) > 0 {
		return fmt.Errorf("%w:\n  %s", ErrInvalidConfig, strings.Join(problems, "\n  "))
	}
	return nil
}

// describe turns one validator error into "path: what is wrong". Values are
// quoted only for fields that cannot hold a secret.
func describe(fe validator.FieldError) string {
	path := strings.TrimPrefix(fe.Namespace(), "Config.")
	switch fe.Tag() {
	case "required":
		return path + ": required"
	case "min":
		if fe.Kind() == reflect.Slice {
			return path + ": needs at least " + fe.Param() + " entry"
		}
		return path + ": must be at least " + fe.Param() + " characters"
	case "max":
		return path + ": must be at most " + fe.Param() + " characters"
	case "printascii", "excludesall":
		return path + ": only printable ASCII characters without spaces"
	case "perm":
		return fmt.Sprintf("%s: permission %q: want PUB, SUB, PUB|SUB or DENY", path, fe.Value())
	case "cidr":
		return fmt.Sprintf("%s: %q is not a CIDR prefix (write a single address as 10.1.2.3/32)", path, fe.Value())
	}
	return path + ": fails the " + fe.Tag() + " rule"
}

// crossFieldProblems checks what the validate tags cannot express.
func (c *Config) crossFieldProblems() []string {
	var out []string
	seen := make(map[string]int, len(c.Accounts))
	for i, a := range c.Accounts {
		if a.AccessKey != "" {
			if j, dup := seen[a.AccessKey]; dup {
				out = append(out, fmt.Sprintf("accounts[%d].accessKey: %q is also used by accounts[%d]", i, a.AccessKey, j))
			} else {
				seen[a.AccessKey] = i
			}
		}
		if a.SecretKey != "" && a.SecretKey == a.AccessKey {
			out = append(out, fmt.Sprintf("accounts[%d].secretKey: must differ from the access key", i))
		}
		for _, name := range sortedKeys(a.TopicPerms) {
			switch {
			case strings.HasPrefix(name, retryPrefix):
				out = append(out, fmt.Sprintf("accounts[%d].topicPerms[%s]: retry topics follow their group: set groupPerms[%s]",
					i, name, strings.TrimPrefix(name, retryPrefix)))
			case !validResourceName(name):
				out = append(out, fmt.Sprintf("accounts[%d].topicPerms[%s]: a topic name has only letters, digits, '%%', '|', '-' and '_'", i, name))
			}
		}
		for _, name := range sortedKeys(a.GroupPerms) {
			if !validResourceName(name) {
				out = append(out, fmt.Sprintf("accounts[%d].groupPerms[%s]: a group name has only letters, digits, '%%', '|', '-' and '_'", i, name))
			}
		}
	}
	for i, s := range c.AllowCIDRs {
		if p, err := netip.ParsePrefix(s); err == nil && p != p.Masked() {
			out = append(out, fmt.Sprintf("allowCIDRs[%d]: %q has host bits set; did you mean %s?", i, s, p.Masked()))
		}
	}
	return out
}

// validResourceName reports whether s uses RocketMQ's topic and group
// alphabet, ^[%|a-zA-Z0-9_-]+$.
func validResourceName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '%' || c == '|' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
