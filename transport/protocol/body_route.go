package protocol

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
)

// MasterID is the broker id of a master in BrokerData.BrokerAddrs.
const MasterID int64 = 0

// QueueData is one broker's queues of a topic in a TopicRouteData.
type QueueData struct {
	BrokerName     string
	ReadQueueNums  int32
	WriteQueueNums int32
	Perm           int32
	TopicSysFlag   int32 // older versions spell the JSON key "topicSynFlag"
}

// BrokerData is one broker group (master and slaves) of a cluster.
type BrokerData struct {
	Cluster    string
	BrokerName string
	// BrokerAddrs maps broker id (MasterID = 0, slaves >= 1) to "ip:port".
	BrokerAddrs        map[int64]string
	ZoneName           string // optional
	EnableActingMaster bool
}

// MasterAddr returns the master's address ("" when there is no master).
func (b BrokerData) MasterAddr() string { return b.BrokerAddrs[MasterID] }

// TopicRouteData is the GET_ROUTEINFO_BY_TOPIC response body (§5.1).
// Values are plain data, not safe for concurrent mutation.
type TopicRouteData struct {
	OrderTopicConf    string // "broker-a:4;broker-b:4", optional
	QueueDatas        []QueueData
	BrokerDatas       []BrokerData
	FilterServerTable map[string][]string
	// TopicQueueMappingByBroker is kept as raw JSON (static topics are not
	// interpreted here); nil is omitted.
	TopicQueueMappingByBroker json.RawMessage
}

// wire forms used for decoding.
type queueDataWire struct {
	BrokerName     string `json:"brokerName"`
	ReadQueueNums  int32  `json:"readQueueNums"`
	WriteQueueNums int32  `json:"writeQueueNums"`
	Perm           int32  `json:"perm"`
	TopicSysFlag   *int32 `json:"topicSysFlag"`
	TopicSynFlag   *int32 `json:"topicSynFlag"`
}

type brokerDataWire struct {
	Cluster            string           `json:"cluster"`
	BrokerName         string           `json:"brokerName"`
	BrokerAddrs        map[int64]string `json:"brokerAddrs"`
	ZoneName           string           `json:"zoneName"`
	EnableActingMaster bool             `json:"enableActingMaster"`
}

func (w *brokerDataWire) data() BrokerData {
	return BrokerData{Cluster: w.Cluster, BrokerName: w.BrokerName, BrokerAddrs: w.BrokerAddrs,
		ZoneName: w.ZoneName, EnableActingMaster: w.EnableActingMaster}
}

type topicRouteWire struct {
	OrderTopicConf            string              `json:"orderTopicConf"`
	QueueDatas                []queueDataWire     `json:"queueDatas"`
	BrokerDatas               []brokerDataWire    `json:"brokerDatas"`
	FilterServerTable         map[string][]string `json:"filterServerTable"`
	TopicQueueMappingByBroker json.RawMessage     `json:"topicQueueMappingByBroker"`
}

// Decode parses a route body in the standard form or fastjson's legacy form
// (unquoted integer brokerAddrs keys), with or without whitespace. Bodies
// over MaxBodySize are rejected. Errors wrap ErrBodyInvalid.
func (r *TopicRouteData) Decode(b []byte) error {
	var w topicRouteWire
	if err := decodeBody("route data", b, &w); err != nil {
		return err
	}
	*r = TopicRouteData{
		OrderTopicConf:    w.OrderTopicConf,
		FilterServerTable: w.FilterServerTable,
		QueueDatas:        make([]QueueData, len(w.QueueDatas)),
		BrokerDatas:       make([]BrokerData, len(w.BrokerDatas)),
	}
	if len(w.TopicQueueMappingByBroker) > 0 && string(w.TopicQueueMappingByBroker) != "null" {
		r.TopicQueueMappingByBroker = w.TopicQueueMappingByBroker
	}
	for i, q := range w.QueueDatas {
		d := QueueData{BrokerName: q.BrokerName, ReadQueueNums: q.ReadQueueNums, WriteQueueNums: q.WriteQueueNums, Perm: q.Perm}
		switch {
		case q.TopicSysFlag != nil:
			d.TopicSysFlag = *q.TopicSysFlag
		case q.TopicSynFlag != nil:
			d.TopicSysFlag = *q.TopicSynFlag
		}
		r.QueueDatas[i] = d
	}
	for i := range w.BrokerDatas {
		r.BrokerDatas[i] = w.BrokerDatas[i].data()
	}
	return nil
}

// Encode returns the route in the compact standard form of §5.1 (what a name
// server sends with acceptStandardJsonOnly): keys quoted, no whitespace,
// fields in alphabetical order, brokerAddrs always present and sorted by
// broker id, queueDatas and brokerDatas always arrays, filterServerTable
// always an object, orderTopicConf and zoneName only when set, non-ASCII
// escaped as \uXXXX. Both the Go and the Java client parse it.
func (r *TopicRouteData) Encode() ([]byte, error) {
	return r.AppendTo(make([]byte, 0, 256)), nil
}

