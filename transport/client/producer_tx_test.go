package client

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/runnel-dev/runnel/transport/protocol"
	"github.com/runnel-dev/runnel/transport/remoting"
)

// txBroker is a small real remoting server playing name server and a
// transactional broker: it stores nothing, but answers half sends the way
// an Apache RocketMQ broker does, sends a CHECK_TRANSACTION_STATE back on
// the producer's connection, and records END_TRANSACTION requests.
type txBroker struct {
	srv  *remoting.Server
	addr string
	ends chan protocol.EndTransactionRequestHeader
}

func startTxBroker(t *testing.T) *txBroker {
	t.Helper()
	srv, err := remoting.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	a, err := srv.Listen(t.Context(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tb := &txBroker{srv: srv, addr: a.String(), ends: make(chan protocol.EndTransactionRequestHeader, 16)}
	t.Cleanup(func() { _ = srv.Close() })
	store := netip.MustParseAddrPort(tb.addr)
	srv.Handle(protocol.ReqGetRouteInfoByTopic, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		d := protocol.TopicRouteData{
			QueueDatas:  []protocol.QueueData{{BrokerName: "tx-broker", ReadQueueNums: 1, WriteQueueNums: 1, Perm: 6}},
			BrokerDatas: []protocol.BrokerData{{Cluster: "c", BrokerName: "tx-broker", BrokerAddrs: map[int64]string{0: tb.addr}}},
		}
		resp := protocol.NewResponse(rc.Request(), 0, "")
		resp.Body, _ = d.Encode()
		return resp, nil
	}))
	srv.Handle(protocol.ReqHeartbeat, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		return protocol.NewResponse(rc.Request(), 0, ""), nil
	}))
	srv.Handle(protocol.ReqSendMessageV2, remoting.ProcessorFunc(func(ctx context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		var h protocol.SendMessageRequestHeaderV2
		if err := h.Decode(rc.Request()); err != nil {
			return nil, err
		}
		uniq, _ := protocol.PropertyValue(h.Properties, protocol.PropUniqKey)
		const halfOffset, phys = 7, 0x1234
		resp := protocol.NewResponse(rc.Request(), 0, "")
		rh := protocol.SendMessageResponseHeader{MsgID: protocol.OffsetMsgID(store, phys), QueueID: 0, QueueOffset: halfOffset, TransactionID: uniq}
		rh.Encode(resp)
		if err := rc.Respond(resp); err != nil {
			return nil, err
		}
		// Check back at once, as a broker would after its timeout: first for
		// another group (must be ignored), then for this one.
		for _, group := range []string{"other-group", h.ProducerGroup} {
			m := protocol.MessageExt{Topic: h.Topic, QueueOffset: 11, CommitLogOffset: 0x5678, StoreHost: store, BornHost: store,
				Body: []byte("half"), Properties: string(protocol.AppendProperty(protocol.AppendProperty(nil,
					protocol.PropUniqKey, uniq), protocol.PropProducerGroup, group))}
			body, err := m.AppendRecord(nil)
			if err != nil {
				return nil, err
			}
			chk := protocol.NewRequest(protocol.ReqCheckTransactionState)
			ch := protocol.CheckTransactionStateRequestHeader{Topic: h.Topic, TranStateTableOffset: 11, CommitLogOffset: 0x5678,
				MsgID: uniq, TransactionID: uniq, OffsetMsgID: protocol.OffsetMsgID(store, 0x5678)}
			ch.Encode(chk)
			chk.Body = body
			if err := rc.Conn().InvokeOneway(ctx, chk); err != nil {
				return nil, err
			}
		}
		rc.Defer() // answered above
		return nil, nil
	}))
	srv.Handle(protocol.ReqEndTransaction, remoting.ProcessorFunc(func(_ context.Context, rc *remoting.RequestCtx) (*protocol.Command, error) {
		var h protocol.EndTransactionRequestHeader
		if err := h.Decode(rc.Request()); err != nil {
			return nil, err
		}
		tb.ends <- h
		return protocol.NewResponse(rc.Request(), 0, ""), nil
	}))
	return tb
}

