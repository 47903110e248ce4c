package broker

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"strings"
	"time"

	"github.com/runnel-dev/runnel/transport/acl"
	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// A slave copies its master's metadata every sync interval (Java
// SlaveSynchronize.syncAll): the topic configs (GET_ALL_TOPIC_CONFIG), the
// consumer offsets (GET_ALL_CONSUMER_OFFSET), the delay offsets
// (GET_ALL_DELAY_OFFSET) and the subscription groups
// (GET_ALL_SUBSCRIPTIONGROUP_CONFIG), over the master's broker port, signed
// with the broker's name server credentials and over TLS as it dials name
// servers. Topics and groups the master no longer has lose their config
// here (their messages go with the master's deletion record in the log);
// offsets are overwritten with the master's and kept where it has none, as
// Java's putAll does.

// runSync copies the master's metadata until ctx ends: soon after a
// connection to the master and every sync interval.
func (s *haSlave) runSync(ctx context.Context) {
	var conn *remoting.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	t := time.NewTimer(s.b.cfg.ha.syncInterval)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.syncNow:
		}
		if addr := s.masterAddr(); addr != "" {
			var err error
			conn, err = s.syncAll(ctx, conn, addr)
			switch {
			case err != nil && ctx.Err() == nil:
				if err.Error() != lastErr {
					s.log.Warn("broker: copying the master's metadata failed; retrying", "master", addr, "err", err)
				}
				lastErr = err.Error()
				if conn != nil {
					_ = conn.Close()
					conn = nil
				}
			case err == nil:
				lastErr = ""
			}
		}
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(s.b.cfg.ha.syncInterval)
	}
}

// syncAll copies the master's metadata once over conn (dialled when nil or
// closed) and returns the connection to reuse.
func (s *haSlave) syncAll(ctx context.Context, conn *remoting.Conn, addr string) (*remoting.Conn, error) {
	b := s.b
	if conn != nil {
		select {
		case <-conn.Done():
			_ = conn.Close()
			conn = nil
		default:
		}
	}
	if conn != nil && conn.RemoteAddr().String() != addr {
		_ = conn.Close()
		conn = nil
	}
	if conn == nil {
		dctx, cancel := context.WithTimeout(ctx, nsDialTimeout)
		opts := []remoting.Option{remoting.WithLogger(b.log)}
		if cfg := b.cfg.nsTLS; cfg != nil {
			opts = append(opts, remoting.WithTLSConfig(cfg))
		}
		var err error
		conn, err = remoting.Dial(dctx, addr, opts...)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	call := func(code int32) ([]byte, error) {
		req := protocol.NewRequest(code)
		if cr := b.cfg.nsCreds; cr != nil {
			acl.Sign(req, *cr)
		}
		ictx, cancel := context.WithTimeout(ctx, nsInvokeTimeout)
		defer cancel()
		resp, err := conn.Invoke(ictx, req)
		if err == nil {
			err = protocol.ResponseError(resp)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", protocol.RequestCodeName(code), err)
		}
		return resp.Body, nil
	}
	var errs []error
	if body, err := call(protocol.ReqGetAllTopicConfig); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, s.applyTopics(body))
	}
	if body, err := call(protocol.ReqGetAllConsumerOffset); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, s.applyOffsets(body))
	}
	if body, err := call(protocol.ReqGetAllDelayOffset); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, s.applyDelayOffsets(body))
	}
	if body, err := call(protocol.ReqGetAllSubscriptionGroupConfig); err != nil {
		errs = append(errs, err)
	} else {
		errs = append(errs, s.applyGroups(body))
	}
	return conn, errors.Join(errs...)
}

func (s *haSlave) applyTopics(body []byte) error {
	b := s.b
	var w protocol.TopicConfigSerializeWrapper
	if err := w.Decode(body); err != nil {
		return err
	}
	var errs []error
	cur, _ := b.topics.snapshot()
	for name, tc := range w.TopicConfigTable {
		if tc.TopicName != name || validateTopic(name) != nil {
			continue
		}
		if tc.Attributes == nil {
			tc.Attributes = map[string]string{}
		}
		if old, ok := cur[name]; ok && reflect.DeepEqual(old, tc) {
			continue
		}
		errs = append(errs, b.putTopic(tc, false))
	}
	for name := range cur {
		if _, ok := w.TopicConfigTable[name]; ok {
			continue
		}
		errs = append(errs, b.dropTopicConfig(name))
	}
	return errors.Join(errs...)
}

// dropTopicConfig removes a topic's config alone (a slave copying a master
// that no longer has the topic).
func (b *Broker) dropTopicConfig(name string) error {
	b.topics.mu.Lock()
	defer b.topics.mu.Unlock()
	if err := b.store.DeleteTopicConfig(name); err != nil {
		return fmt.Errorf("broker: drop topic config %s: %w", name, err)
	}
	b.topics.publishLocked(func(m map[string]TopicConfig) { delete(m, name) }, b.now().UnixMilli())
	return nil
}

