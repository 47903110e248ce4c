// Package checkpoint is a runnel job's durable store: one Pebble database per
// job directory holding committed keyed state, source offsets, pending sink
// commits and checkpoint metadata, all advanced together by one synced batch
// per checkpoint (Store.Commit). Savepoints are portable files of the latest
// completed checkpoint.
package checkpoint
