package protocol

// ToV1 returns the long-named SendMessageRequestHeader with the same
// content, as the Java broker converts SEND_MESSAGE_V2 and
// SEND_BATCH_MESSAGE headers before handling them.
func (h *SendMessageRequestHeaderV2) ToV1() SendMessageRequestHeader {
	return SendMessageRequestHeader{
		ProducerGroup:         h.ProducerGroup,
		Topic:                 h.Topic,
		DefaultTopic:          h.DefaultTopic,
		DefaultTopicQueueNums: h.DefaultTopicQueueNums,
		QueueID:               h.QueueID,
		SysFlag:               h.SysFlag,
		BornTimestamp:         h.BornTimestamp,
		Flag:                  h.Flag,
		Properties:            h.Properties,
		ReconsumeTimes:        h.ReconsumeTimes,
		UnitMode:              h.UnitMode,
		Batch:                 h.Batch,
		MaxReconsumeTimes:     h.MaxReconsumeTimes,
		BrokerName:            h.BrokerName,
	}
}

// ToV2 returns the compact SendMessageRequestHeaderV2 (keys a to n) with the
// same content, as the Java client sends for SEND_MESSAGE_V2 and
// SEND_BATCH_MESSAGE.
func (h *SendMessageRequestHeader) ToV2() SendMessageRequestHeaderV2 {
	return SendMessageRequestHeaderV2{
		ProducerGroup:         h.ProducerGroup,
		Topic:                 h.Topic,
		DefaultTopic:          h.DefaultTopic,
		DefaultTopicQueueNums: h.DefaultTopicQueueNums,
		QueueID:               h.QueueID,
		SysFlag:               h.SysFlag,
		BornTimestamp:         h.BornTimestamp,
		Flag:                  h.Flag,
		Properties:            h.Properties,
		ReconsumeTimes:        h.ReconsumeTimes,
		UnitMode:              h.UnitMode,
		Batch:                 h.Batch,
		MaxReconsumeTimes:     h.MaxReconsumeTimes,
		BrokerName:            h.BrokerName,
	}
}
