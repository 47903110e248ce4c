package acl_test

import (
	"testing"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/namesrv"
	"github.com/runnel-dev/runnel/transport/protocol"
)

// TestRequirementTable pins the requirement of every code runnel's broker
// and name server serve (a code missing from the table would be refused to
// everyone once ACL is on), and of the codes that must stay refused.
func TestRequirementTable(t *testing.T) {
	want := map[int32]string{
		protocol.ReqSendMessage: "PUB topic", protocol.ReqSendMessageV2: "PUB topic", protocol.ReqSendBatchMessage: "PUB topic",
		protocol.ReqSendReplyMessage: "PUB topic", protocol.ReqSendReplyMessageV2: "PUB topic",
		protocol.ReqEndTransaction: "PUB topic (if named)",
		protocol.ReqPullMessage:    "SUB topic+group", protocol.ReqLitePullMessage: "SUB topic+group",
		protocol.ReqQueryConsumerOffset: "SUB topic+group", protocol.ReqUpdateConsumerOffset: "SUB topic+group",
		protocol.ReqGetMaxOffset: "SUB topic", protocol.ReqGetMinOffset: "SUB topic", protocol.ReqGetEarliestMsgStoreTime: "SUB topic",
		protocol.ReqSearchOffsetByTimestamp: "SUB topic", protocol.ReqQueryMessage: "SUB topic",
		protocol.ReqGetConsumerListByGroup: "SUB group", protocol.ReqConsumerSendMsgBack: "SUB group",
		protocol.ReqUnregisterClient: "SUB group (if named)",
		protocol.ReqHeartbeat:        "heartbeat body", protocol.ReqLockBatchMq: "lock body", protocol.ReqUnlockBatchMq: "lock body",
		protocol.ReqViewMessageByID: "admin", protocol.ReqUpdateAndCreateTopic: "admin", protocol.ReqDeleteTopicInBroker: "admin",
		protocol.ReqGetAllTopicConfig: "admin", protocol.ReqGetTopicConfig: "admin", protocol.ReqGetAllSubscriptionGroupConfig: "admin",
		protocol.ReqUpdateAndCreateSubscriptionGroup: "admin", protocol.ReqDeleteSubscriptionGroup: "admin",
		protocol.ReqGetTopicStatsInfo: "admin", protocol.ReqGetConsumeStats: "admin",
		protocol.ReqGetConsumerConnectionList: "admin", protocol.ReqGetProducerConnectionList: "admin",
		25: "admin", // UPDATE_BROKER_CONFIG
		// Name server.
		protocol.ReqRegisterBroker: "admin", protocol.ReqUnregisterBroker: "admin", protocol.ReqQueryDataVersion: "admin",
		protocol.ReqGetRouteInfoByTopic: "PUB|SUB topic", protocol.ReqGetBrokerClusterInfo: "authenticated",
		protocol.ReqGetAllTopicListFromNameServer: "admin", protocol.ReqDeleteTopicInNamesrv: "admin",
		protocol.ReqGetTopicsByCluster: "admin", protocol.ReqWipeWritePermOfBroker: "admin", namesrv.ReqAddWritePermOfBroker: "admin",
		protocol.ReqRegisterTopicInNamesrv: "admin", protocol.ReqPutKVConfig: "admin", protocol.ReqGetKVConfig: "authenticated",
		protocol.ReqDeleteKVConfig: "admin", namesrv.ReqGetKVListByNamespace: "authenticated",
		namesrv.ReqUpdateNamesrvConfig: "admin", namesrv.ReqGetNamesrvConfig: "admin",
		// POP consumption.
		protocol.ReqPopMessage: "SUB topic+group", protocol.ReqAckMessage: "SUB topic+group",
		protocol.ReqChangeMessageInvisibleTime: "SUB topic+group", protocol.ReqNotification: "SUB topic+group",
		protocol.ReqPollingInfo: "SUB topic+group", protocol.ReqBatchAckMessage: "batch ack body",
		protocol.ReqQueryAssignment: "assignment body", protocol.ReqSetMessageRequestMode: "admin",
		// Refused: server-to-client codes, unknown.
		protocol.ReqCheckTransactionState: "denied", protocol.ReqNotifyConsumerIDsChanged: "denied",
		0: "denied", -1: "denied", 9999: "denied",
	}
	for code, w := range want {
		if got := acl.Requirement(code); got != w {
			t.Errorf("Requirement(%d) = %q, want %q", code, got, w)
		}
	}
}
