// Package otelenv builds OpenTelemetry SDK tracer providers from the
// standard OTEL_* environment variables, with the OTLP/HTTP and console
// span exporters. It is apart from package otel so that a job using runnel's
// instrumentation with a provider of its own does not link (or list in its
// go.mod) the OTLP exporter and its gRPC and protobuf dependencies.
//
//	tp, err := otelenv.TracerProvider(ctx) // OTEL_TRACES_EXPORTER=otlp|console|none
//	tel, err := otel.New(otel.WithTracerProvider(tp))
package otelenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// ErrUnknownExporter is returned for an exporter kind that is not one of
// the constants below.
var ErrUnknownExporter = errors.New("otelenv: unknown span exporter")

// Span exporter kinds (the values of OTEL_TRACES_EXPORTER).
const (
	ExporterOTLP    = "otlp"    // OTLP over HTTP/protobuf, configured by OTEL_EXPORTER_OTLP_*
	ExporterConsole = "console" // JSON lines on stdout ("stdout" is accepted too)
	ExporterNone    = "none"
)

// SpanExporter returns the span exporter of kind: ExporterOTLP
// (otlptracehttp, which reads OTEL_EXPORTER_OTLP_ENDPOINT, _HEADERS,
// _TIMEOUT, … itself), ExporterConsole (to w, os.Stdout when nil) or
// ExporterNone (nil, nil).
func SpanExporter(ctx context.Context, kind string, w io.Writer) (sdktrace.SpanExporter, error) {
	switch strings.ToLower(strings.TrimSpace(kind)) {
	case ExporterOTLP, "otlphttp":
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otelenv: otlp exporter: %w", err)
		}
		return exp, nil
	case ExporterConsole, "stdout":
		if w == nil {
			w = os.Stdout
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(w))
		if err != nil {
			return nil, fmt.Errorf("otelenv: stdout exporter: %w", err)
		}
		return exp, nil
	case ExporterNone:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: %q (want otlp, console or none)", ErrUnknownExporter, kind)
}

// TracerProvider returns an SDK tracer provider configured by the
// standard environment variables: OTEL_TRACES_EXPORTER picks the exporter
// (otlp by default, console, none; see SpanExporter), and the SDK itself
// reads OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG (sampler),
// OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES (resource), OTEL_BSP_*
// (batching) and OTEL_SPAN_*_LIMIT (limits). opts are applied after those
// (e.g. sdktrace.WithSampler to override). The caller owns the provider:
// Shutdown flushes it. Nothing global is set.
func TracerProvider(ctx context.Context, opts ...sdktrace.TracerProviderOption) (*sdktrace.TracerProvider, error) {
	kind := os.Getenv("OTEL_TRACES_EXPORTER")
	if kind == "" {
		kind = ExporterOTLP
	}
	if i := strings.IndexByte(kind, ','); i >= 0 {
		kind = kind[:i] // one exporter: the first listed
	}
	exp, err := SpanExporter(ctx, kind, nil)
	if err != nil {
		return nil, err
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("otelenv: resource: %w", err)
	}
	all := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if exp != nil {
		all = append(all, sdktrace.WithBatcher(exp))
	}
	return sdktrace.NewTracerProvider(append(all, opts...)...), nil
}
