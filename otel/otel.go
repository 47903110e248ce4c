package otel

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/runnel-dev/runnel/runtime"
	"github.com/runnel-dev/runnel/transport/client"
)

// ScopeName is the instrumentation scope of runnel's tracer and meter.
const ScopeName = "github.com/runnel-dev/runnel/otel"

// MaxCheckpointLinks bounds the record spans one checkpoint span links to
// (the SDK's default link limit is 128 as well).
const MaxCheckpointLinks = 128

// maxPendingLinks bounds the traced records waiting for their checkpoint per
// job; records beyond it are not linked (counted in runnel.trace.links.dropped).
const maxPendingLinks = 4096

// ErrInvalidOption is returned by New for an unusable option.
var ErrInvalidOption = errors.New("otel: invalid option")

// Option configures New.
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	tp         trace.TracerProvider
	mp         metric.MeterProvider
	prop       propagation.TextMapPropagator
	ratio      float64
	prometheus bool
	group      string
}

// WithTracerProvider sets the tracer provider (default: none, no spans).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// WithMeterProvider sets the meter provider (default: none, unless
// WithPrometheus). It is exclusive with WithPrometheus.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithPrometheus makes New create its own meter provider exporting to a
// Prometheus registry of its own (never the global one), served by
// MetricsHandler (pipeline.MetricsAddress serves it for a job).
func WithPrometheus() Option { return optionFunc(func(c *config) { c.prometheus = true }) }

// WithPropagator sets the propagator (default: W3C trace context and
// baggage).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return optionFunc(func(c *config) { c.prop = p })
}

// WithSampleRatio sets the fraction (0 to 1) of records and sends WITHOUT a
// sampled parent context that are traced (default 1). It is decided before
// any allocation, so an unsampled record stays cheap; the tracer provider's
// sampler applies on top of it.
func WithSampleRatio(f float64) Option { return optionFunc(func(c *config) { c.ratio = f }) }

// WithConsumerGroup names the consumer group jobs read with, for the
// messaging.consumer.group.name attribute of their receive spans.
func WithConsumerGroup(group string) Option { return optionFunc(func(c *config) { c.group = group }) }

// Telemetry implements runnel's client and job hooks with OpenTelemetry.
// Give it to client.WithHooks and pipeline.Hooks (one Telemetry can serve
// several clients and jobs). It is safe for concurrent use. Shutdown
// releases the meter provider it created for WithPrometheus; providers
// passed in are the caller's to shut down.
type Telemetry struct {
	cfg      config
	tracer   trace.Tracer
	tracing  bool
	metrics  bool // a meter provider was given or made (WithMeterProvider, WithPrometheus)
	prop     propagation.TextMapPropagator
	meter    metric.Meter
	ownMP    *sdkmetric.MeterProvider
	registry *prometheus.Registry
	handler  http.Handler
	inst     instruments

	mu struct {
		sync.Mutex
		jobs map[string]*jobTrace
		regs map[runtime.JobView]metric.Registration
	}
}

// New returns a Telemetry.
func New(opts ...Option) (*Telemetry, error) {
	cfg := config{ratio: 1}
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	if cfg.ratio < 0 || cfg.ratio > 1 || cfg.ratio != cfg.ratio {
		return nil, fmt.Errorf("%w: sample ratio %v outside [0, 1]", ErrInvalidOption, cfg.ratio)
	}
	if cfg.prometheus && cfg.mp != nil {
		return nil, fmt.Errorf("%w: WithPrometheus and WithMeterProvider are exclusive", ErrInvalidOption)
	}
	t := &Telemetry{cfg: cfg, prop: cfg.prop}
	if t.prop == nil {
		t.prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	tp := cfg.tp
	if tp == nil {
		tp = tracenoop.NewTracerProvider()
	} else {
		t.tracing = true
	}
	t.tracer = tp.Tracer(ScopeName)
	mp := cfg.mp
	if cfg.prometheus {
		t.registry = prometheus.NewRegistry()
		exp, err := otelprom.New(otelprom.WithRegisterer(t.registry))
		if err != nil {
			return nil, fmt.Errorf("otel: prometheus exporter: %w", err)
		}
		t.ownMP = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
		mp = t.ownMP
		t.handler = promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{})
	}
	if mp == nil {
		mp = metricnoop.NewMeterProvider()
	} else {
		t.metrics = true
	}
	t.meter = mp.Meter(ScopeName)
	if err := t.inst.init(t.meter); err != nil {
		return nil, errors.Join(err, t.Shutdown(context.Background()))
	}
	t.mu.jobs = make(map[string]*jobTrace)
	t.mu.regs = make(map[runtime.JobView]metric.Registration)
	return t, nil
}

// Shutdown flushes and stops the meter provider New created (WithPrometheus)
// and unregisters every observed broker and job. It does not shut down
// providers given with options.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	var errs []error
	for e, r := range t.mu.regs {
		errs = append(errs, r.Unregister())
		delete(t.mu.regs, e)
	}
	t.mu.Unlock()
	if t.ownMP != nil {
		errs = append(errs, t.ownMP.Shutdown(ctx))
	}
	return errors.Join(errs...)
}

// MetricsHandler implements runtime.HookMetricsHandler: the Prometheus
// handler of WithPrometheus (nil without it).
func (t *Telemetry) MetricsHandler() http.Handler { return t.handler }

// Registry returns the Prometheus registry of WithPrometheus (nil without
// it), to serve or gather it elsewhere.
func (t *Telemetry) Registry() *prometheus.Registry { return t.registry }

// Propagator returns the propagator in use.
func (t *Telemetry) Propagator() propagation.TextMapPropagator { return t.prop }

// sampleRoot decides whether a record or send without a sampled parent is
// traced. It allocates nothing.
func (t *Telemetry) sampleRoot() bool {
	switch r := t.cfg.ratio; {
	case r >= 1:
		return true
	case r <= 0:
		return false
	default:
		return rand.Float64() < r
	}
}

// Interface checks.
var (
	_ client.HookProduce          = (*Telemetry)(nil)
	_ client.HookProduced         = (*Telemetry)(nil)
	_ client.HookPull             = (*Telemetry)(nil)
	_ runtime.HookRecord          = (*Telemetry)(nil)
	_ runtime.HookCheckpointBegin = (*Telemetry)(nil)
	_ runtime.HookCheckpointEnd   = (*Telemetry)(nil)
	_ runtime.HookJobStart        = (*Telemetry)(nil)
	_ runtime.HookJobEnd          = (*Telemetry)(nil)
	_ runtime.HookDeadLetter      = (*Telemetry)(nil)
	_ runtime.HookSinkCommit      = (*Telemetry)(nil)
	_ runtime.HookSourceNotify    = (*Telemetry)(nil)
	_ runtime.HookMetricsHandler  = (*Telemetry)(nil)
)
