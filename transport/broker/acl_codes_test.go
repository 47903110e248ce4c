package broker

import (
	"fmt"
	"strings"
	"testing"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// aclProbeMax bounds the request codes probed: RocketMQ's codes are below
// 1000 (Java RequestCode).
const aclProbeMax = 1000

// servedCodes returns the request codes a real broker (without ACL)
// serves: those it does not answer REQUEST_CODE_NOT_SUPPORTED, probed one
// by one over a connection. Found by asking the broker, not from a list, so
// that a processor added later is in the matrix without anyone
// remembering to add it.
func servedCodes(t *testing.T) []int32 {
	t.Helper()
	b := startBroker(t)
	c := aclDial(t, b.Addr(), nil)
	var served []int32
	for code := int32(0); code < aclProbeMax; code++ {
		if code == protocol.ReqUpdateAndCreateTopic || code == protocol.ReqDeleteTopicInBroker {
			// Served (TestBrokerAdmin); probed empty they would only fail validation.
			served = append(served, code)
			continue
		}
		resp := invoke(t, c, protocol.NewRequest(code))
		if resp.Code != protocol.ResRequestCodeNotSupported {
			served = append(served, code)
		}
	}
	// The POP family's codes are above the probed range.
	for _, code := range []int32{protocol.ReqPopMessage, protocol.ReqAckMessage, protocol.ReqChangeMessageInvisibleTime,
		protocol.ReqNotification, protocol.ReqPollingInfo, protocol.ReqBatchAckMessage} {
		if resp := invoke(t, c, protocol.NewRequest(code)); resp.Code != protocol.ResRequestCodeNotSupported {
			served = append(served, code)
		}
	}
	return served
}

// aclCodeRequest builds a request of code naming topic T and group G in
// every header field the ACL rules read them from (and a body naming them
// where the rule reads the body), so that the code's requirement decides.
func aclCodeRequest(code int32) *protocol.Command {
	req := protocol.NewRequest(code)
	req.SetExt("topic", aclTopic)
	req.SetExt("b", aclTopic) // SEND_MESSAGE_V2 and batch headers
	req.SetExt("consumerGroup", aclGroup)
	req.SetExt("group", aclGroup)
	req.SetExt("producerGroup", "PG")
	req.SetExt("a", "PG")
	req.SetExt("queueId", "0")
	switch code {
	case protocol.ReqHeartbeat:
		req.Body = []byte(aclConsumerHeartbeat)
	case protocol.ReqLockBatchMq, protocol.ReqUnlockBatchMq:
		req.Body = []byte(`{"consumerGroup":"G","clientId":"c1","mqSet":[{"topic":"T","brokerName":"b","queueId":0}]}`)
	case protocol.ReqBatchAckMessage:
		req.Body = []byte(`{"acks":[{"c":"G","t":"T","r":"0","so":0,"q":0,"rq":0,"pt":1,"it":1000,"b":"AQ=="}]}`)
	case protocol.ReqQueryAssignment:
		req.Body = []byte(`{"topic":"T","consumerGroup":"G","clientId":"c1","strategyName":"AVG","messageModel":"CLUSTERING"}`)
	default:
		req.Body = []byte("x")
	}
	return req
}

// aclCodeClasses is, per request code, the class of aclClasses allowed
// it in a request naming topic T and group G: written from issue 11 and
// RocketMQ's ACL (send codes PUB, consumer codes SUB on the topic and the
// group, administration and configuration admin-only), not derived from
// package acl's table, so that a wrong entry there fails this test. Every
// code the broker serves must be here (TestBrokerACLEveryCode probes
// them); codes it does not serve are refused to everyone.
var aclCodeClasses = map[int32]string{
	10: "pub", 310: "pub", 320: "pub", 324: "pub", 325: "pub", // SEND_MESSAGE, _V2, SEND_BATCH_MESSAGE, SEND_REPLY_MESSAGE, _V2
	37: "pub",             // END_TRANSACTION naming its topic
	11: "sub", 361: "sub", // PULL_MESSAGE, LITE_PULL_MESSAGE
	12: "sub", 29: "sub", 30: "sub", 31: "sub", 32: "sub", // QUERY_MESSAGE, SEARCH_OFFSET_BY_TIMESTAMP, GET_MAX/MIN_OFFSET, GET_EARLIEST_MSG_STORETIME
	14: "sub", 15: "sub", // QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET
	34: "sub", 35: "sub", // HEART_BEAT of a consumer of T in G, UNREGISTER_CLIENT naming G
	36: "sub", 38: "sub", // CONSUMER_SEND_MSG_BACK, GET_CONSUMER_LIST_BY_GROUP
	41: "sub", 42: "sub", // LOCK_BATCH_MQ, UNLOCK_BATCH_MQ
	46: "auth",                                                         // CHECK_CLIENT_CONFIG (names no topic in a header)
	17: "admin", 215: "admin", 21: "admin", 351: "admin", 202: "admin", // topic create/delete/configs/stats
	200: "admin", 201: "admin", 207: "admin", 208: "admin", // subscription groups, consume stats
	203: "admin", 204: "admin", // consumer and producer connection lists
	25: "admin", 26: "admin", // UPDATE_BROKER_CONFIG, GET_BROKER_CONFIG
	33: "admin",                             // VIEW_MESSAGE_BY_ID (any topic's message by offset)
	28: "admin", 300: "admin", 222: "admin", // GET_BROKER_RUNTIME_INFO, QUERY_TOPIC_CONSUME_BY_WHO, INVOKE_BROKER_TO_RESET_OFFSET
	43: "admin", 45: "admin", 907: "admin", // GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET (a slave's copy), GET_BROKER_HA_STATUS
	400: "sub", 401: "admin", // QUERY_ASSIGNMENT (topic and group in the body), SET_MESSAGE_REQUEST_MODE
	200050: "sub", 200051: "sub", 200053: "sub", 200054: "sub", 200055: "sub", 200151: "sub", // POP family
}

// aclClassOf returns the class of code (unknown codes: never).
func aclClassOf(code int32) string {
	if c, ok := aclCodeClasses[code]; ok {
		return c
	}
	return "never"
}

// TestBrokerACLEveryCode is the matrix of issue 11 on a real broker:
// every request code the broker serves (probed: servedCodes), plus codes
// it does not serve, × every identity (no credentials, bad signature, body
// altered after signing, non-admin, PUB-only, SUB-only, DENY, admin) ×
// {TLS off, TLS enforcing}. Each cell must be refused with NO_PERMISSION
// and an "acl: " remark exactly when aclCodeClasses does not allow the
// identity; an allowed request must reach the broker's processor (any
// answer but an ACL denial). A served code missing from aclCodeClasses
// fails the test.
func TestBrokerACLEveryCode(t *testing.T) {
	served := servedCodes(t)
	if len(served) < 30 {
		t.Fatalf("only %d codes served: %v", len(served), served)
	}
	for _, code := range served {
		if _, ok := aclCodeClasses[code]; !ok {
			t.Errorf("the broker serves code %d (ACL requirement %q), missing from aclCodeClasses", code, acl.Requirement(code))
		}
	}
	codes := append(served, 9999, -1, protocol.ReqCheckTransactionState)
	t.Logf("%d codes served: %v", len(served), served)

	for _, useTLS := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", useTLS), func(t *testing.T) {
			_, c, p := startACLMatrixBroker(t, useTLS)
			cells, denials := 0, 0
			for _, code := range codes {
				class := aclClassOf(code)
				allowed := map[string]bool{}
				for _, id := range aclClasses[class] {
					allowed[id] = true
				}
				for _, id := range aclIdentities {
					req := aclCodeRequest(code)
					id.sign(req)
					resp := invoke(t, c, req)
					cells++
					denied := resp.Code == protocol.ResNoPermission && strings.HasPrefix(resp.Remark, "acl: ")
					if denied {
						denials++
					}
					if denied == allowed[id.name] {
						t.Errorf("code %d (%s) as %s: code %d %q, want allowed=%v",
							code, acl.Requirement(code), id.name, resp.Code, resp.Remark, allowed[id.name])
					}
				}
			}
			t.Logf("%d cells, %d denied; policy stats %+v", cells, denials, p.Stats())
		})
	}
}