func TestProducerTransactionCheckBack(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	tb := startTxBroker(t)
	c, err := New(WithNameServers(tb.addr), WithLogger(coreTestLogger()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	checked := make(chan string, 4)
	p := newProducer(t, c, "tx-group", WithCheckListener(func(_ context.Context, m *protocol.MessageExt) TxState {
		checked <- m.UniqKey()
		return TxRollback
	}))
	ctx := testCtx(t, 10*time.Second)
	h, err := p.SendHalf(ctx, &Message{Topic: "TxT", Body: []byte("half")})
	if err != nil {
		t.Fatal(err)
	}
	if h.TranStateTableOffset != 7 || h.CommitLogOffset != 0x1234 || h.BrokerName != "tx-broker" || h.BrokerAddr != tb.addr ||
		h.MsgID == "" || h.TransactionID != h.MsgID || h.ProducerGroup != "tx-group" || h.Topic != "TxT" {
		t.Fatalf("handle %+v", h)
	}
	// The handle survives a checkpoint (JSON round trip) and ends the
	// transaction from there.
	raw, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	var restored TxHandle
	if err := json.Unmarshal(raw, &restored); err != nil || restored != h {
		t.Fatalf("handle round trip: %v %+v", err, restored)
	}

	// The check-back for this group is answered (rollback, from check);
	// the one for another group is ignored.
	select {
	case id := <-checked:
		if id != h.MsgID {
			t.Fatalf("listener saw %q, want %q", id, h.MsgID)
		}
	case <-ctx.Done():
		t.Fatal("no check-back reached the listener")
	}
	end := <-tb.ends
	if end.CommitOrRollback != protocol.SysFlagTransactionRollback || !end.FromTransactionCheck.V || end.TranStateTableOffset != 11 ||
		end.CommitLogOffset != 0x5678 || end.MsgID != h.MsgID || end.ProducerGroup != "tx-group" {
		t.Fatalf("check-back answer %+v", end)
	}

	if err := p.EndTransaction(ctx, restored, true); err != nil {
		t.Fatal(err)
	}
	end = <-tb.ends
	if end.CommitOrRollback != protocol.SysFlagTransactionCommit || end.FromTransactionCheck.V || end.TranStateTableOffset != 7 ||
		end.CommitLogOffset != 0x1234 || end.MsgID != h.MsgID || end.TransactionID != h.TransactionID || end.BrokerName != "tx-broker" {
		t.Fatalf("end transaction %+v", end)
	}

	// The asynchronous form sends the same request and reports the
	// broker's answer through its callback, once.
	answered := make(chan error, 2)
	p.EndTransactionAsync(ctx, restored, false, func(err error) { answered <- err })
	select {
	case end = <-tb.ends:
	case <-ctx.Done():
		t.Fatal("no asynchronous END_TRANSACTION reached the broker")
	}
	if end.CommitOrRollback != protocol.SysFlagTransactionRollback || end.FromTransactionCheck.V || end.TranStateTableOffset != 7 ||
		end.CommitLogOffset != 0x1234 || end.MsgID != h.MsgID || end.TransactionID != h.TransactionID || end.BrokerName != "tx-broker" {
		t.Fatalf("asynchronous end transaction %+v", end)
	}
	wait := func() error {
		select {
		case err := <-answered:
			return err
		case <-ctx.Done():
			t.Fatal("no callback")
			return nil
		}
	}
	if err := wait(); err != nil {
		t.Fatalf("asynchronous end transaction: %v", err)
	}
	// A handle naming no reachable broker fails through the callback.
	p.EndTransactionAsync(ctx, TxHandle{Topic: "TxT", BrokerName: "nowhere", MsgID: h.MsgID}, true, func(err error) { answered <- err })
	if err := wait(); !errors.Is(err, ErrNoRoute) {
		t.Fatalf("asynchronous end transaction without an address: %v", err)
	}
	select {
	case err := <-answered:
		t.Fatalf("callback called twice (%v)", err)
	default:
	}
	select {
	case id := <-checked:
		t.Fatalf("listener called again (%q): the other group's check-back was not ignored", id)
	default:
	}
}
