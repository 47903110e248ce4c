package protocol

// Bodies of the requests a slave broker sends its master to copy its
// metadata (Java SlaveSynchronize) and of GET_BROKER_HA_STATUS.

// ConsumerOffsetSerializeWrapper is the GET_ALL_CONSUMER_OFFSET (43) body:
// every committed consumer offset, keyed "topic@group", then by queue id
// (Java's consumerOffset.json).
type ConsumerOffsetSerializeWrapper struct {
	OffsetTable map[string]map[int32]int64 `json:"offsetTable"`
	DataVersion *DataVersion               `json:"dataVersion,omitempty"`
}

// Decode parses the body (Java's unquoted integer keys accepted). Errors
// wrap ErrBodyInvalid.
func (w *ConsumerOffsetSerializeWrapper) Decode(b []byte) error {
	*w = ConsumerOffsetSerializeWrapper{}
	return decodeBody("consumer offset wrapper", b, w)
}

// Encode returns the body as compact standard JSON (queue ids quoted, which
// Java's parser accepts).
func (w *ConsumerOffsetSerializeWrapper) Encode() ([]byte, error) {
	c := *w
	if c.OffsetTable == nil {
		c.OffsetTable = map[string]map[int32]int64{}
	}
	return encodeBody("consumer offset wrapper", &c)
}

// DelayOffsetSerializeWrapper is the GET_ALL_DELAY_OFFSET (45) body: per
// delay level (1, 2, …) the next offset of its SCHEDULE_TOPIC_XXXX queue
// to deliver (Java's delayOffset.json).
type DelayOffsetSerializeWrapper struct {
	OffsetTable map[int32]int64 `json:"offsetTable"`
	DataVersion *DataVersion    `json:"dataVersion,omitempty"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (w *DelayOffsetSerializeWrapper) Decode(b []byte) error {
	*w = DelayOffsetSerializeWrapper{}
	return decodeBody("delay offset wrapper", b, w)
}

// Encode returns the body as compact standard JSON.
func (w *DelayOffsetSerializeWrapper) Encode() ([]byte, error) {
	c := *w
	if c.OffsetTable == nil {
		c.OffsetTable = map[int32]int64{}
	}
	return encodeBody("delay offset wrapper", &c)
}

// HARuntimeInfo is the GET_BROKER_HA_STATUS (907) body (Java HARuntimeInfo,
// what `mqadmin haStatus` prints): for a master its log end and one entry
// per connected slave, for a slave its replication client.
type HARuntimeInfo struct {
	Master                   bool                      `json:"master"`
	MasterCommitLogMaxOffset int64                     `json:"masterCommitLogMaxOffset"`
	InSyncSlaveNums          int32                     `json:"inSyncSlaveNums"`
	HAConnectionInfo         []HAConnectionRuntimeInfo `json:"haConnectionInfo"`
	HAClientRuntimeInfo      HAClientRuntimeInfo       `json:"haClientRuntimeInfo"`
}

// HAConnectionRuntimeInfo is one slave connection of a master.
type HAConnectionRuntimeInfo struct {
	Addr                    string `json:"addr"`
	SlaveAckOffset          int64  `json:"slaveAckOffset"`
	Diff                    int64  `json:"diff"`
	InSync                  bool   `json:"inSync"`
	TransferredByteInSecond int64  `json:"transferredByteInSecond"`
	TransferFromWhere       int64  `json:"transferFromWhere"`
}

// HAClientRuntimeInfo is a slave's replication client.
type HAClientRuntimeInfo struct {
	MasterAddr              string `json:"masterAddr"`
	TransferredByteInSecond int64  `json:"transferredByteInSecond"`
	MaxOffset               int64  `json:"maxOffset"`
	LastReadTimestamp       int64  `json:"lastReadTimestamp"`
	LastWriteTimestamp      int64  `json:"lastWriteTimestamp"`
	MasterFlushOffset       int64  `json:"masterFlushOffset"`
}

// Decode parses the body. Errors wrap ErrBodyInvalid.
func (h *HARuntimeInfo) Decode(b []byte) error {
	*h = HARuntimeInfo{}
	return decodeBody("HA runtime info", b, h)
}

// Encode returns the body as compact JSON (haConnectionInfo always a list).
func (h *HARuntimeInfo) Encode() ([]byte, error) {
	c := *h
	c.HAConnectionInfo = nonNil(c.HAConnectionInfo)
	return encodeBody("HA runtime info", &c)
}
