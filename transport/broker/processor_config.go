package broker

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// reqGetBrokerConfig is GET_BROKER_CONFIG (RequestCode 26).
const reqGetBrokerConfig int32 = 26

// Keys UPDATE_BROKER_CONFIG may change: the pull-response and long-polling
// limits, which runnel applies to the next request. Nothing that names a
// path, a command, an address or a security setting can be changed over
// the wire (CVE-2023-33246 turned such an update into remote code
// execution); those are start-up options only.
const (
	keyPullMaxMsgs  = "maxTransferCountOnMessageInMemory"
	keyPullMaxBytes = "maxTransferBytesOnMessageInMemory"
	keyMaxSuspend   = "longPollingMaxSuspendMillis"
)

// updatableKeys is the allow-list of UPDATE_BROKER_CONFIG, sorted; never
// modified.
var updatableKeys = []string{keyMaxSuspend, keyPullMaxBytes, keyPullMaxMsgs}

// maxConfigLines bounds the properties of one UPDATE_BROKER_CONFIG body.
const maxConfigLines = 64

// liveConfig holds the settings that may change while the broker runs.
// Readers load them per request; UPDATE_BROKER_CONFIG stores them under mu
// (so that an update with several keys is applied whole).
type liveConfig struct {
	pullMaxMsgs  atomic.Int64
	pullMaxBytes atomic.Int64
	maxSuspend   atomic.Int64 // nanoseconds

	mu struct {
		sync.Mutex
		version protocol.DataVersion
	}
}

func (l *liveConfig) init(c *config) {
	l.pullMaxMsgs.Store(int64(c.pullMaxMsgs))
	l.pullMaxBytes.Store(int64(c.pullMaxBytes))
	l.maxSuspend.Store(int64(c.maxSuspend))
	l.mu.version = protocol.DataVersion{Timestamp: c.clock().UnixMilli()}
}

