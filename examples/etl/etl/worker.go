package etl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/runnel-dev/runnel/pipeline"
	"github.com/runnel-dev/runnel/sink"
	mqsink "github.com/runnel-dev/runnel/sink/rocketmq"
	srcmq "github.com/runnel-dev/runnel/source/rocketmq"
	"github.com/runnel-dev/runnel/transport/client"
)

// runWorker runs the job as one worker of many (pipeline.RunWorker): every
// worker started with the same Group shares the work, each with its own
// StateDir.
func runWorker(ctx context.Context, c *client.Client, cfg Config) (err error) {
	log := cfg.logger()
	var alo *client.Producer
	if cfg.AtLeastOnce {
		if alo, err = client.NewProducer(c, cfg.Group+"_alo", client.WithSelector(client.HashBySharding())); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, alo.Close()) }()
	}
	build := func(job *pipeline.Job) error {
		out, dlq, err := cfg.sinks(c, alo)
		if err != nil {
			return err
		}
		src, err := cfg.source(c)
		if err != nil {
			return errors.Join(err, out.Close(), dlq.Close())
		}
		build(job, src, out, dlq, cfg.Partitioned)
		return nil
	}
	opts := []pipeline.JobOption{pipeline.CheckpointDir(cfg.StateDir), pipeline.CheckpointInterval(cfg.CheckpointInterval),
		pipeline.Logger(log), pipeline.WorkerGroup(cfg.Group)}
	if cfg.Ranges > 0 {
		opts = append(opts, pipeline.Ranges(cfg.Ranges))
	}
	if cfg.Standbys > 0 {
		opts = append(opts, pipeline.Standbys(cfg.Standbys))
	}
	if cfg.StatusAddr != "" {
		opts = append(opts, pipeline.StatusAddress(cfg.StatusAddr, cfg.OnStatusAddr))
	}
	opts = append(opts, cfg.WorkerOptions...)
	return pipeline.RunWorker(ctx, c, cfg.Group, build, opts...)
}

// sinks returns the job's output and dead-letter sinks (a task's own, in
// worker mode).
func (cfg *Config) sinks(c *client.Client, alo *client.Producer) (sink.Sink[Enriched], sink.Sink[sink.DeadLetter], error) {
	in, dlqTopic := cfg.In, cfg.DLQ
	outMap := func(e Enriched) (*client.Message, error) { return OutputMessage(cfg.Out, &e), nil }
	dlqMap := func(d sink.DeadLetter) (*client.Message, error) { return DeadLetterMessage(dlqTopic, in, d), nil }
	if alo != nil {
		out, err := mqsink.New(alo, outMap)
		if err != nil {
			return nil, nil, err
		}
		dlq, err := mqsink.New(alo, dlqMap)
		if err != nil {
			return nil, nil, err
		}
		return out, dlq, nil
	}
	// The job binds each exactly-once sink to its producer group:
	// TxGroup(Group, sink UID).
	opts := append([]mqsink.TxOption{mqsink.WithTxLogger(cfg.logger())}, cfg.SinkOptions...)
	// The topics the restore check reads (RestoreFrom).
	o, err := mqsink.NewExactlyOnce(c, outMap, append(opts[:len(opts):len(opts)], mqsink.WithOutputTopics(cfg.Out))...)
	if err != nil {
		return nil, nil, err
	}
	d, err := mqsink.NewExactlyOnce(c, dlqMap, append(opts[:len(opts):len(opts)], mqsink.WithOutputTopics(dlqTopic))...)
	if err != nil {
		return nil, nil, errors.Join(err, o.Close())
	}
	return o, d, nil
}

// source returns the job's source (its consumer group is the job's name:
// the job binds it).
func (cfg *Config) source(c *client.Client) (*srcmq.Source, error) {
	opts := []srcmq.Option{srcmq.WithLogger(cfg.logger())}
	if cfg.Bounded {
		opts = append(opts, srcmq.WithStop(srcmq.StopAtLatest()))
	}
	return srcmq.New(c, cfg.In, opts...)
}

// OrderCodec encodes orders where they cross the network between workers
// (the enrich stage's repartition topic): the fields and the lineage, in a
// compact binary form.
func OrderCodec() pipeline.Codec[Order] { return orderCodec{} }

type orderCodec struct{}

func (orderCodec) ID() string { return "etl.order.v1" }

func (orderCodec) Append(dst []byte, o Order) ([]byte, error) {
	for _, s := range [...]string{o.ID, o.Customer, o.Currency, o.TS, o.Src.Topic, o.Src.Broker} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	dst = binary.BigEndian.AppendUint64(dst, math.Float64bits(o.Amount))
	dst = binary.AppendVarint(dst, int64(o.Src.Queue))
	return binary.AppendVarint(dst, o.Src.Offset), nil
}

func (orderCodec) Decode(b []byte) (Order, error) {
	var o Order
	var fields [6]string
	for i := range fields {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return Order{}, fmt.Errorf("etl: bad encoded order")
		}
		fields[i] = string(b[k : k+int(n)])
		b = b[k+int(n):]
	}
	o.ID, o.Customer, o.Currency, o.TS, o.Src.Topic, o.Src.Broker = fields[0], fields[1], fields[2], fields[3], fields[4], fields[5]
	if len(b) < 8 {
		return Order{}, fmt.Errorf("etl: bad encoded order")
	}
	o.Amount = math.Float64frombits(binary.BigEndian.Uint64(b))
	b = b[8:]
	q, k := binary.Varint(b)
	if k <= 0 {
		return Order{}, fmt.Errorf("etl: bad encoded order")
	}
	off, k2 := binary.Varint(b[k:])
	if k2 <= 0 || len(b) != k+k2 {
		return Order{}, fmt.Errorf("etl: bad encoded order")
	}
	o.Src.Queue, o.Src.Offset = int32(q), off
	return o, nil
}