// AppendTo appends the Encode form of r to dst.
func (r *TopicRouteData) AppendTo(dst []byte) []byte {
	dst = append(dst, `{"brokerDatas":[`...)
	for i := range r.BrokerDatas {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendBrokerData(dst, &r.BrokerDatas[i])
	}
	dst = append(dst, `],"filterServerTable":`...)
	dst = appendStringListMap(dst, r.FilterServerTable)
	if r.OrderTopicConf != "" {
		dst = append(dst, `,"orderTopicConf":`...)
		dst = appendBodyString(dst, r.OrderTopicConf)
	}
	dst = append(dst, `,"queueDatas":[`...)
	for i, q := range r.QueueDatas {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"brokerName":`...)
		dst = appendBodyString(dst, q.BrokerName)
		dst = append(dst, `,"perm":`...)
		dst = strconv.AppendInt(dst, int64(q.Perm), 10)
		dst = append(dst, `,"readQueueNums":`...)
		dst = strconv.AppendInt(dst, int64(q.ReadQueueNums), 10)
		dst = append(dst, `,"topicSysFlag":`...)
		dst = strconv.AppendInt(dst, int64(q.TopicSysFlag), 10)
		dst = append(dst, `,"writeQueueNums":`...)
		dst = strconv.AppendInt(dst, int64(q.WriteQueueNums), 10)
		dst = append(dst, '}')
	}
	dst = append(dst, ']')
	if len(r.TopicQueueMappingByBroker) > 0 && json.Valid(r.TopicQueueMappingByBroker) {
		dst = append(dst, `,"topicQueueMappingByBroker":`...)
		dst = append(dst, r.TopicQueueMappingByBroker...)
	}
	return append(dst, '}')
}

func appendBrokerData(dst []byte, b *BrokerData) []byte {
	dst = append(dst, `{"brokerAddrs":{`...)
	for i, id := range slices.Sorted(maps.Keys(b.BrokerAddrs)) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = strconv.AppendInt(dst, id, 10)
		dst = append(dst, '"', ':')
		dst = appendBodyString(dst, b.BrokerAddrs[id])
	}
	dst = append(dst, `},"brokerName":`...)
	dst = appendBodyString(dst, b.BrokerName)
	dst = append(dst, `,"cluster":`...)
	dst = appendBodyString(dst, b.Cluster)
	dst = append(dst, `,"enableActingMaster":`...)
	dst = strconv.AppendBool(dst, b.EnableActingMaster)
	if b.ZoneName != "" {
		dst = append(dst, `,"zoneName":`...)
		dst = appendBodyString(dst, b.ZoneName)
	}
	return append(dst, '}')
}

func appendStringListMap(dst []byte, m map[string][]string) []byte {
	dst = append(dst, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendBodyString(dst, k)
		dst = append(dst, ':', '[')
		for j, s := range m[k] {
			if j > 0 {
				dst = append(dst, ',')
			}
			dst = appendBodyString(dst, s)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

// ClusterInfo is the GET_BROKER_CLUSTER_INFO response body (§5.6).
type ClusterInfo struct {
	// BrokerAddrTable maps broker name to its BrokerData.
	BrokerAddrTable map[string]BrokerData
	// ClusterAddrTable maps cluster name to its broker names.
	ClusterAddrTable map[string][]string
}

// Decode parses a cluster info body (standard or fastjson form).
func (c *ClusterInfo) Decode(b []byte) error {
	var w struct {
		BrokerAddrTable  map[string]brokerDataWire `json:"brokerAddrTable"`
		ClusterAddrTable map[string][]string       `json:"clusterAddrTable"`
	}
	if err := decodeBody("cluster info", b, &w); err != nil {
		return err
	}
	*c = ClusterInfo{ClusterAddrTable: w.ClusterAddrTable}
	if w.BrokerAddrTable != nil {
		c.BrokerAddrTable = make(map[string]BrokerData, len(w.BrokerAddrTable))
		for k, v := range w.BrokerAddrTable {
			c.BrokerAddrTable[k] = v.data()
		}
	}
	return nil
}

// Encode returns the compact standard form with sorted keys.
func (c *ClusterInfo) Encode() ([]byte, error) {
	dst := []byte(`{"brokerAddrTable":{`)
	for i, k := range slices.Sorted(maps.Keys(c.BrokerAddrTable)) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendBodyString(dst, k)
		dst = append(dst, ':')
		bd := c.BrokerAddrTable[k]
		dst = appendBrokerData(dst, &bd)
	}
	dst = append(dst, `},"clusterAddrTable":`...)
	dst = appendStringListMap(dst, c.ClusterAddrTable)
	return append(dst, '}'), nil
}

// String implements fmt.Stringer for debugging.
func (q QueueData) String() string {
	return fmt.Sprintf("%s(r%d/w%d perm %d)", q.BrokerName, q.ReadQueueNums, q.WriteQueueNums, q.Perm)
}
