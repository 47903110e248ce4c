package source

// LagReporter is implemented by SplitReaders that know how far behind the
// end of their split they are. The runtime calls Lag on the split's task
// goroutine after polls and publishes it as the split's lag gauge.
type LagReporter interface {
	// Lag returns the number of records between the split's last
	// checkpointed position and the end of the split (for a broker queue:
	// its max offset minus the committed offset); ok is false when unknown.
	Lag() (n int64, ok bool)
}
