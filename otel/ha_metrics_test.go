package otel_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/embedded"
	"github.com/runnel-dev/runnel/internal/testutil"
	rotel "github.com/runnel-dev/runnel/otel"
	"github.com/runnel-dev/runnel/transport/broker"
	"github.com/runnel-dev/runnel/transport/client"
)

// TestMetricsBrokerHA: a SYNC_MASTER's and its slave's replication is
// exported: log ends, the slave's acknowledged offset and lag, the
// master's buffer for it, bytes sent and received, the sync waits.
func TestMetricsBrokerHA(t *testing.T) {
	tel, err := rotel.New(rotel.WithPrometheus())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tel.Shutdown(context.Background()) }()
	cl := embedded.Run(t, embedded.WithSlaves(1, broker.RoleSyncMaster), embedded.WithTopic("ha_metrics", 1))
	m, s := cl.Broker(0), cl.Broker(0).Slaves()[0]
	for _, b := range []struct {
		b    *embedded.Broker
		name string
	}{{m, "broker-a"}, {s, "broker-a-s1"}} {
		unobserve, err := tel.ObserveBroker(b.b.Server(), b.name)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = unobserve() }()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := client.NewProducer(cl.Client(), "ha_metrics_p")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for i := range 10 {
		if res, err := p.Send(ctx, &client.Message{Topic: "ha_metrics", Body: []byte(fmt.Sprint(i))}); err != nil || res.Status != client.SendOK {
			t.Fatalf("send: %v %v", res.Status, err)
		}
	}
	srv := httptest.NewServer(tel.MetricsHandler())
	defer srv.Close()
	end := m.Server().HAStatus().LogEnd
	testutil.CheckFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		samples, err := scrape(ctx, strings.TrimPrefix(srv.URL, "http://"))
		if err != nil {
			return err
		}
		for _, c := range []struct {
			name  string
			label string
			want  func(float64) bool
		}{
			{"runnel_broker_ha_log_end_bytes", `runnel_broker_name="broker-a"`, func(v float64) bool { return v == float64(end) }},
			{"runnel_broker_ha_log_end_bytes", `runnel_broker_name="broker-a-s1"`, func(v float64) bool { return v == float64(end) }},
			{"runnel_broker_ha_slave_ack_offset_bytes", `runnel_broker_slave_id="1"`, func(v float64) bool { return v == float64(end) }},
			{"runnel_broker_ha_slave_lag_bytes", `runnel_broker_slave_id="1"`, func(v float64) bool { return v == 0 }},
			{"runnel_broker_ha_slave_buffer_bytes", `runnel_broker_slave_id="1"`, func(v float64) bool { return v > 0 && v <= float64(broker.DefaultHABatchBytes+64<<10) }},
			{"runnel_broker_ha_sent_bytes_total", `runnel_broker_slave_id="1"`, func(v float64) bool { return v >= float64(end) }},
			{"runnel_broker_ha_received_bytes_total", `runnel_broker_name="broker-a-s1"`, func(v float64) bool { return v >= float64(end) }},
			{"runnel_broker_ha_sync_timeouts_total", `runnel_broker_name="broker-a"`, func(v float64) bool { return v == 0 }},
		} {
			v, ok := sample(samples, c.name, c.label)
			if !ok || !c.want(v) {
				return fmt.Errorf("%s{%s} = %v (found %v); log end %d", c.name, c.label, v, ok, end)
			}
		}
		return nil
	})
}
