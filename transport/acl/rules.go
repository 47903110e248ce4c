package acl

import (
	"cmp"
	"slices"

	"github.com/runnel-dev/runnel/transport/protocol"
)

// retryPrefix starts a consumer group's retry topic, %RETRY%<group>; a
// retry topic is authorised as its group (SUB), as RocketMQ does.
const retryPrefix = "%RETRY%"

// Request codes the table below names that package protocol does not
// define (Java RequestCode).
const (
	reqUpdateBrokerConfig     int32 = 25
	reqGetBrokerConfig        int32 = 26
	reqGetBrokerRuntimeInfo   int32 = 28
	reqGetKVListByNamespace   int32 = 219
	reqUpdateNamesrvConfig    int32 = 318
	reqGetNamesrvConfig       int32 = 319
	reqAddWritePermOfBroker   int32 = 327
	reqCleanExpiredConsumeQ   int32 = 306
	reqGetAllProducerInfo     int32 = 328
	reqDeleteExpiredCommitLog int32 = 329
)

// kind is what a request code needs besides a valid signature.
type kind uint8

const (
	kindAuthenticated  kind = iota + 1 // any account
	kindAdmin                          // admin accounts only
	kindPubTopic                       // PUB on the header's topic
	kindPubTopicIfSet                  // PUB on the header's topic when it names one
	kindSubTopic                       // SUB on the header's topic
	kindSubTopicGroup                  // SUB on the header's topic and group
	kindSubGroup                       // SUB on the header's group
	kindSubGroupIfSet                  // SUB on the header's group when it names one
	kindRouteTopic                     // PUB or SUB on the header's topic
	kindHeartbeatBody                  // SUB on every consumer group and subscribed topic of the body
	kindLockBody                       // SUB on the body's group and every queue's topic
	kindBatchAckBody                   // SUB on every topic and group of a BATCH_ACK_MESSAGE body
	kindAssignmentBody                 // SUB on the topic and group of a QUERY_ASSIGNMENT body
)

// rule is the requirement of one request code: the kind and the extFields
// the topic and group are read from (the first one present wins).
type rule struct {
	kind      kind
	topicKeys []string
	groupKeys []string
}

var (
	keysTopic   = []string{"topic"}
	keysTopicV2 = []string{"b"} // SendMessageRequestHeaderV2
	keysCGroup  = []string{"consumerGroup"}
	keysGroup   = []string{"group"}
)

