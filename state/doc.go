// Package state is runnel's keyed state: typed handles (Value, List, Map,
// Reducing, Aggregating, Timers) bound to a Backend's current key, stored in
// the job's checkpoint.Store behind a write-back layer so that nothing an
// operator writes becomes durable except through a checkpoint.
package state