// parseProperties reads a java.util.Properties-style body: "key=value"
// (or "key:value") lines; blank lines and lines starting with # or ! are
// skipped. Escapes and continuation lines are not supported (no allowed
// value needs them).
func parseProperties(body []byte) (map[string]string, error) {
	out := make(map[string]string)
	for line := range strings.SplitSeq(string(body), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == '!' {
			continue
		}
		if len(out) == maxConfigLines {
			return nil, &protocol.Error{Code: protocol.ResInvalidParameter,
				Remark: "more than " + strconv.Itoa(maxConfigLines) + " properties"}
		}
		i := strings.IndexAny(line, "=:")
		if i <= 0 {
			return nil, &protocol.Error{Code: protocol.ResInvalidParameter,
				Remark: "property line " + strconv.Quote(truncate(line, 64)) + " is not key=value"}
		}
		out[strings.TrimSpace(line[:i])] = strings.TrimSpace(line[i+1:])
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// processUpdateBrokerConfig serves UPDATE_BROKER_CONFIG (25). The body is
// a properties text. Every key must be on the allow-list (updatableKeys),
// else the whole update is refused with NO_PERMISSION naming the key; every
// value must be in range (INVALID_PARAMETER); then all are applied at once
// and the config version is bumped. With ACL on only admin accounts get
// here (the ACL interceptor gates the code).
func (b *Broker) processUpdateBrokerConfig(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	if len(req.Body) > maxAdminBody {
		return respond(req, protocol.ResInvalidParameter, "config body larger than "+strconv.Itoa(maxAdminBody)+" bytes"), nil
	}
	props, err := parseProperties(req.Body)
	if err != nil {
		return errorResponse(req, err), nil
	}
	if len(props) == 0 {
		return respond(req, protocol.ResInvalidParameter, "no properties to update"), nil
	}
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if !slices.Contains(updatableKeys, k) {
			b.log.Warn("broker: refused a remote config update", "key", truncate(k, 128), "remote", rc.RemoteAddr())
			return respond(req, protocol.ResNoPermission, "the broker config key "+strconv.Quote(truncate(k, 128))+
				" cannot be updated remotely; updatable keys: "+strings.Join(updatableKeys, ", ")), nil
		}
	}
	type change struct {
		dst *atomic.Int64
		v   int64
	}
	changes := make([]change, 0, len(keys))
	for _, k := range keys {
		v, err := strconv.ParseInt(props[k], 10, 64)
		var lo, hi int64
		var dst *atomic.Int64
		scale := int64(1)
		switch k {
		case keyPullMaxMsgs:
			lo, hi, dst = 1, 1<<16, &b.live.pullMaxMsgs
		case keyPullMaxBytes:
			lo, hi, dst = 1, 128<<20, &b.live.pullMaxBytes
		case keyMaxSuspend:
			lo, hi, dst, scale = 0, 29999, &b.live.maxSuspend, int64(time.Millisecond)
		}
		if err != nil || v < lo || v > hi {
			return respond(req, protocol.ResInvalidParameter, k+" must be an integer in ["+
				strconv.FormatInt(lo, 10)+", "+strconv.FormatInt(hi, 10)+"], got "+strconv.Quote(truncate(props[k], 64))), nil
		}
		changes = append(changes, change{dst, v * scale})
	}
	b.live.mu.Lock()
	for _, c := range changes {
		c.dst.Store(c.v)
	}
	b.live.mu.version.Counter++
	b.live.mu.version.Timestamp = b.now().UnixMilli()
	b.live.mu.Unlock()
	b.log.Info("broker: config updated remotely", "keys", keys, "remote", rc.RemoteAddr())
	return respond(req, protocol.ResSuccess, ""), nil
}

// processGetBrokerConfig serves GET_BROKER_CONFIG (26): the broker's
// harmless settings as a properties text (no paths, addresses of other
// hosts or security settings), with the config version as JSON in the
// "version" header field, as Java's admin tools read it.
func (b *Broker) processGetBrokerConfig(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	b.live.mu.Lock()
	version := b.live.mu.version
	b.live.mu.Unlock()
	flush := "SYNC_FLUSH"
	if b.cfg.flushMode == FlushAsync {
		flush = "ASYNC_FLUSH"
	}
	kv := [][2]string{
		{"brokerClusterName", b.cfg.clusterName},
		{"brokerName", b.cfg.brokerName},
		{"brokerId", strconv.FormatInt(b.cfg.ha.brokerID, 10)},
		{"brokerRole", b.cfg.ha.role.String()},
		{"slaveReadEnable", strconv.FormatBool(b.cfg.ha.slaveRead)},
		{"flushDiskType", flush},
		{"autoCreateTopicEnable", strconv.FormatBool(b.cfg.autoCreateTopics)},
		{"autoCreateSubscriptionGroup", strconv.FormatBool(b.cfg.autoCreateGroups)},
		{"defaultTopicQueueNums", strconv.Itoa(b.cfg.topicQueueNums)},
		{"maxMessageSize", strconv.Itoa(b.cfg.maxMessageSize)},
		{"maxBatchMessages", strconv.Itoa(b.cfg.maxBatchMsgs)},
		{"maxBatchBytes", strconv.Itoa(b.cfg.maxBatchBytes)},
		{"diskSpaceWarningLevelRatio", strconv.FormatFloat(b.cfg.diskHighWater, 'f', -1, 64)},
		{"aclEnable", strconv.FormatBool(b.cfg.policy != nil)},
		{"enablePropertyFilter", strconv.FormatBool(b.cfg.filter.propertyFilter)},
		{keyPullMaxMsgs, strconv.FormatInt(b.live.pullMaxMsgs.Load(), 10)},
		{keyPullMaxBytes, strconv.FormatInt(b.live.pullMaxBytes.Load(), 10)},
		{keyMaxSuspend, strconv.FormatInt(time.Duration(b.live.maxSuspend.Load()).Milliseconds(), 10)},
	}
	var sb strings.Builder
	for _, p := range kv {
		sb.WriteString(p[0])
		sb.WriteByte('=')
		sb.WriteString(p[1])
		sb.WriteByte('\n')
	}
	resp := respond(req, protocol.ResSuccess, "")
	vj, err := json.Marshal(version) // admin path, not per message
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp.SetExt("version", string(vj))
	resp.Body = []byte(sb.String())
	return resp, nil
}
