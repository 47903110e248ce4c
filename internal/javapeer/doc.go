// Package javapeer runs Apache RocketMQ's own Java name server, broker,
// client and admin tool as test peers of runnel, so that runnel's client is
// checked against the broker nearly every user runs, and runnel's broker
// against the client nearly every user runs.
//
// Nothing is vendored. Fetch resolves the pinned artifacts
// (rocketmq-namesrv, rocketmq-broker, rocketmq-client and rocketmq-tools, with
// their dependencies) from Maven Central with `mvn dependency:copy-dependencies`
// into a cache directory (RUNNEL_JAVA_PEER_CACHE, else the user cache
// directory); Maven's local repository makes every later run offline. The
// versions are Version5 (5.3.3) and Version4 (4.9.7: the last 4.9 release
// whose broker and name server artifacts are on Maven Central; 4.9.8 was
// published without them).
//
// # Processes
//
// StartCluster starts a name server and one broker as child JVMs with small
// heaps, listening on free loopback ports (the broker also needs its fast
// port, listen-2, and its HA port, listen+1), brokerIP1 and brokerIP2 set to
// 127.0.0.1 (Java's default is the first non-loopback address), a fresh
// store under the given directory, and waits, bounded, for each process to
// print "boot success", then for the name server to list the broker (a 5.x
// broker prints it before its first registration was answered). Each child is started from a goroutine that holds
// its OS thread for the child's whole life with Pdeathsig set, so a test
// binary that dies (SIGKILL included) takes its JVMs with it; Close kills
// them and joins those goroutines. Logs (the JVM's stdout and RocketMQ's
// own log files) stay under the cluster's directory, and a failed start
// returns their last lines.
//
// 4.9 reads its logback configuration from $ROCKETMQ_HOME/conf, so Fetch
// writes those files into the cache's home directory; 5.x carries its own.
//
// # The driver and mqadmin
//
// Driver compiles driver/*.java (embedded here; runnel's own code)
// against the client jars once per source hash and version, and runs the
// official Java client's flows on command: one JVM per command, which
// prints one JSON object per line (sent and received messages, results) so
// that a Go test can follow it as it runs. Admin runs the real mqadmin
// (org.apache.rocketmq.tools.command.MQAdminStartup) against any name server,
// runnel's included.
//
// # Tests
//
// Require skips a test, saying why, when java, javac or mvn is missing or
// RUNNEL_TEST_JAVA=0, and fails it when they are present but the artifacts
// cannot be fetched: on a machine that has Java and Maven the Java-peer
// tests run, they never skip quietly.
package javapeer
