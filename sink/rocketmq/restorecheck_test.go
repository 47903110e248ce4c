package rocketmq

import (
	"errors"
	"strconv"
	"testing"

	"github.com/runnel-dev/runnel/transport/client"
)

// TestTxnCodecFloors: a description with output floors is version 3 and
// keeps each handle's queue and each queue's floor (an unknown floor stays
// unknown); versions 1 and 2 decode without floors (a restore commits them
// whole); every truncation is an error.
func TestTxnCodecFloors(t *testing.T) {
	d := &txnDesc{checkpoint: 9, run: "r", epoch: 9, floors: map[queueKey]int64{
		{topic: "t", broker: "b", queue: 0}: 0,
		{topic: "t", broker: "b", queue: 1}: 1234,
		{topic: "u", broker: "b", queue: 3}: 1 << 40,
	}}
	for i := range 30 {
		tp, q := "t", int32(i%2)
		if i%5 == 0 {
			tp, q = "u", 3
		}
		d.handles = append(d.handles, txnHandle{lane: uint32(i % 3), h: client.TxHandle{
			ProducerGroup: "g", Topic: tp, BrokerName: "b", BrokerAddr: "127.0.0.1:1", QueueID: q,
			TranStateTableOffset: int64(i), CommitLogOffset: int64(i * 100), MsgID: "id" + strconv.Itoa(i), TransactionID: "id" + strconv.Itoa(i),
		}})
	}
	d.handles = append(d.handles, txnHandle{h: client.TxHandle{ProducerGroup: "g", Topic: "v", BrokerName: "b", QueueID: 7, MsgID: "nofloor", TransactionID: "nofloor"}})
	b := appendTxn(nil, d)
	if b[2] != txnVersion3 {
		t.Fatalf("version %d, want 3", b[2])
	}
	got, err := decodeTxn(b)
	if err != nil {
		t.Fatal(err)
	}
	for i := range d.handles {
		if got.handles[i] != d.handles[i] {
			t.Fatalf("handle %d: %+v != %+v", i, got.handles[i], d.handles[i])
		}
	}
	if len(got.floors) != 3 || len(got.retried) != 0 {
		t.Fatalf("floors %v retried %v", got.floors, got.retried)
	}
	for k, f := range d.floors {
		if got.floors[k] != f {
			t.Fatalf("floor of %+v: %d, want %d", k, got.floors[k], f)
		}
	}
	if _, ok := got.floors[queueKey{topic: "v", broker: "b", queue: 7}]; ok {
		t.Fatal("an unknown floor decoded as known")
	}
	for n := range len(b) {
		if _, err := decodeTxn(b[:n]); !errors.Is(err, ErrBadTxn) {
			t.Fatalf("truncated at %d: %v", n, err)
		}
	}
	d.floors = nil
	old, err := decodeTxn(appendTxn(nil, d))
	if err != nil || old.floors != nil {
		t.Fatalf("version 1: floors %v, %v", old.floors, err)
	}
}
