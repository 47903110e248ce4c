package javapeer

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestJavaPeerBoots starts each pinned version's name server and broker,
// lists the cluster with mqadmin, and sends and consumes through the
// driver: the harness itself works end to end.
func TestJavaPeerBoots(t *testing.T) {
	for _, v := range []string{Version5, Version4} {
		t.Run(v, func(t *testing.T) {
			d := RequireVersion(t, v)
			c := d.RunCluster(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			// 4.9's broker answers GET_BROKER_RUNTIME_INFO with a
			// NoSuchElementException until its store statistics have their
			// first sample (StoreStatsService samples once a second), so the
			// first clusterList right after boot may fail there.
			var out string
			var err error
			for range 10 {
				if out, err = d.Admin(ctx, t.TempDir(), c.NameServer, "clusterList"); err == nil {
					break
				}
				time.Sleep(time.Second)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, c.BrokerName) || !strings.Contains(out, c.Broker) {
				t.Fatalf("clusterList does not list %s at %s:\n%s", c.BrokerName, c.Broker, out)
			}
			if _, err := d.Admin(ctx, t.TempDir(), c.NameServer, "updateTopic", "-c", c.ClusterName, "-t", "peer_boot", "-r", "2", "-w", "2"); err != nil {
				t.Fatal(err)
			}
			dr := d.NewDriver(t)
			sent, err := dr.Run(ctx, c.NameServer, "produce", "--topic", "peer_boot", "--count", "5", "--tag", "a")
			if err != nil {
				t.Fatal(err)
			}
			ids := map[string]bool{}
			for _, ev := range sent {
				if ev.Kind() == "sent" {
					if ev.Str("status") != "SEND_OK" || ev.Str("broker") != c.BrokerName {
						t.Fatalf("send event %v", ev)
					}
					ids[ev.Str("id")] = true
				}
			}
			if len(ids) != 5 {
				t.Fatalf("%d distinct sent ids, want 5: %v", len(ids), sent)
			}
			got, err := dr.Run(ctx, c.NameServer, "push", "--topic", "peer_boot", "--group", "peer_boot_g", "--count", "5", "--timeout-ms", "60000")
			if err != nil {
				t.Fatal(err)
			}
			for _, ev := range got {
				if ev.Kind() == "timeout" {
					t.Fatalf("push consumer timed out: %v", got)
				}
				if ev.Kind() == "recv" {
					if !ids[ev.Str("id")] || ev.Str("tags") != "a" {
						t.Fatalf("received %v, not one of the sent messages", ev)
					}
					delete(ids, ev.Str("id"))
				}
			}
			if len(ids) != 0 {
				t.Fatalf("not received: %v", ids)
			}
		})
	}
}
