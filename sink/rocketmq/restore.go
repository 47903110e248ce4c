package rocketmq

import "context"

// recover implements Recover: the transactions of the latest completed
// checkpoint become durable in the local view (the runtime commits them
// next), the next epoch follows that checkpoint, and check-backs are
// answered from here on. Nothing is searched for on the broker: half
// messages no checkpoint lists are rolled back by their check-backs.
func (e *txEngine) recover(_ context.Context, pending [][]byte) error {
	if err := e.usable(); err != nil {
		return err
	}
	var maxCP uint64
	ds := make([]*txnDesc, 0, len(pending))
	for _, b := range pending {
		d, err := decodeTxn(b)
		if err != nil {
			return err
		}
		maxCP = max(maxCP, d.checkpoint)
		ds = append(ds, d)
	}
	// The latest checkpoint always lists this sink's transaction (possibly
	// empty), so the next epoch is its id + 1.
	if e.open == nil || e.open.n == 0 {
		e.epoch = max(e.epoch, maxCP+1)
		e.open = nil
	}
	e.view.restore(ds)
	return nil
}
