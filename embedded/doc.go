// Package embedded runs a RocketMQ cluster inside this process: runnel's
// name server (transport/namesrv) and one or several brokers
// (transport/broker) on loopback, storing on Pebble in a temporary
// directory. It is what runnel's CLI (`runnel broker`, `runnel demo`), its
// examples and its tests run on, and what users test their own jobs
// against: the official RocketMQ clients, runnel's client and every source
// and sink of runnel talk to it over real TCP as to any RocketMQ 4.x/5.x
// cluster.
//
//	cl, err := embedded.Start(ctx, embedded.WithTopic("orders", 4))
//	if err != nil { … }
//	defer cl.Close()
//	src, err := srcmq.New(cl.Client(), "orders") // cl.NameServer() for other clients
//
// In a test, Run does the same with the test's TempDir and Cleanup, and
// fails the test when the cluster does not start:
//
//	cl := embedded.Run(t, embedded.WithTopic("orders", 4))
//
// # What runs
//
// Start starts the name server on 127.0.0.1, a free port
// (WithNameServerAddr), then the brokers (WithBrokers, one by default),
// named BrokerName(i) ("broker-a", "broker-b", …) in one cluster
// (WithClusterName), each on a free loopback port with its store in its own
// directory under the data directory (WithDataDir; a temporary one that
// Close removes by default). The brokers flush asynchronously by default
// (WithFlushMode). Start returns once the name server lists every broker,
// so that the default topic TBW102 is routable and producers can create
// topics on first send; WithTopic and CreateTopic create topics on every
// broker and wait until their routes show every queue. Close stops
// everything at once, Shutdown gracefully; both join every goroutine Start
// started.
//
// Security: WithACL puts an acl.Policy on every port (the brokers sign
// their registrations with the admin account given with it), WithTLS a TLS
// mode and certificate; the cluster's own client (Client) and
// ClientOptions reach the cluster through them. Anything else a name server
// or broker can be configured with passes through WithNameServerOptions and
// WithBrokerOptions, applied after the cluster's own options so that they
// override them. With WithExternalNameServers the brokers register with
// name servers run elsewhere instead of the cluster's own.
//
// # Fault hooks
//
// Every broker of a Cluster is built with an interceptor
// (remoting.WithInterceptor, through broker.WithRemotingOptions) that runs
// the hooks registered with Control and KeepControl (of the Cluster for any
// broker, of a Broker for that one) in registration order, before the
// broker's own processor and after its ACL check. A hook is a
// remoting.ControlFunc, so remoting.DelayReply, remoting.DropConnection and
// remoting.RespondWith (SYSTEM_BUSY, say) work as hooks, and a hook may look
// at the request and its connection to decide. With no hook registered
// the interceptor costs one atomic load per request. Unlike the controls of
// a remoting.Server, hooks do not move requests off the connection's reader
// goroutine: for the codes the broker serves there (sends,
// END_TRANSACTION), a hook that blocks also holds that connection's later
// requests.
//
// Clusters share nothing: several run side by side in one process, each
// with its own ports, data and hooks.
package embedded
