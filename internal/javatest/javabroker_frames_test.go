package javatest

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runnel-dev/runnel/internal/javapeer"
	"github.com/runnel-dev/runnel/transport/client"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// captureFrames makes the tests that record frames also write them as
// golden files into transport/protocol/testdata/frames:
//
//	go test -run 'TestJavaBrokerFrames|TestJavaBrokerPullInnerBatch' ./internal/javatest -capture-frames
var captureFrames = flag.Bool("capture-frames", false, "write recorded frames of Apache RocketMQ's Java client and broker as golden files into transport/protocol/testdata/frames")

const framesDir = "../../transport/protocol/testdata/frames"

// writeCaptured writes f as the golden file name when -capture-frames is
// set: comment lines saying how it was captured and what its header says,
// then the frame in hex, 32 bytes a line.
func writeCaptured(t *testing.T, name, how string, f recFrame) {
	t.Helper()
	if !*captureFrames {
		return
	}
	var b strings.Builder
	for _, l := range strings.Split(how, "\n") {
		b.WriteString("# " + l + "\n")
	}
	b.WriteString("# " + describe(f) + "\n")
	if f.Cmd.SerializeType() == protocol.SerializeJSON {
		hl := int(f.Raw[5])<<16 | int(f.Raw[6])<<8 | int(f.Raw[7])
		b.WriteString("# header: " + string(f.Raw[8:8+hl]) + "\n")
	}
	for i := 0; i < len(f.Raw); i += 32 {
		line := f.Raw[i:min(i+32, len(f.Raw))]
		for j := 0; j < len(line); j += 4 {
			if j > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(hex.EncodeToString(line[j:min(j+4, len(line))]))
		}
		b.WriteByte('\n')
	}
	if err := os.WriteFile(filepath.Join(framesDir, name), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", name)
}

// keyDiff describes, for one request code, ext fields one client sends
// and the other does not, and why that is harmless.
type keyDiff struct {
	javaOnly, runnelOnly []string
	why                  string
}

// knownDiffs are the differences between the ext fields of runnel's
// requests and the official Java client's (same version), each judged; a
// difference may be absent for a version (4.9's client has no maxMsgBytes).
// The frames test fails on any other.
var knownDiffs = map[int32]keyDiff{
	protocol.ReqGetRouteInfoByTopic: {runnelOnly: []string{"acceptStandardJsonOnly"},
		why: "runnel asks 5.x name servers for standard JSON (4.9 ignores the field); Java 5.3's client does not set it and parses fastjson's non-standard route JSON"},
	protocol.ReqSendMessageV2: {javaOnly: []string{"m"},
		why: "m (batch) is false for a single message; the broker reads a missing m as false (SendMessageRequestHeader.isBatch)"},
	protocol.ReqPullMessage: {javaOnly: []string{"maxMsgBytes"}, runnelOnly: []string{"subscription"},
		why: "maxMsgBytes (5.x) is not read by the broker's PullMessageProcessor; runnel always sends its subscription (PullSysFlag subscription bit) where Java's push consumer lets the broker use the heartbeat's"},
	protocol.ReqQueryConsumerOffset: {runnelOnly: []string{"setZeroIfNotFound"},
		why: "runnel asks 5.x brokers for QUERY_NOT_FOUND rather than 0 on a missing offset (4.9 ignores the field)"},
}

// TestJavaBrokerFrames records, through a proxy in front of the Java name
// server and broker, the frames of the official Java client and of runnel's
// client doing the same things, and checks that runnel's requests carry
// every ext field Java's do (and no others) but for the judged differences in
// knownDiffs; that the Java broker answers each request in its header
// encoding, JSON or ROCKETMQ binary (so runnel's both encodings are
// understood and answered); and, with -capture-frames, writes Java's frames
// as golden files for transport/protocol.
func TestJavaBrokerFrames(t *testing.T) {
	for _, v := range brokerVersions {
		t.Run(v, func(t *testing.T) {
			d, c := javaCluster(t, v)
			ctx := bg(t, 3*time.Minute)
			admin := newJavaClient(t, c)
			topic, group := "runnel_frames_"+strings.ReplaceAll(v, ".", "_"), "runnel_frames_g"
			createJavaTopic(t, admin, c, topic, 2)

			// The official Java client: JSON (its default), then binary.
			jrc := startRecCluster(t, c.NameServer, c.Broker)
			dr := d.NewDriver(t)
			if _, err := dr.Run(ctx, jrc.NS.Addr, "produce", "--topic", topic, "--count", "1", "--tag", "TagA", "--keys", "key", "--prop", "p=v"); err != nil {
				t.Fatal(err)
			}
			if _, err := dr.Run(ctx, jrc.NS.Addr, "push", "--topic", topic, "--group", group, "--mode", "orderly", "--count", "1"); err != nil {
				t.Fatal(err)
			}
			jbin := startRecCluster(t, c.NameServer, c.Broker)
			t.Setenv("ROCKETMQ_SERIALIZE_TYPE", "ROCKETMQ") // read by the driver JVM's RemotingCommand
			if _, err := dr.Run(ctx, jbin.NS.Addr, "produce", "--topic", topic, "--count", "1", "--tag", "TagA"); err != nil {
				t.Fatal(err)
			}
			os.Unsetenv("ROCKETMQ_SERIALIZE_TYPE")

			// runnel's client, in both encodings, doing the same.
			// On 5.3 the binary run leaves a half message for the broker to
			// check back (after transactionTimeOut, 3 s here), awaited at the
			// end, for the golden CHECK_TRANSACTION_STATE (TestJavaBroker-
			// Transactions covers check-backs on both versions).
			rrc := map[protocol.SerializeType]*recCluster{}
			var checked <-chan struct{}
			for _, st := range []protocol.SerializeType{protocol.SerializeRocketMQ, protocol.SerializeJSON} {
				rc := startRecCluster(t, c.NameServer, c.Broker)
				rrc[st] = rc
				half := st == protocol.SerializeRocketMQ && v == javapeer.Version5
				if ch := runnelFlows(t, ctx, c, rc, topic, group+fmt.Sprint(st), st, half); ch != nil {
					checked = ch
				}
			}
			if checked != nil {
				select {
				case <-checked:
				case <-ctx.Done():
					t.Fatal("no check-back of runnel's half message")
				}
			}

			// 4.9's broker answers a request in the request's header
			// encoding; 5.3's answers in its own (JSON) whatever the request's
			// (NettyRemotingAbstract.writeResponse no longer copies the
			// request's serializeTypeCurrentRPC): runnel decodes either.
			for _, rc := range append([]*recCluster{jrc, jbin}, slices.Collect(maps.Values(rrc))...) {
				for _, p := range []*recProxy{rc.NS, rc.Broker} {
					for _, f := range p.Frames() {
						if !f.ToServer || f.Cmd.IsResponse() || f.Cmd.IsOneway() {
							continue
						}
						resp, ok := p.Response(f)
						if !ok {
							continue // a request still in flight when the flow ended
						}
						want := f.Cmd.SerializeType()
						if v != javapeer.Version4 {
							want = protocol.SerializeJSON
						}
						if resp.Cmd.SerializeType() != want {
							t.Errorf("%s answered by %s", describe(f), describe(resp))
						}
					}
				}
			}
			for _, f := range jbin.Broker.Frames() {
				if f.ToServer && f.Cmd.SerializeType() != protocol.SerializeRocketMQ {
					t.Fatalf("ROCKETMQ_SERIALIZE_TYPE did not reach the Java client: %s", describe(f))
				}
			}
			for st, rc := range rrc {
				for _, f := range append(rc.NS.Frames(), rc.Broker.Frames()...) {
					if f.ToServer && f.Cmd.SerializeType() != st {
						t.Errorf("runnel with header encoding %d sent %s", st, describe(f))
					}
					if !f.ToServer && !f.Cmd.IsResponse() {
						continue // broker → client requests come in the broker's encoding
					}
					if f.Cmd.IsResponse() && f.ToServer == false && f.Cmd.Code != protocol.ResSuccess && f.Cmd.Code != protocol.ResPullNotFound &&
						f.Cmd.Code != protocol.ResQueryNotFound && f.Cmd.Code != protocol.ResPullRetryImmediately {
						t.Errorf("runnel (encoding %d) got %s", st, describe(f))
					}
				}
			}

			// Ext fields: runnel's requests against Java's.
			compared := 0
			for _, code := range []int32{protocol.ReqGetRouteInfoByTopic, protocol.ReqSendMessageV2, protocol.ReqPullMessage,
				protocol.ReqQueryConsumerOffset, protocol.ReqUpdateConsumerOffset, protocol.ReqGetConsumerListByGroup,
				protocol.ReqUnregisterClient, protocol.ReqHeartbeat, protocol.ReqLockBatchMq, protocol.ReqUnlockBatchMq} {
				key := ""
				if code == protocol.ReqUnregisterClient {
					key = "consumerGroup" // the consumer's, not the producer's
				}
				jf, rf := firstRequest(jrc, code, key), firstRequest(rrc[protocol.SerializeRocketMQ], code, key)
				if jf == nil || rf == nil {
					t.Errorf("%s: Java sent %v, runnel %v", protocol.RequestCodeName(code), jf != nil, rf != nil)
					continue
				}
				compared++
				jk, rk := extKeys(jf.Cmd), extKeys(rf.Cmd)
				javaOnly, runnelOnly := setDiff(jk, rk), setDiff(rk, jk)
				want := knownDiffs[code]
				if len(setDiff(javaOnly, want.javaOnly)) > 0 || len(setDiff(runnelOnly, want.runnelOnly)) > 0 {
					t.Errorf("%s: ext fields only Java sends %v, only runnel sends %v (judged: %v, %v)\nJava:   %s\nrunnel: %s",
						protocol.RequestCodeName(code), javaOnly, runnelOnly, want.javaOnly, want.runnelOnly, describe(*jf), describe(*rf))
				}
				if code == protocol.ReqHeartbeat || code == protocol.ReqLockBatchMq || code == protocol.ReqUnlockBatchMq {
					compareBodies(t, code, jf.Cmd.Body, rf.Cmd.Body)
				}
			}
			t.Logf("compared %d request kinds", compared)

			how := "Captured from Apache RocketMQ " + v + " (internal/javatest TestJavaBrokerFrames, go test -capture-frames):\n"
			java := how + "the official Java client (javapeer driver, %s) through a recording proxy; %s."
			save := func(name string, f *recFrame, what string) {
				if f == nil {
					t.Errorf("no frame for %s", name)
					return
				}
				writeCaptured(t, name, what, *f)
			}
			resp := func(p *recProxy, f *recFrame) *recFrame {
				if f == nil {
					return nil
				}
				r, ok := p.Response(*f)
				if !ok {
					return nil
				}
				return &r
			}
			if v == javapeer.Version4 {
				// 4.9 answers a binary request in binary (5.3 in JSON).
				bsend := firstFrame(jbin.Broker, protocol.ReqSendMessageV2, false)
				save("send_response_java_rocketmq.hex", resp(jbin.Broker, bsend),
					how+"the Java broker's response to the Java 4.9.7 client's SEND_MESSAGE_V2 with a ROCKETMQ binary header\n(produce --tag TagA, ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ): 4.9 answers in the request's encoding.")
				return
			}
			route := firstFrame(jrc.NS, protocol.ReqGetRouteInfoByTopic, false)
			save("route_request_json.hex", route, fmt.Sprintf(java, "produce", "its first GET_ROUTEINFO_BY_TOPIC, JSON header"))
			save("route_request_rocketmq.hex", firstFrame(jbin.NS, protocol.ReqGetRouteInfoByTopic, false),
				fmt.Sprintf(java, "produce, ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ", "its first GET_ROUTEINFO_BY_TOPIC, ROCKETMQ binary header"))
			send := firstFrame(jrc.Broker, protocol.ReqSendMessageV2, false)
			save("send_message_v2_java_json.hex", send, fmt.Sprintf(java, "produce --tag TagA --keys key --prop p=v", "SEND_MESSAGE_V2, JSON header"))
			save("send_response_java_json.hex", resp(jrc.Broker, send), how+"the Java broker's response to the Java client's SEND_MESSAGE_V2 (send_message_v2_java_json.hex), JSON header.")
			bsend := firstFrame(jbin.Broker, protocol.ReqSendMessageV2, false)
			save("send_message_v2_java_rocketmq.hex", bsend, fmt.Sprintf(java, "produce --tag TagA, ROCKETMQ_SERIALIZE_TYPE=ROCKETMQ", "SEND_MESSAGE_V2, ROCKETMQ binary header"))
			save("heartbeat_consumer_java_json.hex", firstHeartbeatWithConsumer(jrc.Broker), fmt.Sprintf(java, "push --mode orderly", "HEART_BEAT with the push consumer's ConsumerData (JSON body)"))
			pull := firstFoundPull(jrc.Broker)
			save("pull_request_java_json.hex", pull, fmt.Sprintf(java, "push --mode orderly", "PULL_MESSAGE that found the produced message"))
			save("pull_response_java_json.hex", resp(jrc.Broker, pull), how+"the Java broker's FOUND response to pull_request_java_json.hex: the stored record of the message produce stored (TAGS TagA, KEYS key0, p=v).")
			lock := firstFrame(jrc.Broker, protocol.ReqLockBatchMq, false)
			save("lock_batch_request_java_json.hex", lock, fmt.Sprintf(java, "push --mode orderly", "LOCK_BATCH_MQ (JSON body)"))
			save("lock_batch_response_java_json.hex", resp(jrc.Broker, lock), how+"the Java broker's response to lock_batch_request_java_json.hex (the granted queues).")
			save("notify_consumer_ids_changed_java_json.hex", firstFrame(jrc.Broker, protocol.ReqNotifyConsumerIDsChanged, true),
				how+"the Java broker's NOTIFY_CONSUMER_IDS_CHANGED (oneway) to the Java push consumer (push --mode orderly).")
			save("check_transaction_state_java_json.hex", firstFrame(rrc[protocol.SerializeRocketMQ].Broker, protocol.ReqCheckTransactionState, true),
				how+"the Java broker's CHECK_TRANSACTION_STATE (oneway, JSON header, the half message's record as body) to runnel's client, for a half message left unended.")
		})
	}
}

// runnelFlows does, with runnel's client in header encoding st through
// rc, what the Java driver commands above did; with half, it also leaves a
// half message for the broker to check back, and returns a channel that
// receives once runnel's check listener was asked (it answers rollback).
func runnelFlows(t *testing.T, ctx context.Context, c *javapeer.Cluster, rc *recCluster, topic, group string, st protocol.SerializeType, half bool) <-chan struct{} {
	t.Helper()
	checked := make(chan struct{}, 1)
	cl := newJavaClient(t, c, client.WithNameServers(rc.NS.Addr), client.WithHeaderEncoding(st))
	p := newJavaProducer(t, cl, group+"_pg", client.WithCheckListener(func(context.Context, *protocol.MessageExt) client.TxState {
		select {
		case checked <- struct{}{}:
		default:
		}
		return client.TxRollback
	}))
	if half {
		if _, err := p.SendHalf(ctx, &client.Message{Topic: topic, Body: []byte("half, checked back")}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte("runnel"), Tags: "TagA", Keys: []string{"key"}, Properties: map[string]string{"p": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Send(ctx, &client.Message{Topic: topic, Body: []byte("b1")}, &client.Message{Topic: topic, Body: []byte("b2")}); err != nil {
		t.Fatal(err)
	}
	g := startGroup(t, cl, group, topic, client.WithQueueLocking(true), client.WithListener(client.ListenerFuncs{}))
	waitAssigned(t, "runnel", g, 2)
	if _, err := cl.QueryConsumerOffset(ctx, group, res.Queue); err != nil && !errors.Is(err, client.ErrNoOffset) {
		t.Fatal(err)
	}
	got := pullAll(t, cl, res.Queue, group, 0, 1, 10*time.Second)
	if len(got) == 0 {
		t.Fatal("runnel pulled nothing")
	}
	if err := cl.CommitOffset(ctx, group, res.Queue, 1); err != nil {
		t.Fatal(err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if !half {
		return nil
	}
	return checked
}

// firstFrame returns the first request with code in p (fromServer: sent by
// the server), or nil.
func firstFrame(p *recProxy, code int32, fromServer bool) *recFrame {
	if fs := p.Requests(code, fromServer); len(fs) > 0 {
		return &fs[0]
	}
	return nil
}

// firstRequest returns the first request with code a client sent through
// rc (with key among its ext fields, when key is set), or nil.
func firstRequest(rc *recCluster, code int32, key string) *recFrame {
	for _, p := range []*recProxy{rc.NS, rc.Broker} {
		for _, f := range p.Requests(code, false) {
			if _, ok := f.Cmd.Ext(key); key == "" || ok {
				return &f
			}
		}
	}
	return nil
}

func firstHeartbeatWithConsumer(p *recProxy) *recFrame {
	for _, f := range p.Requests(protocol.ReqHeartbeat, false) {
		var hb protocol.HeartbeatData
		if hb.Decode(f.Cmd.Body) == nil && len(hb.ConsumerDataSet) > 0 {
			return &f
		}
	}
	return nil
}

func firstFoundPull(p *recProxy) *recFrame {
	for _, f := range p.Requests(protocol.ReqPullMessage, false) {
		if r, ok := p.Response(f); ok && r.Cmd.Code == protocol.ResSuccess {
			return &f
		}
	}
	return nil
}

// setDiff returns the elements of a not in b (both sorted).
func setDiff(a, b []string) []string {
	var out []string
	for _, s := range a {
		if !slices.Contains(b, s) {
			out = append(out, s)
		}
	}
	return out
}

// bodyKnownDiffs are JSON body members (path/name) one client sends and
// the other does not, judged harmless.
var bodyKnownDiffs = map[string]string{
	"HEART_BEAT/heartbeatFingerprint": "5.x heartbeat v2 field, sent by Java 5.3's client too; 4.9's broker ignores unknown members",
	"HEART_BEAT/withoutSub":           "5.x field, sent by Java 5.3's client too; 4.9's broker ignores unknown members",
	"LOCK_BATCH_MQ/onlyThisBroker":    "sent as false by Java 5.3's client too; 4.9's LockBatchRequestBody lacks it and fastjson ignores it",
	"UNLOCK_BATCH_MQ/onlyThisBroker":  "as for LOCK_BATCH_MQ",
}

// compareBodies compares the JSON member names of two request bodies,
// recursively (the first element of arrays).
func compareBodies(t *testing.T, code int32, jb, rb []byte) {
	t.Helper()
	var jv, rv any
	if err := json.Unmarshal(jb, &jv); err != nil {
		t.Logf("%s: Java body is not standard JSON (%v): %.200s", protocol.RequestCodeName(code), err, jb)
		return
	}
	if err := json.Unmarshal(rb, &rv); err != nil {
		t.Errorf("%s: runnel body is not JSON: %v", protocol.RequestCodeName(code), err)
		return
	}
	var walk func(path string, j, r any)
	walk = func(path string, j, r any) {
		switch jj := j.(type) {
		case map[string]any:
			rr, ok := r.(map[string]any)
			if !ok {
				t.Errorf("%s body %s: Java has an object, runnel %T", protocol.RequestCodeName(code), path, r)
				return
			}
			for k, jvv := range jj {
				p := path + "/" + k
				rvv, ok := rr[k]
				if !ok {
					if why, judged := bodyKnownDiffs[protocol.RequestCodeName(code)+p]; !judged {
						t.Errorf("%s body: Java sends %s = %v, runnel does not", protocol.RequestCodeName(code), p, jvv)
					} else {
						t.Logf("%s body: only Java sends %s (%s)", protocol.RequestCodeName(code), p, why)
					}
					continue
				}
				walk(p, jvv, rvv)
			}
			for k, rvv := range rr {
				if _, ok := jj[k]; !ok {
					p := path + "/" + k
					if why, judged := bodyKnownDiffs[protocol.RequestCodeName(code)+p]; !judged {
						t.Errorf("%s body: runnel sends %s = %v, Java does not", protocol.RequestCodeName(code), p, rvv)
					} else {
						t.Logf("%s body: only runnel sends %s (%s)", protocol.RequestCodeName(code), p, why)
					}
				}
			}
		case []any:
			rr, ok := r.([]any)
			if !ok {
				if r != nil {
					t.Errorf("%s body %s: Java has an array, runnel %T", protocol.RequestCodeName(code), path, r)
				}
				return
			}
			if len(jj) > 0 && len(rr) > 0 {
				walk(path+"[0]", jj[0], rr[0])
			}
		}
	}
	walk("", jv, rv)
}
