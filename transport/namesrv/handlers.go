package namesrv

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// Request codes the name server answers that package protocol does not
// define (Java RequestCode).
const (
	// ReqGetKVListByNamespace is GET_KVLIST_BY_NAMESPACE.
	ReqGetKVListByNamespace int32 = 219
	// ReqUpdateNamesrvConfig is UPDATE_NAMESRV_CONFIG, always refused.
	ReqUpdateNamesrvConfig int32 = 318
	// ReqGetNamesrvConfig is GET_NAMESRV_CONFIG.
	ReqGetNamesrvConfig int32 = 319
	// ReqAddWritePermOfBroker is ADD_WRITE_PERM_OF_BROKER.
	ReqAddWritePermOfBroker int32 = 327
)

// versionRegisterBody is MQVersion V3_0_11: brokers of this version or newer
// send a RegisterBrokerBody, older ones a bare TopicConfigSerializeWrapper.
const versionRegisterBody = 37

// handler is the signature of the name server's request handlers: the
// request and the connection it came on (nil when called directly, as the
// tests and fuzz targets do).
type handler func(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command

func (s *Server) registerProcessors() {
	for code, h := range map[int32]handler{
		protocol.ReqRegisterBroker:                s.registerBroker,
		protocol.ReqUnregisterBroker:              s.unregisterBroker,
		protocol.ReqGetRouteInfoByTopic:           s.getRouteInfo,
		protocol.ReqGetBrokerClusterInfo:          s.getClusterInfo,
		protocol.ReqGetAllTopicListFromNameServer: s.getAllTopicList,
		protocol.ReqDeleteTopicInNamesrv:          s.deleteTopic,
		protocol.ReqGetTopicsByCluster:            s.getTopicsByCluster,
		protocol.ReqWipeWritePermOfBroker:         s.wipeWritePerm,
		ReqAddWritePermOfBroker:                   s.addWritePerm,
		protocol.ReqRegisterTopicInNamesrv:        s.registerTopic,
		protocol.ReqQueryDataVersion:              s.queryDataVersion,
		protocol.ReqPutKVConfig:                   s.putKVConfig,
		protocol.ReqGetKVConfig:                   s.getKVConfig,
		protocol.ReqDeleteKVConfig:                s.deleteKVConfig,
		ReqGetKVListByNamespace:                   s.getKVList,
		ReqUpdateNamesrvConfig:                    s.updateConfig,
		ReqGetNamesrvConfig:                       s.getConfig,
	} {
		s.rs.Handle(code, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
			return h(rc.Request(), rc.Conn()), nil
		}))
	}
}

// badRequest answers a request whose header or body could not be used:
// SYSTEM_ERROR with the reason, as a Java name server answers the exception
// such a request raises.
func (s *Server) badRequest(req *protocol.Command, conn *remoting.ServerConn, err error) *protocol.Command {
	s.log.Debug("namesrv: bad request", "code", req.Code, "remote", remoteOf(conn), "err", err)
	return respond(req, protocol.ResSystemError, err.Error())
}

// remoteOf returns the peer address of conn for logs.
func remoteOf(conn *remoting.ServerConn) string {
	if conn == nil {
		return ""
	}
	return conn.RemoteAddr().String()
}

// ConflictRemark starts the remark of the SYSTEM_ERROR answering a
// REGISTER_BROKER that contradicts a live broker's registration: a second
// master of one broker name, or a broker name registered in two clusters.
const ConflictRemark = "[BROKER_CONFLICT]"

