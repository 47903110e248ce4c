package broker

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/transport/protocol"
)

func configReq(body string) *protocol.Command {
	req := protocol.NewRequest(reqUpdateBrokerConfig)
	req.Body = []byte(body)
	return req
}

func getConfig(t *testing.T, b *Broker) (map[string]string, protocol.DataVersion) {
	t.Helper()
	c := dial(t, b.Addr())
	resp := invoke(t, c, protocol.NewRequest(reqGetBrokerConfig))
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("GET_BROKER_CONFIG: %d %s", resp.Code, resp.Remark)
	}
	props, err := parseProperties(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var v protocol.DataVersion
	vs, _ := resp.Ext("version")
	if err := json.Unmarshal([]byte(vs), &v); err != nil {
		t.Fatalf("version %q: %v", vs, err)
	}
	return props, v
}

// TestBrokerConfigAllowList: UPDATE_BROKER_CONFIG changes only the
// allow-listed limits (and they take effect on the next pull); any other
// key, including the ones behind CVE-2023-33246, refuses the whole update
// with NO_PERMISSION; bad values get INVALID_PARAMETER; GET_BROKER_CONFIG
// shows the settings without paths.
func TestBrokerConfigAllowList(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, WithDataDir(dir))
	c := dial(t, b.Addr())
	props, v0 := getConfig(t, b)
	if props[keyPullMaxMsgs] != "32" || props["brokerName"] != DefaultBrokerName || props["flushDiskType"] != "SYNC_FLUSH" ||
		props["diskSpaceWarningLevelRatio"] != "0.9" || props[keyMaxSuspend] != "25000" {
		t.Fatalf("config %v", props)
	}
	for k, val := range props {
		if strings.Contains(val, dir) || strings.Contains(strings.ToLower(k), "path") {
			t.Fatalf("GET_BROKER_CONFIG shows %s=%s", k, val)
		}
	}

	for _, tc := range []struct {
		body   string
		code   int32
		remark string
	}{
		{"brokerConfigPath=/tmp/x", protocol.ResNoPermission, `"brokerConfigPath" cannot be updated remotely`},
		{"rocketmqHome=/tmp\nfilterServerNums=1", protocol.ResNoPermission, "cannot be updated remotely"},
		{keyPullMaxMsgs + "=2\nstorePathRootDir=/tmp", protocol.ResNoPermission, `"storePathRootDir"`},
		{"aclEnable=false", protocol.ResNoPermission, "updatable keys: " + keyMaxSuspend},
		{keyPullMaxMsgs + "=0", protocol.ResInvalidParameter, "must be an integer in [1, 65536]"},
		{keyMaxSuspend + "=30000", protocol.ResInvalidParameter, "[0, 29999]"},
		{keyPullMaxBytes + "=lots", protocol.ResInvalidParameter, `got "lots"`},
		{"no separator", protocol.ResInvalidParameter, "is not key=value"},
		{"# only a comment\n", protocol.ResInvalidParameter, "no properties"},
		{"", protocol.ResInvalidParameter, "no properties"},
		{strings.Repeat("k=v\n", 1) + strings.Repeat("x", 10) + "=1\n" + func() string {
			var sb strings.Builder
			for i := range 70 {
				sb.WriteString("k" + itoa(i) + "=1\n")
			}
			return sb.String()
		}(), protocol.ResInvalidParameter, "more than 64 properties"},
	} {
		resp := invoke(t, c, configReq(tc.body))
		if resp.Code != tc.code || !strings.Contains(resp.Remark, tc.remark) {
			t.Errorf("update %q: %d %q, want %d %q", tc.body, resp.Code, resp.Remark, tc.code, tc.remark)
		}
	}
	if props, v := getConfig(t, b); props[keyPullMaxMsgs] != "32" || v.Counter != v0.Counter {
		t.Fatalf("a refused update changed the config: %s, version %+v", props[keyPullMaxMsgs], v)
	}

	for i := range 5 {
		send(t, c, "Cfg", 0, []byte("m"+itoa(i)), "")
	}
	resp := invoke(t, c, configReq("# tighter pulls\n"+keyPullMaxMsgs+" = 2\n"+keyMaxSuspend+": 1000\n"))
	if resp.Code != protocol.ResSuccess {
		t.Fatalf("update: %d %s", resp.Code, resp.Remark)
	}
	props, v := getConfig(t, b)
	if props[keyPullMaxMsgs] != "2" || props[keyMaxSuspend] != "1000" || v.Counter != v0.Counter+1 {
		t.Fatalf("after update: %v, version %+v", props, v)
	}
	if r := pull(t, c, pullArgs{topic: "Cfg", max: 32}); len(r.msgs) != 2 {
		t.Fatalf("pull after lowering %s: %d messages", keyPullMaxMsgs, len(r.msgs))
	}
}
