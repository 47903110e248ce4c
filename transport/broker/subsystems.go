package broker

// newExtensions builds the subsystems the core broker delegates to (client
// registry, locks, retry/DLQ, delay/timer delivery, reply push). This first
// version installs none: every hook is nil and the core behaves as
// documented on extensions.
func newExtensions(b *Broker) extensions { return extensions{} }
