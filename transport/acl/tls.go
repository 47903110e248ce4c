package acl

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/runnel-dev/runnel/transport/remoting"
)

// TLSMode is how a server port treats TLS.
type TLSMode uint8

const (
	// TLSDisabled serves plain TCP only.
	TLSDisabled TLSMode = iota
	// TLSPermissive accepts TLS and plain TCP on the same port (for
	// migrating clients), telling them apart by the first byte.
	TLSPermissive
	// TLSEnforcing accepts TLS only.
	TLSEnforcing
)

// ParseTLSMode parses "disabled", "permissive" or "enforcing" (any letter
// case). Anything else is an error, so that a misspelt mode fails start-up
// instead of silently serving plain TCP.
func ParseTLSMode(s string) (TLSMode, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "disabled":
		return TLSDisabled, nil
	case "permissive":
		return TLSPermissive, nil
	case "enforcing":
		return TLSEnforcing, nil
	}
	return 0, fmt.Errorf("acl: TLS mode %q: want disabled, permissive or enforcing", s)
}

// String returns the name ParseTLSMode accepts.
func (m TLSMode) String() string {
	switch m {
	case TLSDisabled:
		return "disabled"
	case TLSPermissive:
		return "permissive"
	case TLSEnforcing:
		return "enforcing"
	}
	return fmt.Sprintf("TLSMode(%d)", uint8(m))
}

// ResolveTLSMode applies the rule "ACL on implies enforcing unless
// explicitly overridden": an empty requested mode is TLSEnforcing when
// aclEnabled and TLSDisabled otherwise; any other string is parsed. (ACL
// signatures do not reveal secret keys, but without TLS the requests,
// bodies and responses of an authenticated server travel in clear and can
// be replayed.)
func ResolveTLSMode(requested string, aclEnabled bool) (TLSMode, error) {
	if strings.TrimSpace(requested) == "" {
		if aclEnabled {
			return TLSEnforcing, nil
		}
		return TLSDisabled, nil
	}
	return ParseTLSMode(requested)
}

// ServerTLSConfig loads a server certificate and key (PEM files) and, when
// clientCAFile is not empty, a PEM bundle of CAs that client certificates
// must chain to: clients then must present one (mutual TLS; in permissive
// mode only the TLS clients). TLS 1.2 is the minimum.
func ServerTLSConfig(certFile, keyFile, clientCAFile string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("acl: TLS needs both a certificate file and a key file")
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("acl: loading TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if clientCAFile != "" {
		pem, err := os.ReadFile(clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("acl: reading client CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("acl: client CA file %s holds no PEM certificate", clientCAFile)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// TLSServerOptions returns the remoting.Server options of mode: none for
// TLSDisabled (cfg is then ignored), WithTLSConfig(cfg) for TLSEnforcing,
// and WithPermissiveTLS too for TLSPermissive. cfg is required unless the
// mode is TLSDisabled.
func TLSServerOptions(mode TLSMode, cfg *tls.Config) ([]remoting.ServerOption, error) {
	switch mode {
	case TLSDisabled:
		return nil, nil
	case TLSPermissive, TLSEnforcing:
		if cfg == nil {
			return nil, fmt.Errorf("acl: TLS mode %s needs a certificate and key", mode)
		}
		opts := []remoting.ServerOption{remoting.WithTLSConfig(cfg)}
		if mode == TLSPermissive {
			opts = append(opts, remoting.WithPermissiveTLS())
		}
		return opts, nil
	}
	return nil, fmt.Errorf("acl: unknown TLS mode %d", uint8(mode))
}
