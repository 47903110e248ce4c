package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/runnel-dev/runnel/transport/broker/internal/store"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Admin requests that mqadmin sends daily and that need the client
// registry or a rate history: GET_BROKER_RUNTIME_INFO (clusterList,
// brokerStatus), QUERY_TOPIC_CONSUME_BY_WHO (queryMsgById's consumption
// track) and INVOKE_BROKER_TO_RESET_OFFSET (resetOffsetByTime). They plug
// into the core through the extensions seam like the other client-facing
// subsystems.

// reqGetBrokerRuntimeInfo is GET_BROKER_RUNTIME_INFO (RequestCode 28).
const reqGetBrokerRuntimeInfo int32 = 28

// brokerVersionDesc is Java's MQVersion name of protocol.CurrentVersion.
const brokerVersionDesc = "V5_3_3"

// rateSamples is how many one-second samples of the put and get counters
// the rate history keeps: Java's StoreStatsService reports rates over the
// last 10 s, 1 min and 10 min.
const rateSamples = 601

// adminOps serves the admin requests of this file. Safe for concurrent use.
type adminOps struct {
	b       *Broker
	clients *clientRegistry

	mu struct {
		sync.Mutex
		samples [rateSamples]rateSample // ring, oldest at (next-n) mod len
		n, next int
	}
}

// rateSample is the put and get counters at one instant.
type rateSample struct {
	at       time.Time
	put, get int64
}

func newAdminOps(b *Broker, clients *clientRegistry) *adminOps {
	return &adminOps{b: b, clients: clients}
}

func (a *adminOps) register(s *remoting.Server) {
	s.Handle(reqGetBrokerRuntimeInfo, remoting.ProcessorFunc(a.processRuntimeInfo))
	s.Handle(protocol.ReqQueryTopicConsumeByWho, remoting.ProcessorFunc(a.processTopicConsumeByWho))
	s.Handle(protocol.ReqInvokeBrokerToResetOffset, remoting.ProcessorFunc(a.processResetOffset))
}

// runSampler records the counters once a second (real time) until ctx ends.
func (a *adminOps) runSampler(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	a.record(a.sample())
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			a.record(a.sample())
		}
	}
}

func (a *adminOps) sample() rateSample {
	return rateSample{at: time.Now(), put: a.b.stats.puts.Load(), get: a.b.stats.pulledMsgs.Load()}
}

func (a *adminOps) record(s rateSample) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.mu.samples[a.mu.next] = s
	a.mu.next = (a.mu.next + 1) % rateSamples
	a.mu.n = min(a.mu.n+1, rateSamples)
}

// rates returns Java's "putTps" and "getTransferredTps" strings: messages
// per second over the last 10 s, 1 min and 10 min (over the samples there
// are, when the broker has not run that long).
func (a *adminOps) rates(now rateSample) (put, get string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var pb, gb []byte
	for i, w := range []time.Duration{10 * time.Second, time.Minute, 10 * time.Minute} {
		var p, g float64
		// The oldest sample within the window (or the oldest there is).
		for k := a.mu.n; k >= 1; k-- {
			s := a.mu.samples[(a.mu.next-k+rateSamples)%rateSamples]
			if d := now.at.Sub(s.at); d <= w+500*time.Millisecond || k == 1 {
				if secs := d.Seconds(); secs > 0 {
					p, g = float64(now.put-s.put)/secs, float64(now.get-s.get)/secs
				}
				break
			}
		}
		if i > 0 {
			pb, gb = append(pb, ' '), append(gb, ' ')
		}
		pb, gb = strconv.AppendFloat(pb, p, 'f', 2, 64), strconv.AppendFloat(gb, g, 'f', 2, 64)
	}
	return string(pb), string(gb)
}