func (s *Server) registerBroker(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.RegisterBrokerRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	if crc, ok := h.BodyCRC32.Get(); ok && crc != 0 {
		if got := int32(crc32.ChecksumIEEE(req.Body) & 0x7FFFFFFF); got != crc {
			s.log.Warn("namesrv: register broker body crc32 mismatch", "broker", h.BrokerName, "addr", h.BrokerAddr,
				"want", crc, "got", got)
			return respond(req, protocol.ResSystemError, "crc32 not match")
		}
	}
	r, err := decodeRegistration(req, &h)
	if err != nil {
		return s.badRequest(req, conn, err)
	}
	r.conn = conn
	r.timeout = s.cfg.brokerExpiry
	if ms, ok := h.HeartbeatTimeoutMillis.Get(); ok && ms > 0 {
		r.timeout = time.Duration(ms) * time.Millisecond
	}
	res := s.routes.register(r, s.cfg.now())
	switch {
	case res.conflict != "":
		s.log.Error("namesrv: registration refused: it contradicts a live broker's", "cluster", r.cluster,
			"broker", r.name, "id", r.id, "addr", r.addr, "reason", res.conflict)
		return respond(req, protocol.ResSystemError, ConflictRemark+" "+res.conflict)
	case res.rejected:
		s.log.Warn("namesrv: first registration of a broker carries exactly one topic; rejected",
			"cluster", r.cluster, "broker", r.name, "id", r.id, "addr", r.addr)
		return respond(req, protocol.ResSystemError, "register broker failed")
	case res.ignored:
		s.log.Warn("namesrv: registration ignored: another address holds this broker id with a newer state version",
			"cluster", r.cluster, "broker", r.name, "id", r.id, "addr", r.addr)
	case res.first:
		s.log.Info("namesrv: broker registered", "cluster", r.cluster, "broker", r.name, "id", r.id,
			"addr", r.addr, "topics", len(r.topics))
	default:
		s.log.Debug("namesrv: broker re-registered", "broker", r.name, "addr", r.addr, "topics", len(r.topics))
	}
	resp := respond(req, protocol.ResSuccess, "")
	rh := protocol.RegisterBrokerResponseHeader{HAServerAddr: res.haServerAddr, MasterAddr: res.masterAddr}
	rh.Encode(resp)
	if t := s.kv.list(NamespaceOrderTopicConfig); len(t) > 0 {
		body, err := (&protocol.KVTable{Table: t}).Encode()
		if err != nil {
			return respond(req, protocol.ResSystemError, err.Error())
		}
		resp.Body = body
	}
	return resp
}

// decodeRegistration decodes and checks a REGISTER_BROKER body.
func decodeRegistration(req *protocol.Command, h *protocol.RegisterBrokerRequestHeader) (*registration, error) {
	if h.BrokerID < 0 {
		return nil, fmt.Errorf("namesrv: register broker: negative brokerId %d", h.BrokerID)
	}
	if h.BrokerName == "" || h.BrokerAddr == "" || h.ClusterName == "" {
		return nil, fmt.Errorf("namesrv: register broker: empty brokerName, brokerAddr or clusterName")
	}
	if err := checkAddr(h.BrokerAddr); err != nil {
		return nil, fmt.Errorf("namesrv: register broker: %w", err)
	}
	r := &registration{cluster: h.ClusterName, name: h.BrokerName, addr: h.BrokerAddr, haAddr: h.HAServerAddr,
		zone: h.ZoneName, id: h.BrokerID, actingMaster: h.EnableActingMaster.V}
	if len(req.Body) == 0 {
		return r, nil // an empty registration: liveness only
	}
	var w *protocol.TopicConfigSerializeWrapper
	if req.Version >= versionRegisterBody {
		var body protocol.RegisterBrokerBody
		var err error
		if h.Compressed.V {
			err = body.DecodeCompressed(req.Body, protocol.MaxBodySize)
		} else {
			err = body.Decode(req.Body)
		}
		if err != nil {
			return nil, fmt.Errorf("namesrv: register broker: %w", err)
		}
		w = &body.TopicConfigSerializeWrapper
		r.filterServers = body.FilterServerList
	} else {
		w = new(protocol.TopicConfigSerializeWrapper)
		if err := w.Decode(req.Body); err != nil {
			return nil, fmt.Errorf("namesrv: register broker: %w", err)
		}
	}
	r.dataVersion = w.DataVersion
	r.topics = make([]protocol.TopicConfig, 0, len(w.TopicConfigTable))
	for _, key := range slices.Sorted(maps.Keys(w.TopicConfigTable)) {
		tc := w.TopicConfigTable[key]
		if tc.TopicName == "" {
			tc.TopicName = key
		}
		if err := checkTopic(&tc); err != nil {
			return nil, fmt.Errorf("namesrv: register broker: %w", err)
		}
		r.topics = append(r.topics, tc)
	}
	for _, fs := range r.filterServers {
		if fs == "" || len(fs) > 255 {
			return nil, fmt.Errorf("namesrv: register broker: bad filter server address %q", fs)
		}
	}
	return r, nil
}

