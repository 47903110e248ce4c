package namesrv

import (
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestRegisterSecondMasterRefused: while a broker name's master is live, a
// master of that name at another address is refused (SYSTEM_ERROR,
// ConflictRemark) and changes nothing; once the first is gone (its
// connection closed), the second registers.
func TestRegisterSecondMasterRefused(t *testing.T) {
	s := startServer(t)
	c1 := dial(t, s.Addr())
	a := brokerA()
	a.register(t, c1)
	other := *a
	other.addr, other.ha = "127.0.0.9:10911", "127.0.0.9:10912"
	c2 := dial(t, s.Addr())
	resp := invoke(t, c2, other.registerRequest(t))
	expectCode(t, resp, protocol.ResSystemError)
	if !strings.HasPrefix(resp.Remark, ConflictRemark) || !strings.Contains(resp.Remark, a.addr) || !strings.Contains(resp.Remark, other.addr) {
		t.Fatalf("remark %q: want %s naming both masters", resp.Remark, ConflictRemark)
	}
	r := route(t, c2, "TopicTest")
	expectCode(t, r, protocol.ResSuccess)
	if want := `"brokerAddrs":{"0":"` + a.addr + `"}`; !strings.Contains(string(r.Body), want) {
		t.Fatalf("route %s after the refused master, want %s", r.Body, want)
	}
	// A slave of the same name is welcome.
	slave := *a
	slave.id, slave.addr = 1, "127.0.0.2:10911"
	slave.register(t, c2)
	// The first master's connection closes: it is evicted, the second
	// master takes its place.
	_ = c1.Close()
	waitFor(t, 5*time.Second, func() error {
		resp := invoke(t, c2, other.registerRequest(t))
		if resp.Code != protocol.ResSuccess {
			return &protocol.Error{Code: resp.Code, Remark: resp.Remark}
		}
		return nil
	})
	r = route(t, c2, "TopicTest")
	if want := `"brokerAddrs":{"0":"` + other.addr + `","1":"127.0.0.2:10911"}`; !strings.Contains(string(r.Body), want) {
		t.Fatalf("route %s, want %s", r.Body, want)
	}
}

// TestRegisterBrokerNameInTwoClustersRefused: a broker name live in one
// cluster cannot be registered in another (a slave configured with the
// wrong cluster, say).
func TestRegisterBrokerNameInTwoClustersRefused(t *testing.T) {
	s := startServer(t)
	c := dial(t, s.Addr())
	a := brokerA()
	a.register(t, c)
	wrong := *a
	wrong.cluster, wrong.id, wrong.addr = "OtherCluster", 1, "127.0.0.2:10911"
	resp := invoke(t, c, wrong.registerRequest(t))
	expectCode(t, resp, protocol.ResSystemError)
	if !strings.HasPrefix(resp.Remark, ConflictRemark) || !strings.Contains(resp.Remark, "OtherCluster") {
		t.Fatalf("remark %q", resp.Remark)
	}
	ci := invoke(t, c, protocol.NewRequest(protocol.ReqGetBrokerClusterInfo))
	if strings.Contains(string(ci.Body), "OtherCluster") || strings.Contains(string(ci.Body), wrong.addr) {
		t.Fatalf("cluster info %s lists the refused registration", ci.Body)
	}
}
