// Added to a private copy of the official client by runnel's scripts/bench.sh;
// not part of upstream. It exposes the package's own codec, unchanged.

package remote

// RunnelShimDecode is the decoder the official remoting client runs on every
// frame it reads (frame without its leading total-length word).
func RunnelShimDecode(frame []byte) (*RemotingCommand, error) { return decode(frame) }

// RunnelShimSetCodecType switches the header encoding WriteTo uses (0 JSON,
// 1 ROCKETMQ) and returns the previous one. The official client never
// changes it (it always sends JSON); benchmarks use it to measure the
// client's ROCKETMQ encoder. Not safe while the client is in use.
func RunnelShimSetCodecType(t byte) (old byte) {
	old, codecType = codecType, t
	return old
}