// processRuntimeInfo serves GET_BROKER_RUNTIME_INFO (28): a KVTable of the
// broker's state under the keys Java's AdminBrokerProcessor uses and
// mqadmin's clusterList and brokerStatus read. Keys Java fills from parts
// runnel does not have (thread pool queues, page cache locks) report those
// parts idle; the message totals count since the broker started (Java's
// "today" and "yesterday" totals are snapshots taken at midnight). The get
// rate is also under its 4.x name, getTransferedTps, without which 4.x
// mqadmin's clusterList fails (as it does against a 5.x Java broker).
func (a *adminOps) processRuntimeInfo(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	b := a.b
	now := a.sample()
	put, get := a.rates(now)
	earliest := int64(-1)
	topics, _ := b.topics.snapshot()
	for name, tc := range topics {
		for q := range queueCount(tc) {
			ts, err := b.store.EarliestStoreTime(name, q)
			if err != nil {
				if errors.Is(err, store.ErrNotFound) {
					continue
				}
				return offsetStoreError(req, err), nil
			}
			if earliest < 0 || ts < earliest {
				earliest = ts
			}
		}
	}
	t := map[string]string{
		"brokerVersionDesc":               brokerVersionDesc,
		"brokerVersion":                   strconv.Itoa(int(protocol.CurrentVersion)),
		"brokerActive":                    "true",
		"putTps":                          put,
		"getTransferredTps":               get,
		"getTransferedTps":                get, // the 4.x name, which 4.x mqadmin clusterList needs
		"msgPutTotalTodayNow":             strconv.FormatInt(now.put, 10),
		"msgGetTotalTodayNow":             strconv.FormatInt(now.get, 10),
		"msgPutTotalTodayMorning":         "0",
		"msgGetTotalTodayMorning":         "0",
		"msgPutTotalYesterdayMorning":     "0",
		"msgGetTotalYesterdayMorning":     "0",
		"earliestMessageTimeStamp":        strconv.FormatInt(earliest, 10),
		"startAcceptSendRequestTimeStamp": "0",
		"bootTimestamp":                   strconv.FormatInt(b.startedAt.UnixMilli(), 10),
		"runtime":                         runtimeString(b.cfg.clock().Sub(b.startedAt)),
		// The store indexes every message in the batch that stores it:
		// nothing is ever behind.
		"dispatchBehindBytes":    "0",
		"pageCacheLockTimeMills": "0",
		// Requests are served by goroutines, not queued behind pools.
		"sendThreadPoolQueueSize":                  "0",
		"sendThreadPoolQueueHeadWaitTimeMills":     "0",
		"pullThreadPoolQueueSize":                  "0",
		"pullThreadPoolQueueHeadWaitTimeMills":     "0",
		"queryThreadPoolQueueSize":                 "0",
		"queryThreadPoolQueueHeadWaitTimeMills":    "0",
		"litePullThreadPoolQueueSize":              "0",
		"litePullThreadPoolQueueHeadWaitTimeMills": "0",
		"ackThreadPoolQueueSize":                   "0",
		"ackThreadPoolQueueHeadWaitTimeMills":      "0",
		"EndTransactionQueueSize":                  "0",
	}
	if avail, total, err := store.DiskUsage(b.cfg.dataDir); err == nil && total > 0 {
		t["commitLogDiskRatio"] = strconv.FormatFloat(float64(total-avail)/float64(total), 'f', -1, 64)
		t["commitLogDirCapacity"] = fmt.Sprintf("Total : %s, Free : %s.", humanBytes(total), humanBytes(avail))
	}
	body, err := (&protocol.KVTable{Table: t}).Encode()
	if err != nil {
		return nil, err
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

// runtimeString formats an uptime as Java's broker does ("[ 0 days, 1
// hours, 2 minutes, 3 seconds ]").
func runtimeString(d time.Duration) string {
	s := int64(d / time.Second)
	return fmt.Sprintf("[ %d days, %d hours, %d minutes, %d seconds ]", s/86400, s%86400/3600, s%3600/60, s%60)
}

// humanBytes formats n as Java's MixAll.humanReadableByteCount(n, false).
func humanBytes(n uint64) string {
	if n < 1024 {
		return strconv.FormatUint(n, 10) + " B"
	}
	exp, v := 0, float64(n)
	for v >= 1024 && exp < 6 {
		v /= 1024
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[exp-1])
}

// processTopicConsumeByWho serves QUERY_TOPIC_CONSUME_BY_WHO (300): the
// groups consuming the topic, those online with a subscription to it and
// those with a committed offset of it (a GroupList body).
func (a *adminOps) processTopicConsumeByWho(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	var h protocol.QueryTopicConsumeByWhoRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	groups := a.clients.groupsSubscribedTo(h.Topic)
	err := a.b.store.ScanOffsets(h.Topic, func(group string, _ int32, _ int64) bool {
		groups = append(groups, group)
		return true
	})
	if err != nil {
		return offsetStoreError(req, err), nil
	}
	slices.Sort(groups)
	groups = slices.Compact(groups)
	if groups == nil {
		groups = []string{}
	}
	body, err := json.Marshal(struct {
		GroupList []string `json:"groupList"`
	}{groups})
	if err != nil {
		return nil, err
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

// groupsSubscribedTo returns the consumer groups with a live channel whose
// subscriptions include topic.
func (r *clientRegistry) groupsSubscribedTo(topic string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for name, g := range r.mu.consumers {
		if _, ok := g.subs[topic]; ok && len(g.channels) > 0 {
			out = append(out, name)
		}
	}
	return out
}

// consumerConns returns the live channels of a consumer group.
func (r *clientRegistry) consumerConns(group string) []*remoting.ServerConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.mu.consumers[group]
	if g == nil {
		return nil
	}
	return channelConns(g.channels)
}

// resetNotifyTimeout bounds queueing one RESET_CONSUMER_CLIENT_OFFSET.
const resetNotifyTimeout = 5 * time.Second

// processResetOffset serves INVOKE_BROKER_TO_RESET_OFFSET (222) as a 5.x
// broker does by default (useServerSideResetOffset): the group's offsets of
// the topic are set by the broker itself, for one queue (queueId ≥ 0, to
// offset if given, else by timestamp) or for every read queue (by
// timestamp; a negative timestamp means each queue's end), and the offsets
// are returned in a ResetOffsetBody. Where Java 5.x then makes online
// consumers take the new offsets through their next pull (OFFSET_MOVED),
// runnel sends them RESET_CONSUMER_CLIENT_OFFSET, as 4.x brokers do, which
// every RocketMQ client handles.
func (a *adminOps) processResetOffset(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	b := a.b
	var h protocol.ResetOffsetRequestHeader
	if err := h.Decode(req); err != nil {
		return respond(req, protocol.ResInvalidParameter, err.Error()), nil
	}
	tc, ok := b.topics.get(h.Topic)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "Topic "+h.Topic+" does not exist"), nil
	}
	if _, ok := b.groupConfig(h.Group, false); !ok {
		return respond(req, protocol.ResSubscriptionGroupNotExist, "Group "+h.Group+" does not exist"), nil
	}
	search := func(q int32) (int64, error) {
		if h.Timestamp < 0 {
			return b.store.MaxOffset(h.Topic, q)
		}
		return b.store.SearchOffset(h.Topic, q, h.Timestamp, false)
	}
	offsets := map[int32]int64{}
	if q := h.QueueID.Or(-1); q >= 0 {
		if q >= queueCount(tc) {
			return respond(req, protocol.ResSystemError, "No queues to reset."), nil
		}
		off := h.Offset.Or(-1)
		if off != -1 {
			minOff, err1 := b.store.MinOffset(h.Topic, q)
			maxOff, err2 := b.store.MaxOffset(h.Topic, q)
			if err := errors.Join(err1, err2); err != nil {
				return offsetStoreError(req, err), nil
			}
			if off < minOff || off > maxOff+1 {
				return respond(req, protocol.ResSystemError,
					fmt.Sprintf("Target offset %d not in consume queue range [%d-%d]", off, minOff, maxOff)), nil
			}
		} else {
			var err error
			if off, err = search(q); err != nil {
				return offsetStoreError(req, err), nil
			}
		}
		offsets[q] = off
	} else {
		for q := range tc.ReadQueueNums {
			off, err := search(q)
			if err != nil {
				return offsetStoreError(req, err), nil
			}
			offsets[q] = off
		}
	}
	if len(offsets) == 0 {
		return respond(req, protocol.ResSystemError, "No queues to reset."), nil
	}
	rb := protocol.ResetOffsetBody{OffsetTable: make(map[protocol.MessageQueue]int64, len(offsets))}
	for q, off := range offsets {
		if err := b.store.CommitOffset(h.Group, h.Topic, q, off); err != nil {
			return offsetStoreError(req, err), nil
		}
		rb.OffsetTable[protocol.MessageQueue{Topic: h.Topic, BrokerName: b.cfg.brokerName, QueueID: q}] = off
	}
	body, err := rb.Encode()
	if err != nil {
		return nil, err
	}
	b.log.Info("broker: consumer offsets reset", "group", h.Group, "topic", h.Topic, "queues", len(offsets), "timestamp", h.Timestamp)
	if conns := a.clients.consumerConns(h.Group); len(conns) > 0 {
		nh := protocol.ResetOffsetRequestHeader{Group: h.Group, Topic: h.Topic, Timestamp: h.Timestamp, IsForce: h.IsForce}
		for _, c := range conns {
			notify := protocol.NewRequest(protocol.ReqResetConsumerClientOffset)
			nh.Encode(notify)
			notify.Body = body
			nctx, cancel := context.WithTimeout(ctx, resetNotifyTimeout)
			err := c.InvokeOneway(nctx, notify)
			cancel()
			if err != nil {
				b.log.Warn("broker: reset offset notification failed", "group", h.Group, "remote", c.RemoteAddr().String(), "err", err)
			}
		}
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}
