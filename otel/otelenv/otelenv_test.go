package otelenv_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/otel/otelenv"
)

func TestSpanExporterKinds(t *testing.T) {
	ctx := context.Background()
	if exp, err := otelenv.SpanExporter(ctx, otelenv.ExporterNone, nil); exp != nil || err != nil {
		t.Fatalf("none: %v, %v", exp, err)
	}
	if _, err := otelenv.SpanExporter(ctx, "zipkin", nil); !errors.Is(err, otelenv.ErrUnknownExporter) {
		t.Fatalf("zipkin: %v, want ErrUnknownExporter", err)
	}
	var buf bytes.Buffer
	exp, err := otelenv.SpanExporter(ctx, " Stdout ", &buf)
	if err != nil || exp == nil {
		t.Fatalf("stdout: %v, %v", exp, err)
	}
	if err := exp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTracerProviderConsole: OTEL_TRACES_EXPORTER picks the exporter (the
// first of a list), OTEL_SERVICE_NAME names the resource.
func TestTracerProviderConsole(t *testing.T) {
	t.Setenv("OTEL_TRACES_EXPORTER", "none,otlp")
	t.Setenv("OTEL_SERVICE_NAME", "otelenv-test")
	tp, err := otelenv.TracerProvider(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Shutdown(context.Background())
	_, span := tp.Tracer("t").Start(context.Background(), "s")
	span.End()
	if !span.SpanContext().IsValid() {
		t.Fatal("no valid span from the provider")
	}
	t.Setenv("OTEL_TRACES_EXPORTER", "bogus")
	if _, err := otelenv.TracerProvider(context.Background()); err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("bogus exporter: %v", err)
	}
}
