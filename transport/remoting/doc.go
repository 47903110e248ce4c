// Package remoting is RocketMQ's remoting transport: a multiplexed connection
// (Conn) that matches responses to requests by opaque, and a Server that runs
// one Processor per request code on many such connections. The broker, the
// name server and the client are built on it; frames are encoded and decoded
// by package protocol.
//
// # Conn
//
// Dial (or NewConn) returns a running Conn. Invoke sends a request and waits
// for its response; InvokeAsync calls back instead; InvokeOneway sends a
// request that is never answered. Every call takes a ctx that bounds both the
// wait for room (in-flight limits, the write queue) and the wait for the
// response. Opaques come from a per-Conn counter. Requests the peer sends to
// the Conn (CHECK_TRANSACTION_STATE, …) go to the RequestHandler.
//
// # Server
//
// NewServer, Handle(code, processor), then Listen or Serve. A processor
// returns the response, an error (answered SYSTEM_ERROR, or the code of a
// *protocol.Error), or defers the answer with RequestCtx.Defer and
// RequestCtx.Respond (long polling). Each accepted connection is a
// ServerConn, which embeds Conn so the server can send requests to the
// client. WithInterceptor adds interceptors that see every request before
// the controls and the processor (package acl's access control is one).
// Control and KeepControl inject faults for tests.
//
// # Goroutines and bounds
//
// Each connection has one reader goroutine (bufio, one allocation per frame
// for its bytes plus the decoded Command; on a client's plain TCP
// connection, a sync call made while nothing else is in flight reads its
// own response instead, sparing the hand-off, see WithCallerReads), a
// writer goroutine while frames
// are queued (drains a bounded queue, coalescing queued frames into one
// buffered write per batch; it ends when the queue is empty),
// and at most WithMaxConcurrentHandlers goroutines running incoming requests.
// On a plain TCP connection a frame sent while nothing is queued or in flight
// skips the writer: the sending goroutine writes it without waiting (what the
// socket does not take is queued, at the head, for the writer). The bufio
// buffers are pooled: a connection holds its write buffer while its writer
// drains and, on plain TCP, its read buffer while it reads a frame (on
// Linux only once the frame, or a buffer's worth of a larger one, is all
// in the socket: the bytes of a partial frame are set aside meanwhile), so
// an idle connection holds neither, and on Linux one trickling a frame in
// holds no read buffer either.
// Every one of them is joined: by Conn.Close, or for server connections by
// Server.Close/Shutdown. Every queue is bounded:
//
//   - requests wait for write-queue room and in-flight slots, as their ctx
//     allows (backpressure to the caller);
//   - responses never wait: a full write queue (WithWriteQueueFrames frames,
//     or WithMaxQueuedBytes bytes) means the peer is not reading, and the
//     connection is closed with ErrWriteQueueFull or ErrWriteQueueBytes;
//   - incoming requests beyond the handler bound are answered SYSTEM_BUSY at
//     once, so a slow handler never stops the reader (which also delivers
//     responses);
//   - a frame larger than WithMaxFrameSize, a malformed frame, no complete
//     frame within the idle timeout, or a write stuck past the write timeout
//     closes that connection only;
//   - a Server keeps at most WithMaxConns connections open, and
//     WithMaxConnsPerIP per remote IP (beyond them it accepts and closes at
//     once), and closes a connection without a complete frame within
//     WithFirstFrameTimeout of accept. Each refusal or close for a limit is
//     counted in ServerStats and logged at most once per
//     WithLimitLogInterval.
//
// # Non-obvious invariants
//
//   - A pending call is completed by whoever removes it from the pending
//     table (reader, ctx expiry, Close), under Conn.mu, so each call completes
//     exactly once; a sync call's channel has room for that one result, so
//     completion never blocks. A caller that loses the race for its own call
//     waits for the winner's delivery.
//   - An async call's AfterFunc stop function is written and read under
//     Conn.mu only.
//   - A request frame is registered as pending before it is queued, so its
//     response can never arrive first.
//   - Conn.queued counts frames queued but not yet flushed and
//     Conn.handling counts server requests neither returned nor (if deferred)
//     answered; Respond queues before decrementing handling, so Shutdown,
//     which closes a connection when both are zero, never loses a response.
//   - The socket's write side has one owner at a time (Conn.wq.writing,
//     under Conn.wq's lock): a direct write happens only when the queue is
//     empty and the side free, so frames a goroutine sent earlier are
//     always written before its later ones.
//   - Locks are never nested: Server.mu, Conn.mu, Conn.wq, controls.mu and the
//     ServerConn values lock each guard their own fields, and nothing runs
//     callbacks (InvokeAsync callbacks, hooks, OnConnect/OnDisconnect) or
//     Conn.shutdown while holding one.
package remoting