// ruleFor returns the requirement of a request code; ok is false for codes
// the table does not list, which are refused when ACL is on. The table is
// the one place that decides who may send what.
func ruleFor(code int32) (r rule, ok bool) {
	switch code {
	// Producer codes: PUB on the topic (SUB on the group for a retry topic).
	case protocol.ReqSendMessage, protocol.ReqSendReplyMessage:
		return rule{kind: kindPubTopic, topicKeys: keysTopic}, true
	case protocol.ReqSendMessageV2, protocol.ReqSendBatchMessage, protocol.ReqSendReplyMessageV2:
		return rule{kind: kindPubTopic, topicKeys: keysTopicV2}, true
	case protocol.ReqEndTransaction:
		// RocketMQ 4 clients name no topic in END_TRANSACTION; 5.x ones do.
		return rule{kind: kindPubTopicIfSet, topicKeys: keysTopic}, true

	// Consumer codes: SUB on the topic and/or the group.
	case protocol.ReqPullMessage, protocol.ReqLitePullMessage,
		protocol.ReqQueryConsumerOffset, protocol.ReqUpdateConsumerOffset:
		return rule{kind: kindSubTopicGroup, topicKeys: keysTopic, groupKeys: keysCGroup}, true
	case protocol.ReqQueryMessage, protocol.ReqSearchOffsetByTimestamp, protocol.ReqGetMaxOffset,
		protocol.ReqGetMinOffset, protocol.ReqGetEarliestMsgStoreTime:
		return rule{kind: kindSubTopic, topicKeys: keysTopic}, true
	case protocol.ReqGetConsumerListByGroup:
		return rule{kind: kindSubGroup, groupKeys: keysCGroup}, true
	case protocol.ReqConsumerSendMsgBack:
		return rule{kind: kindSubGroup, groupKeys: keysGroup}, true
	case protocol.ReqUnregisterClient:
		// Producers unregister with a producerGroup only.
		return rule{kind: kindSubGroupIfSet, groupKeys: keysCGroup}, true
	case protocol.ReqHeartbeat:
		return rule{kind: kindHeartbeatBody}, true
	case protocol.ReqLockBatchMq, protocol.ReqUnlockBatchMq:
		return rule{kind: kindLockBody}, true
	case protocol.ReqCheckClientConfig:
		return rule{kind: kindAuthenticated}, true
	// POP consumption (RocketMQ 5's @RocketMQAction SUB on the headers'
	// topic and consumerGroup; POLLING_INFO, a GET there, is treated as
	// a consumer's read here).
	case protocol.ReqPopMessage, protocol.ReqAckMessage, protocol.ReqChangeMessageInvisibleTime,
		protocol.ReqNotification, protocol.ReqPollingInfo:
		return rule{kind: kindSubTopicGroup, topicKeys: keysTopic, groupKeys: keysCGroup}, true
	case protocol.ReqBatchAckMessage:
		return rule{kind: kindBatchAckBody}, true
	case protocol.ReqQueryAssignment:
		return rule{kind: kindAssignmentBody}, true

	// Name server reads every client makes.
	case protocol.ReqGetRouteInfoByTopic:
		return rule{kind: kindRouteTopic, topicKeys: keysTopic}, true
	case protocol.ReqGetBrokerClusterInfo, protocol.ReqGetKVConfig, reqGetKVListByNamespace:
		return rule{kind: kindAuthenticated}, true

	// Administration, broker registration and configuration: admin only.
	case protocol.ReqRegisterBroker, protocol.ReqUnregisterBroker, protocol.ReqQueryDataVersion,
		protocol.ReqBrokerHeartbeat, protocol.ReqRegisterTopicInNamesrv,
		protocol.ReqPutKVConfig, protocol.ReqDeleteKVConfig,
		protocol.ReqGetAllTopicListFromNameServer, protocol.ReqGetTopicsByCluster,
		protocol.ReqDeleteTopicInNamesrv, protocol.ReqWipeWritePermOfBroker, reqAddWritePermOfBroker,
		reqUpdateNamesrvConfig, reqGetNamesrvConfig,
		protocol.ReqUpdateAndCreateTopic, protocol.ReqUpdateAndCreateTopicList, protocol.ReqDeleteTopicInBroker,
		protocol.ReqGetAllTopicConfig, protocol.ReqGetTopicConfig, protocol.ReqGetTopicStatsInfo,
		protocol.ReqUpdateAndCreateSubscriptionGroup, protocol.ReqDeleteSubscriptionGroup,
		protocol.ReqGetAllSubscriptionGroupConfig, protocol.ReqGetConsumeStats,
		protocol.ReqGetConsumerConnectionList, protocol.ReqGetProducerConnectionList,
		protocol.ReqQueryTopicConsumeByWho, protocol.ReqGetConsumerRunningInfo, protocol.ReqConsumeMessageDirectly,
		protocol.ReqInvokeBrokerToResetOffset, protocol.ReqInvokeBrokerToGetConsumerStatus,
		protocol.ReqQueryBrokerOffset, protocol.ReqGetAllConsumerOffset, protocol.ReqGetAllDelayOffset,
		protocol.ReqGetBrokerHAStatus,
		protocol.ReqViewMessageByID, protocol.ReqResumeCheckHalfMessage, protocol.ReqSetMessageRequestMode,
		reqUpdateBrokerConfig, reqGetBrokerConfig, reqGetBrokerRuntimeInfo,
		reqCleanExpiredConsumeQ, reqGetAllProducerInfo, reqDeleteExpiredCommitLog:
		return rule{kind: kindAdmin}, true
	}
	return rule{}, false
}

// Requirement describes, for documentation and tests, what a request code
// needs when ACL is on: "admin", "authenticated", "PUB topic", "SUB topic",
// "SUB topic+group", "SUB group", "PUB|SUB topic" (routes), "heartbeat
// body", "lock body", "batch ack body", "assignment body", with " (if named)" for optional resources; or
// "denied" for codes the table does not list.
func Requirement(code int32) string {
	r, ok := ruleFor(code)
	if !ok {
		return "denied"
	}
	return [...]string{
		kindAuthenticated:  "authenticated",
		kindAdmin:          "admin",
		kindPubTopic:       "PUB topic",
		kindPubTopicIfSet:  "PUB topic (if named)",
		kindSubTopic:       "SUB topic",
		kindSubTopicGroup:  "SUB topic+group",
		kindSubGroup:       "SUB group",
		kindSubGroupIfSet:  "SUB group (if named)",
		kindRouteTopic:     "PUB|SUB topic",
		kindHeartbeatBody:  "heartbeat body",
		kindLockBody:       "lock body",
		kindBatchAckBody:   "batch ack body",
		kindAssignmentBody: "assignment body",
	}[r.kind]
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.SortFunc(out, cmp.Compare[string])
	return out
}