func (s *haSlave) applyOffsets(body []byte) error {
	st := s.b.store
	var w protocol.ConsumerOffsetSerializeWrapper
	if err := w.Decode(body); err != nil {
		return err
	}
	local := map[string]map[int32]int64{}
	if err := st.AllOffsets(func(topic, group string, q int32, off int64) bool {
		k := topic + "@" + group
		if local[k] == nil {
			local[k] = map[int32]int64{}
		}
		local[k][q] = off
		return true
	}); err != nil {
		return err
	}
	var errs []error
	for k, qs := range w.OffsetTable {
		topic, group, ok := strings.Cut(k, "@")
		if !ok || topic == "" || group == "" {
			continue
		}
		for q, off := range qs {
			if cur, ok := local[k][q]; ok && cur == off {
				continue
			}
			errs = append(errs, st.CommitOffset(group, topic, q, off))
		}
	}
	return errors.Join(errs...)
}

func (s *haSlave) applyDelayOffsets(body []byte) error {
	var w protocol.DelayOffsetSerializeWrapper
	if err := w.Decode(body); err != nil {
		return err
	}
	var errs []error
	for level, off := range w.OffsetTable {
		if level < 1 || int(level) > scheduleQueueNums {
			continue
		}
		errs = append(errs, s.b.store.PutMeta(levelKey(int(level-1)), binary.BigEndian.AppendUint64(nil, uint64(off))))
	}
	return errors.Join(errs...)
}

func (s *haSlave) applyGroups(body []byte) error {
	b := s.b
	var w protocol.SubscriptionGroupWrapper
	if err := w.Decode(body); err != nil {
		return err
	}
	var errs []error
	cur := *b.groups.m.Load()
	for name, gc := range w.SubscriptionGroupTable {
		if gc.GroupName != name || validateName(name, maxRetryTopicLen) != nil {
			continue
		}
		if gc.Attributes == nil {
			gc.Attributes = map[string]string{}
		}
		if old, ok := cur[name]; ok && reflect.DeepEqual(old, gc) {
			continue
		}
		errs = append(errs, b.putGroup(gc, false))
	}
	for name := range cur {
		if _, ok := w.SubscriptionGroupTable[name]; ok {
			continue
		}
		errs = append(errs, b.dropGroupConfig(name))
	}
	return errors.Join(errs...)
}

// dropGroupConfig removes a group's config, keeping its offsets.
func (b *Broker) dropGroupConfig(name string) error {
	b.groups.mu.Lock()
	defer b.groups.mu.Unlock()
	if err := b.store.DeleteGroupConfig(name); err != nil {
		return fmt.Errorf("broker: drop group config %s: %w", name, err)
	}
	m := maps.Clone(*b.groups.m.Load())
	delete(m, name)
	b.groups.m.Store(&m)
	return nil
}

// processGetAllConsumerOffset serves GET_ALL_CONSUMER_OFFSET (43): every
// committed offset (Java's consumerOffset.json).
func (b *Broker) processGetAllConsumerOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	w := protocol.ConsumerOffsetSerializeWrapper{OffsetTable: map[string]map[int32]int64{},
		DataVersion: &protocol.DataVersion{Timestamp: b.now().UnixMilli()}}
	if err := b.store.AllOffsets(func(topic, group string, q int32, off int64) bool {
		k := topic + "@" + group
		if w.OffsetTable[k] == nil {
			w.OffsetTable[k] = map[int32]int64{}
		}
		w.OffsetTable[k][q] = off
		return true
	}); err != nil {
		return offsetStoreError(req, err), nil
	}
	body, err := w.Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}

// processGetAllDelayOffset serves GET_ALL_DELAY_OFFSET (45): the next
// schedule queue offset of every delay level (Java's delayOffset.json).
func (b *Broker) processGetAllDelayOffset(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
	req := rc.Request()
	w := protocol.DelayOffsetSerializeWrapper{OffsetTable: map[int32]int64{},
		DataVersion: &protocol.DataVersion{Timestamp: b.now().UnixMilli()}}
	for i := range b.cfg.sub.delayLevels {
		v, ok, err := b.store.GetMeta(levelKey(i))
		if err != nil {
			return offsetStoreError(req, err), nil
		}
		off := int64(0)
		if ok && len(v) == 8 {
			off = int64(binary.BigEndian.Uint64(v))
		}
		w.OffsetTable[int32(i+1)] = off
	}
	body, err := w.Encode()
	if err != nil {
		return respond(req, protocol.ResSystemError, err.Error()), nil
	}
	resp := respond(req, protocol.ResSuccess, "")
	resp.Body = body
	return resp, nil
}
