package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/namesrv"
)

type brokerFlags struct {
	listen        string
	namesrvListen string
	namesrv       string
	dataDir       string
	flush         string
	autoCreate    bool
	brokerName    string
	cluster       string
	advertise     string
	noNamesrv     bool
	noBroker      bool
	logLevel      string
	shutdownWait  time.Duration
	aclFile       string
	tlsMode       string
	tlsCert       string
	tlsKey        string
	tlsClientCA   string
}

func newBrokerCmd() *cobra.Command {
	f := brokerFlags{}
	cmd := &cobra.Command{
		Use:   "broker",
		Short: "Run the embedded RocketMQ-compatible name server and broker",
		Long: `Runs a RocketMQ-compatible name server and broker in one process, storing
messages on Pebble under --data. Unmodified RocketMQ clients can produce to and
consume from it: point them at the name server address (--namesrv-listen).

Run only the name server with --no-broker, or only a broker registering with
other name servers with --no-namesrv --namesrv "host:port;host:port".
A line starting with "runnel: ready" is printed on stdout once it serves.
SIGINT or SIGTERM shut it down cleanly.

--acl-file and the --tls-* flags secure the embedded name server (for now
together with --no-broker: the broker does not yet sign its registration nor
dial name servers over TLS). With --acl-file every request must be signed by
an account of the file (RocketMQ AccessKey/Signature) and TLS defaults to
enforcing; SIGHUP reloads the file (an invalid file is reported and the
previous one stays in force).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBroker(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.listen, "listen", broker.DefaultListenAddr, "broker listen address host:port (port 0 picks a free port)")
	fl.StringVar(&f.namesrvListen, "namesrv-listen", namesrv.DefaultListenAddr, "name server listen address host:port")
	fl.StringVar(&f.namesrv, "namesrv", "", `name server addresses the broker registers with, ";"-separated (default: the embedded one)`)
	fl.StringVar(&f.dataDir, "data", "", "data directory (default: runnel/broker under the user cache directory)")
	fl.StringVar(&f.flush, "flush", "sync", "flush mode: sync (acknowledge after fsync, group commit) or async")
	fl.BoolVar(&f.autoCreate, "auto-create", true, "create topics on first send through the default topic TBW102")
	fl.StringVar(&f.brokerName, "broker-name", broker.DefaultBrokerName, "broker name")
	fl.StringVar(&f.cluster, "cluster", broker.DefaultClusterName, "cluster name")
	fl.StringVar(&f.advertise, "advertise", "", "address clients should use for the broker (default: the bound listen address)")
	fl.BoolVar(&f.noNamesrv, "no-namesrv", false, "do not run the embedded name server (requires --namesrv)")
	fl.BoolVar(&f.noBroker, "no-broker", false, "run only the name server")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.DurationVar(&f.shutdownWait, "shutdown-timeout", 10*time.Second, "how long a graceful shutdown may take")
	fl.StringVar(&f.aclFile, "acl-file", "", "name server ACL file (JSON accounts and permissions); SIGHUP reloads it")
	fl.StringVar(&f.tlsMode, "tls-mode", "", "name server TLS mode: disabled, permissive or enforcing (default: enforcing with --acl-file, else disabled)")
	fl.StringVar(&f.tlsCert, "tls-cert", "", "name server TLS certificate file (PEM)")
	fl.StringVar(&f.tlsKey, "tls-key", "", "name server TLS private key file (PEM)")
	fl.StringVar(&f.tlsClientCA, "tls-client-ca", "", "CA bundle (PEM) client certificates must chain to; makes client certificates mandatory on TLS connections")
	return cmd
}

func (f *brokerFlags) validate() (broker.FlushMode, slog.Level, error) {
	var mode broker.FlushMode
	switch f.flush {
	case "sync":
		mode = broker.FlushSync
	case "async":
		mode = broker.FlushAsync
	default:
		return 0, 0, fmt.Errorf("--flush %q: want sync or async", f.flush)
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return 0, 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	if f.noBroker && f.noNamesrv {
		return 0, 0, errors.New("--no-broker and --no-namesrv together leave nothing to run")
	}
	if f.noNamesrv && !f.noBroker && strings.TrimSpace(f.namesrv) == "" {
		return 0, 0, errors.New("--no-namesrv needs --namesrv addresses for the broker to register with")
	}
	if f.shutdownWait <= 0 {
		return 0, 0, fmt.Errorf("--shutdown-timeout %v: must be positive", f.shutdownWait)
	}
	return mode, lvl, nil
}

// security builds the name server's ACL and TLS options from the flags. It
// refuses combinations that cannot work yet instead of half-applying them.
func (f *brokerFlags) security(log *slog.Logger) ([]namesrv.Option, *acl.Policy, acl.TLSMode, error) {
	mode, err := acl.ResolveTLSMode(f.tlsMode, f.aclFile != "")
	if err != nil {
		return nil, nil, 0, fmt.Errorf("--tls-mode: %w", err)
	}
	tlsFiles := f.tlsCert != "" || f.tlsKey != "" || f.tlsClientCA != ""
	if f.noNamesrv && (f.aclFile != "" || f.tlsMode != "" || tlsFiles) {
		return nil, nil, 0, errors.New("--acl-file and --tls-* configure the embedded name server: not with --no-namesrv")
	}
	if !f.noBroker && (f.aclFile != "" || mode == acl.TLSEnforcing) {
		// REGISTER_BROKER would be refused: the broker neither signs it nor dials over TLS yet.
		return nil, nil, 0, errors.New("--acl-file and --tls-mode enforcing need --no-broker for now: " +
			"the embedded broker cannot yet register with a name server that requires credentials or TLS")
	}
	var opts []namesrv.Option
	if mode == acl.TLSDisabled {
		if tlsFiles {
			return nil, nil, 0, errors.New("--tls-cert, --tls-key and --tls-client-ca need --tls-mode permissive or enforcing")
		}
	} else {
		cfg, err := acl.ServerTLSConfig(f.tlsCert, f.tlsKey, f.tlsClientCA)
		if err != nil {
			if f.tlsMode == "" {
				return nil, nil, 0, fmt.Errorf("--acl-file implies --tls-mode enforcing (override it explicitly to run without TLS): %w", err)
			}
			return nil, nil, 0, fmt.Errorf("--tls-mode %s: %w", mode, err)
		}
		opts = append(opts, namesrv.WithTLS(mode, cfg))
	}
	var policy *acl.Policy
	if f.aclFile != "" {
		if policy, err = acl.LoadPolicy(f.aclFile, acl.WithLogger(log)); err != nil {
			return nil, nil, 0, fmt.Errorf("--acl-file: %w", err)
		}
		opts = append(opts, namesrv.WithACL(policy))
		if mode != acl.TLSEnforcing {
			log.Warn("ACL without enforcing TLS: signed requests and their bodies can be read (and replayed) on the network", "tls", mode.String())
		}
	}
	return opts, policy, mode, nil
}

func defaultDataDir() (string, error) {
	dir, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no --data given and no user cache directory: %w", err)
	}
	return filepath.Join(dir, "runnel", "broker"), nil
}

func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ";") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// runBroker starts what the flags ask for and blocks until ctx is done (a
// signal), then shuts everything down gracefully.
func runBroker(ctx context.Context, stdout, stderr io.Writer, f brokerFlags) (err error) {
	mode, lvl, err := f.validate()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	secOpts, policy, tlsMode, err := f.security(log.With("component", "acl"))
	if err != nil {
		return err
	}

	var ns *namesrv.Server
	nsAddrs := splitAddrs(f.namesrv)
	if !f.noNamesrv {
		ns, err = namesrv.New(append([]namesrv.Option{namesrv.WithListenAddr(f.namesrvListen),
			namesrv.WithLogger(log.With("component", "namesrv"))}, secOpts...)...)
		if err != nil {
			return err
		}
		if err := ns.Start(ctx); err != nil {
			return fmt.Errorf("name server: %w", err)
		}
		defer func() { err = errors.Join(err, shutdown(f.shutdownWait, ns.Shutdown)) }()
		if len(nsAddrs) == 0 {
			nsAddrs = []string{ns.Addr()}
		}
	}

	var b *broker.Broker
	if !f.noBroker {
		dir := f.dataDir
		if dir == "" {
			if dir, err = defaultDataDir(); err != nil {
				return err
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("data directory: %w", err)
		}
		opts := []broker.Option{
			broker.WithListenAddr(f.listen),
			broker.WithDataDir(dir),
			broker.WithNameServers(nsAddrs...),
			broker.WithFlushMode(mode),
			broker.WithAutoCreateTopics(f.autoCreate),
			broker.WithBrokerName(f.brokerName),
			broker.WithClusterName(f.cluster),
			broker.WithLogger(log.With("component", "broker")),
		}
		if f.advertise != "" {
			opts = append(opts, broker.WithAdvertisedAddr(f.advertise))
		}
		if b, err = broker.New(opts...); err != nil {
			return err
		}
		if err := b.Start(ctx); err != nil {
			return fmt.Errorf("broker: %w", err)
		}
		defer func() { err = errors.Join(err, shutdown(f.shutdownWait, b.Shutdown)) }()
	}

	line := "runnel: ready"
	if ns != nil {
		line += " namesrv=" + ns.Addr() + " tls=" + tlsMode.String()
		if policy != nil {
			line += " acl=on"
		}
	}
	if b != nil {
		line += " broker=" + b.AdvertisedAddr() + " flush=" + f.flush
	}
	fmt.Fprintln(stdout, line)
	if ns != nil {
		fmt.Fprintf(stdout, "runnel: point RocketMQ clients at the name server %s; Ctrl-C stops\n", ns.Addr())
	}

	var hup chan os.Signal // nil (never ready) without an ACL file
	if policy != nil {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(stdout, "runnel: shutting down")
			return nil
		case <-hup:
			if err := policy.Reload(); err != nil {
				log.Error("ACL reload failed; the previous ACL stays in force", "file", f.aclFile, "err", err)
				continue
			}
			fmt.Fprintln(stdout, "runnel: ACL reloaded from", f.aclFile)
		}
	}
}

func shutdown(wait time.Duration, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return fn(ctx)
}