// checkAddr checks that a broker address is "host:port" with a numeric
// port and nothing the Go client's string-splitting route parser (protocol
// §5.1) would misread: no whitespace, commas, quotes, braces or backslashes.
func checkAddr(addr string) error {
	if len(addr) > 255 || strings.ContainsAny(addr, " \t\r\n,\"{}\\") {
		return fmt.Errorf("broker address %q is not a plain host:port", addr)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("broker address %q: %w", addr, err)
	}
	if p, err := strconv.ParseUint(port, 10, 16); host == "" || err != nil || p == 0 {
		return fmt.Errorf("broker address %q is not a plain host:port", addr)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	// Not an IP literal: a host name of ASCII letters, digits, dots, dashes
	// and underscores (anything else, e.g. invalid UTF-8, would not survive
	// the JSON route body unchanged).
	for i := 0; i < len(host); i++ {
		c := host[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("broker address %q: host is neither an IP address nor a host name", addr)
		}
	}
	return nil
}

// checkTopic checks a topic config from a registration.
func checkTopic(tc *protocol.TopicConfig) error {
	switch {
	case tc.TopicName == "" || len(tc.TopicName) > MaxTopicNameLen:
		return fmt.Errorf("topic name of %d bytes outside [1, %d]", len(tc.TopicName), MaxTopicNameLen)
	case tc.ReadQueueNums < 0 || tc.ReadQueueNums > MaxQueueNums || tc.WriteQueueNums < 0 || tc.WriteQueueNums > MaxQueueNums:
		return fmt.Errorf("topic %q: queue counts %d/%d outside [0, %d]", tc.TopicName, tc.ReadQueueNums, tc.WriteQueueNums, MaxQueueNums)
	}
	return nil
}

func (s *Server) unregisterBroker(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.UnRegisterBrokerRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	if s.routes.unregister(h.ClusterName, h.BrokerAddr, h.BrokerName) {
		s.log.Info("namesrv: broker unregistered", "cluster", h.ClusterName, "broker", h.BrokerName,
			"id", h.BrokerID, "addr", h.BrokerAddr)
	}
	return respond(req, protocol.ResSuccess, "")
}

func (s *Server) getRouteInfo(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.GetRouteInfoRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	var orderConf string
	if s.cfg.orderMessage {
		orderConf, _ = s.kv.get(NamespaceOrderTopicConfig, h.Topic)
	}
	body, ok := s.routes.appendRoute(make([]byte, 0, 256), h.Topic, orderConf)
	if !ok {
		return respond(req, protocol.ResTopicNotExist, "No topic route info in name server for the topic: "+h.Topic)
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp
}

func (s *Server) getClusterInfo(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	body, err := s.routes.clusterInfo()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp
}

// topicListResponse answers with a TopicList body.
func topicListResponse(req *protocol.Command, topics []string) *protocol.Command {
	body, err := (&protocol.TopicList{TopicList: topics}).Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp
}

func (s *Server) getAllTopicList(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	if !s.cfg.allTopicList {
		return respond(req, protocol.ResSystemError, "disable")
	}
	return topicListResponse(req, s.routes.topicList())
}

func (s *Server) getTopicsByCluster(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.GetTopicsByClusterRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	return topicListResponse(req, s.routes.topicsByCluster(h.Cluster))
}

func (s *Server) deleteTopic(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.DeleteTopicFromNamesrvRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	if s.routes.deleteTopic(h.Topic, h.ClusterName) {
		s.log.Info("namesrv: topic deleted", "topic", h.Topic, "cluster", h.ClusterName)
	}
	return respond(req, protocol.ResSuccess, "")
}

func (s *Server) wipeWritePerm(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	return s.writePerm(req, conn, true)
}

func (s *Server) addWritePerm(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	return s.writePerm(req, conn, false)
}

func (s *Server) writePerm(req *protocol.Command, conn *remoting.ServerConn, wipe bool) *protocol.Command {
	var h protocol.WipeWritePermOfBrokerRequestHeader // ADD_WRITE_PERM_OF_BROKER has the same field
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	n := s.routes.setWritePerm(h.BrokerName, wipe)
	s.log.Info("namesrv: broker write permission changed", "broker", h.BrokerName, "wipe", wipe, "topics", n)
	resp := respond(req, protocol.ResSuccess, "")
	if wipe {
		(&protocol.WipeWritePermOfBrokerResponseHeader{WipeTopicCount: n}).Encode(resp)
	} else {
		resp.SetExtInt("addTopicCount", int64(n))
	}
	return resp
}

func (s *Server) registerTopic(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.RegisterTopicRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	if len(req.Body) == 0 {
		return respond(req, protocol.ResSuccess, "")
	}
	var route protocol.TopicRouteData
	if err := route.Decode(req.Body); err != nil {
		return s.badRequest(req, conn, fmt.Errorf("namesrv: register topic: %w", err))
	}
	if len(route.QueueDatas) == 0 {
		return respond(req, protocol.ResSuccess, "")
	}
	for _, qd := range route.QueueDatas {
		tc := protocol.TopicConfig{TopicName: h.Topic, ReadQueueNums: qd.ReadQueueNums, WriteQueueNums: qd.WriteQueueNums}
		if err := checkTopic(&tc); err != nil {
			return s.badRequest(req, conn, fmt.Errorf("namesrv: register topic: %w", err))
		}
	}
	if unknown, ok := s.routes.registerTopic(h.Topic, route.QueueDatas); !ok {
		return respond(req, protocol.ResSystemError, "namesrv: register topic "+h.Topic+": broker "+unknown+" is not registered")
	}
	return respond(req, protocol.ResSuccess, "")
}

func (s *Server) queryDataVersion(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.QueryDataVersionRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	var dv *protocol.DataVersion
	if len(req.Body) > 0 {
		dv = new(protocol.DataVersion)
		if err := decodeJSON(req.Body, dv); err != nil {
			return s.badRequest(req, conn, fmt.Errorf("namesrv: query data version: %w", err))
		}
	}
	changed, stored := s.routes.queryDataVersion(h.ClusterName, h.BrokerAddr, dv, s.cfg.now())
	resp := respond(req, protocol.ResSuccess, "")
	(&protocol.QueryDataVersionResponseHeader{Changed: changed}).Encode(resp)
	if stored != nil {
		b, err := json.Marshal(stored)
		if err != nil {
			return respond(req, protocol.ResSystemError, err.Error())
		}
		resp.Body = b
	}
	return resp
}

// decodeJSON decodes a small JSON body (fastjson's non-standard forms
// accepted), bounded by protocol.MaxBodySize.
func decodeJSON(b []byte, v any) error {
	if len(b) > protocol.MaxBodySize {
		return fmt.Errorf("%w: %d bytes", protocol.ErrBodyTooLarge, len(b))
	}
	norm, err := protocol.NormalizeJSON(make([]byte, 0, len(b)), b)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(norm, v); err != nil {
		return fmt.Errorf("%w: %w", protocol.ErrBodyInvalid, err)
	}
	return nil
}

func (s *Server) putKVConfig(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.PutKVConfigRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	if err := s.kv.put(h.Namespace, h.Key, h.Value); err != nil {
		s.log.Error("namesrv: put KV config", "namespace", h.Namespace, "key", h.Key, "err", err)
		return respond(req, protocol.ResSystemError, err.Error())
	}
	s.log.Info("namesrv: KV config put", "namespace", h.Namespace, "key", h.Key)
	return respond(req, protocol.ResSuccess, "")
}

func (s *Server) getKVConfig(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.GetKVConfigRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	v, ok := s.kv.get(h.Namespace, h.Key)
	if !ok {
		return respond(req, protocol.ResQueryNotFound, "No config item, Namespace: "+h.Namespace+" Key: "+h.Key)
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.SetExt("value", v) // set even when empty, unlike GetKVConfigResponseHeader.Encode
	return resp
}

func (s *Server) deleteKVConfig(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var h protocol.DeleteKVConfigRequestHeader
	if err := h.Decode(req); err != nil {
		return s.badRequest(req, conn, err)
	}
	if err := s.kv.delete(h.Namespace, h.Key); err != nil {
		s.log.Error("namesrv: delete KV config", "namespace", h.Namespace, "key", h.Key, "err", err)
		return respond(req, protocol.ResSystemError, err.Error())
	}
	return respond(req, protocol.ResSuccess, "")
}

func (s *Server) getKVList(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	ns, ok := req.Ext("namespace")
	if !ok {
		return s.badRequest(req, conn, fmt.Errorf("%w: missing required field %q", protocol.ErrBadHeader, "namespace"))
	}
	t := s.kv.list(ns)
	if len(t) == 0 {
		return respond(req, protocol.ResQueryNotFound, "No config item, Namespace: "+ns)
	}
	body, err := (&protocol.KVTable{Table: t}).Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error())
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp
}

// updateConfig refuses UPDATE_NAMESRV_CONFIG: remote configuration writes
// (e.g. of configStorePath) are how RocketMQ CVE-2023-33246 and CVE-2023-37582 execute code.
func (s *Server) updateConfig(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	s.log.Warn("namesrv: refused UPDATE_NAMESRV_CONFIG", "remote", remoteOf(conn))
	return respond(req, protocol.ResNoPermission,
		"runnel name server: UPDATE_NAMESRV_CONFIG is disabled; remote configuration updates are never accepted")
}

// getConfig answers GET_NAMESRV_CONFIG with the settings that matter to
// peers, as Java properties text.
func (s *Server) getConfig(req *protocol.Command, conn *remoting.ServerConn) *protocol.Command {
	var b strings.Builder
	for _, kv := range [][2]string{
		{"enableAllTopicList", strconv.FormatBool(s.cfg.allTopicList)},
		{"orderMessageEnable", strconv.FormatBool(s.cfg.orderMessage)},
		{"returnOrderTopicConfigToBroker", "true"},
		{"scanNotActiveBrokerInterval", strconv.FormatInt(s.cfg.scanInterval.Milliseconds(), 10)},
	} {
		b.WriteString(kv[0] + "=" + kv[1] + "\n")
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = []byte(b.String())
	return resp
}
