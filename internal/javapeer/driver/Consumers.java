package dev.runnel.javapeer;

import java.io.File;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

import static dev.runnel.javapeer.Driver.cpuNanos;
import static dev.runnel.javapeer.Driver.emit;
import static dev.runnel.javapeer.Driver.obj;

import dev.runnel.javapeer.Driver.Args;

// Consumers are the driver's consumer commands: push, litepull.
//
// Flags every consumer command takes, for tests that need the client's
// periodic work to happen sooner than its defaults (they are the client's
// own knobs, nothing is patched):
//   --rebalance-ms D     rocketmq.client.rebalance.waitInterval (20 s)
//   --lock-interval-ms D rocketmq.client.rebalance.lockInterval (20 s, orderly lock renewal)
//   --unlock-delay-ms D  rocketmq.client.unlockDelayTimeMills (20 s, orderly unlock of a
//                        queue that still holds pulled messages)
//   --persist-ms D       setPersistConsumerOffsetInterval (5 s)
//   --heartbeat-ms D     setHeartbeatBrokerInterval (30 s)
//   --heartbeat-v2 true  com.rocketmq.heartbeat.v2 (5.x): heartbeats without
//                        subscriptions while the broker says they are unchanged
//   --from first|last|timestamp [--consume-timestamp yyyyMMddHHmmss]
//                        where a group without a committed offset starts
//   --stop-file F        run until the file F exists (checked every 50 ms), then shut
//                        down cleanly (offsets persisted, client unregistered)
final class Consumers {
    private Consumers() {}

    // clientProperties sets the client's system properties from the flags;
    // it must run before the client classes that read them are initialized
    // (they read them once, into static fields).
    static void clientProperties(Args a) {
        if (a.has("rebalance-ms")) System.setProperty("rocketmq.client.rebalance.waitInterval", a.get("rebalance-ms", ""));
        if (a.has("lock-interval-ms")) System.setProperty("rocketmq.client.rebalance.lockInterval", a.get("lock-interval-ms", ""));
        if (a.has("unlock-delay-ms")) System.setProperty("rocketmq.client.unlockDelayTimeMills", a.get("unlock-delay-ms", ""));
        // ClientConfig.HEART_BEAT_V2 (5.x; 4.9 has no heartbeat v2)
        if (a.bool("heartbeat-v2")) System.setProperty("com.rocketmq.heartbeat.v2", "true");
    }

    // consumeFromWhere maps --from first|last|timestamp; timestamp takes
    // --consume-timestamp yyyyMMddHHmmss (the client's format).
    static ConsumeFromWhere consumeFromWhere(Args a) {
        switch (a.get("from", "first")) {
            case "last": return ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET;
            case "timestamp": return ConsumeFromWhere.CONSUME_FROM_TIMESTAMP;
            default: return ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET;
        }
    }

    // stopRequested reports whether the --stop-file exists.
    static boolean stopRequested(String stopFile) {
        return stopFile != null && new File(stopFile).exists();
    }

    // ---- push consumer ----------------------------------------------------

    // push --topic T --group G [--mode concurrent|orderly]
    //   [--model clustering|broadcasting] [--count N] [--timeout-ms D]
    //   [--expr TAGEXPR | --sql SQL92] [--fail-times K] [--fail-prop P]
    //   [--max-reconsume M] [--suspend-ms D] [--batch B]
    //   [--sleep-ms S] [--threads N] [--instance I] [--quiet true]
    //   [--pop true [--pop-invisible-ms D] [--pop-batch B]]
    // Prints "started", a "recv" event per delivery (redeliveries included,
    // with "delivery" (1, 2, …), "ok" (what the listener answers), "t_ms"
    // (wall clock) and "t_ns" (System.nanoTime, comparable between JVMs of
    // one host) and a "consumed" event per listener call (queue, t0_ns,
    // t1_ns, n, ok), and exits once N distinct messages (by msgId) were
    // consumed successfully (N = 0: never), --stop-file appeared, or after
    // --timeout-ms with a "timeout" event. --fail-times makes the listener
    // fail the first K deliveries of each message (with --fail-prop P: of
    // each message whose user property P is "true", and the first n of
    // those whose P is an integer n; others never fail), answering
    // RECONSUME_LATER or SUSPEND_CURRENT_QUEUE_A_MOMENT. --sleep-ms sleeps
    // in the listener, per call. --pop (5.x only) sets clientRebalance
    // false: the consumer asks the broker for its assignment
    // (QUERY_ASSIGNMENT) and pops the queues the broker says to pop
    // (ConsumeMessagePopConcurrentlyService: ack on success,
    // CHANGE_MESSAGE_INVISIBLETIME by popDelayLevel on failure), with
    // setPopInvisibleTime D and setPopBatchNums B.
    public static void push(Args a) throws Exception {
        clientProperties(a);
        String topic = a.req("topic");
        int count = a.num("count", 1);
        int failTimes = a.num("fail-times", 0);
        String failProp = a.get("fail-prop", null);
        int sleepMs = a.num("sleep-ms", 0);
        boolean quiet = a.bool("quiet");
        String stopFile = a.get("stop-file", null);
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a.req("group"));
        c.setNamesrvAddr(a.req("namesrv"));
        c.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        setMessageModel(c, "broadcasting".equals(a.get("model", "clustering")) ? "BROADCASTING" : "CLUSTERING");
        c.setConsumeFromWhere(consumeFromWhere(a));
        if (a.has("consume-timestamp")) c.setConsumeTimestamp(a.get("consume-timestamp", ""));
        c.setConsumeMessageBatchMaxSize(a.num("batch", 1));
        if (a.has("max-reconsume")) c.setMaxReconsumeTimes(a.num("max-reconsume", 16));
        if (a.has("suspend-ms")) c.setSuspendCurrentQueueTimeMillis(a.num("suspend-ms", 1000));
        if (a.has("persist-ms")) c.setPersistConsumerOffsetInterval(a.num("persist-ms", 5000));
        if (a.has("heartbeat-ms")) c.setHeartbeatBrokerInterval(a.num("heartbeat-ms", 30000));
        if (a.has("threads")) {
            c.setConsumeThreadMin(a.num("threads", 20));
            c.setConsumeThreadMax(a.num("threads", 20));
        }
        if (a.bool("pop")) {
            invoke(c, "setClientRebalance", boolean.class, false);
            if (a.has("pop-invisible-ms")) invoke(c, "setPopInvisibleTime", long.class, (long) a.num("pop-invisible-ms", 60000));
            if (a.has("pop-batch")) invoke(c, "setPopBatchNums", int.class, a.num("pop-batch", 32));
        }
        if (a.has("sql")) {
            c.subscribe(topic, MessageSelector.bySql(a.get("sql", "")));
        } else {
            c.subscribe(topic, a.get("expr", "*"));
        }
        Map<String, Integer> deliveries = new ConcurrentHashMap<>();
        Map<String, Boolean> done = new ConcurrentHashMap<>();
        CountDownLatch finished = new CountDownLatch(Math.max(count, 0));
        AtomicLong received = new AtomicLong();
        Failer failer = new Failer(deliveries, failTimes, failProp, quiet, received);
        if ("orderly".equals(a.get("mode", "concurrent"))) {
            c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                long t0 = System.nanoTime();
                boolean ok = failer.consume(msgs);
                sleep(sleepMs);
                if (ok) for (MessageExt m : msgs) markDone(m, done, finished);
                consumedEvent(quiet, ctx.getMessageQueue(), t0, msgs.size(), ok);
                return ok ? ConsumeOrderlyStatus.SUCCESS : ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
            });
        } else {
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                long t0 = System.nanoTime();
                boolean ok = failer.consume(msgs);
                sleep(sleepMs);
                if (ok) for (MessageExt m : msgs) markDone(m, done, finished);
                consumedEvent(quiet, ctx.getMessageQueue(), t0, msgs.size(), ok);
                return ok ? ConsumeConcurrentlyStatus.CONSUME_SUCCESS : ConsumeConcurrentlyStatus.RECONSUME_LATER;
            });
        }
        long cpu0 = cpuNanos(), t0 = System.nanoTime();
        c.start();
        emit(obj("ev", "started", "client_id", c.buildMQClientId()));
        long deadline = System.currentTimeMillis() + a.num("timeout-ms", 60000);
        boolean ok = false;
        while (System.currentTimeMillis() < deadline) {
            if ((count > 0 && finished.getCount() == 0) || stopRequested(stopFile)) {
                ok = true;
                break;
            }
            finished.await(50, TimeUnit.MILLISECONDS);
        }
        long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
        if (!ok) emit(obj("ev", "timeout", "consumed", done.size(), "want", count));
        c.shutdown();
        emit(obj("ev", "done", "consumed", done.size(), "received", received.get(), "ns", wall, "cpu_ns", cpu));
    }

    static void sleep(int ms) {
        if (ms <= 0) return;
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    static void consumedEvent(boolean quiet, MessageQueue q, long t0, int n, boolean ok) {
        if (quiet) return;
        emit(obj("ev", "consumed", "topic", q.getTopic(), "q", q.getQueueId(), "t0_ns", t0, "t1_ns", System.nanoTime(),
            "n", n, "ok", ok));
    }

    // Failer counts deliveries and decides which ones the listener fails.
    static final class Failer {
        final Map<String, Integer> deliveries;
        final int failTimes;
        final String failProp;
        final boolean quiet;
        final AtomicLong received;

        Failer(Map<String, Integer> deliveries, int failTimes, String failProp, boolean quiet, AtomicLong received) {
            this.deliveries = deliveries;
            this.failTimes = failTimes;
            this.failProp = failProp;
            this.quiet = quiet;
            this.received = received;
        }

        // failures is how many deliveries of m the listener fails.
        int failures(MessageExt m) {
            if (failProp == null) return failTimes;
            String v = m.getUserProperty(failProp);
            if (v == null) return 0;
            if ("true".equals(v)) return failTimes;
            return Integer.parseInt(v);
        }

        // consume records one delivery of each message and reports whether
        // the listener succeeds with all of them.
        boolean consume(List<MessageExt> msgs) {
            boolean ok = true;
            for (MessageExt m : msgs) {
                received.incrementAndGet();
                int n = deliveries.merge(key(m), 1, Integer::sum);
                boolean mok = n > failures(m);
                if (!quiet) {
                    Map<String, Object> ev = recvEvent(m);
                    ev.put("delivery", n);
                    ev.put("ok", mok);
                    ev.put("t_ms", System.currentTimeMillis());
                    ev.put("t_ns", System.nanoTime());
                    emit(ev);
                }
                ok &= mok;
            }
            return ok;
        }
    }

    // setMessageModel sets the push consumer's model by name: the enum moved
    // from org.apache.rocketmq.common.protocol.heartbeat (4.9) to
    // org.apache.rocketmq.remoting.protocol.heartbeat (5.x).
    @SuppressWarnings({"unchecked", "rawtypes"})
    static void setMessageModel(Object c, String model) throws Exception {
        for (java.lang.reflect.Method mt : c.getClass().getMethods()) {
            if (mt.getName().equals("setMessageModel")) {
                Class t = mt.getParameterTypes()[0];
                mt.invoke(c, Enum.valueOf(t, model));
                return;
            }
        }
        throw new IllegalStateException("no setMessageModel");
    }

    // invoke calls a setter that only some client versions have (fails on
    // the others).
    static void invoke(Object o, String name, Class<?> type, Object v) throws Exception {
        o.getClass().getMethod(name, type).invoke(o, v);
    }

    static String key(MessageExt m) {
        return m.getProperty("UNIQ_KEY") != null ? m.getProperty("UNIQ_KEY") : m.getMsgId();
    }

    static void markDone(MessageExt m, Map<String, Boolean> done, CountDownLatch finished) {
        if (done.putIfAbsent(key(m), Boolean.TRUE) == null) finished.countDown();
    }

    static Map<String, Object> recvEvent(MessageExt m) {
        Map<String, Object> props = new LinkedHashMap<>(m.getProperties());
        return obj("ev", "recv", "id", m.getMsgId(), "topic", m.getTopic(), "broker", m.getBrokerName(),
            "q", m.getQueueId(), "qoff", m.getQueueOffset(), "tags", m.getTags(), "keys", m.getKeys(),
            "reconsume", m.getReconsumeTimes(), "body", new String(m.getBody(), StandardCharsets.UTF_8),
            "born_ms", m.getBornTimestamp(), "store_ms", m.getStoreTimestamp(), "props", props);
    }

    // ---- lite pull consumer -----------------------------------------------

    // litepull --topic T --group G [--mode subscribe|assign] [--count N]
    //   [--timeout-ms D] [--seek Q:OFF,...] [--commit sync|auto|none]
    //   [--expr TAGEXPR] [--pull-batch B]
    //   [--model clustering|broadcasting] [--instance I]
    // Polls until N messages arrived (printing "recv" events), then commits
    // as --commit says (commitSync; auto commits on the client's own
    // schedule; none leaves offsets alone) and prints "done" with the
    // committed offsets of the queues it was assigned ("committed", by queue
    // id, as DefaultLitePullConsumer.committed reads them). Assign mode
    // assigns every queue of T, then applies --seek; subscribe mode waits
    // for the rebalance to assign queues before --seek.
    // seekPatiently is c.seek(q, off), which asks the broker for the
    // queue's bounds with the client's 6 s RPC timeout. On a loaded test
    // machine one such call can time out, and one can fail because a pull
    // still under way was interrupted and closed the connection (see
    // litepull; the next call reconnects). Those two are retried (and told
    // as a "seek-retry" event) until the deadline, any other error is not.
    static void seekPatiently(DefaultLitePullConsumer c, MessageQueue q, long off, long deadline) throws Exception {
        while (true) {
            try {
                c.seek(q, off);
                return;
            } catch (Exception e) {
                boolean retry = false;
                for (Throwable t = e; t != null; t = t.getCause()) {
                    String n = t.getClass().getSimpleName();
                    if (n.contains("Timeout") || n.equals("RemotingSendRequestException")) retry = true;
                    if (t.getCause() == t) break;
                }
                if (!retry || System.currentTimeMillis() >= deadline) throw e;
                emit(obj("ev", "seek-retry", "queue", q.getQueueId(), "error", Driver.describe(e)));
            }
        }
    }

    public static void litepull(Args a) throws Exception {
        clientProperties(a);
        String topic = a.req("topic");
        int count = a.num("count", 1);
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(a.req("group"));
        c.setNamesrvAddr(a.req("namesrv"));
        c.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        String commit = a.get("commit", "sync");
        c.setAutoCommit("auto".equals(commit));
        c.setConsumeFromWhere(consumeFromWhere(a));
        if (a.has("consume-timestamp")) c.setConsumeTimestamp(a.get("consume-timestamp", ""));
        if (a.has("pull-batch")) c.setPullBatchSize(a.num("pull-batch", 10));
        if (a.has("persist-ms")) c.setPersistConsumerOffsetInterval(a.num("persist-ms", 5000));
        if (a.has("model")) setMessageModel(c, "broadcasting".equals(a.get("model", "")) ? "BROADCASTING" : "CLUSTERING");
        boolean assign = "assign".equals(a.get("mode", "subscribe"));
        if (!assign) c.subscribe(topic, a.get("expr", "*"));
        c.start();
        long deadline = System.currentTimeMillis() + a.num("timeout-ms", 60000);
        Collection<MessageQueue> queues;
        if (assign) {
            queues = c.fetchMessageQueues(topic);
            c.assign(queues);
        } else {
            queues = new ArrayList<>();
            if (a.has("seek")) {
                // seek needs the queue assigned: wait for the rebalance.
                while (c.assignment().isEmpty() && System.currentTimeMillis() < deadline) Thread.sleep(50);
            }
        }
        if (a.has("seek")) {
            Collection<MessageQueue> targets = assign ? queues : c.assignment();
            Map<MessageQueue, Long> seeks = new LinkedHashMap<>();
            for (String s : a.get("seek", "").split(",")) {
                String[] qo = s.split(":");
                for (MessageQueue q : targets) {
                    if (q.getQueueId() == Integer.parseInt(qo[0])) seeks.put(q, Long.parseLong(qo[1]));
                }
            }
            // seek interrupts the queue's running pull task (apache/rocketmq
            // issue #3853), and an interrupted call closes the client's one
            // connection to the broker, failing every call in flight on it:
            // the seek's own min/max offset queries, other queues' pulls. So
            // the queues are paused first (a paused queue's task only
            // reschedules itself, every second) and sought once the pulls
            // already under way have had time to return.
            c.pause(seeks.keySet());
            Thread.sleep(1500);
            for (Map.Entry<MessageQueue, Long> e : seeks.entrySet()) seekPatiently(c, e.getKey(), e.getValue(), deadline);
            c.resume(seeks.keySet());
        }
        emit(obj("ev", "started"));
        int got = 0;
        while (got < count && System.currentTimeMillis() < deadline) {
            for (MessageExt m : c.poll(200)) {
                got++;
                Map<String, Object> ev = recvEvent(m);
                ev.put("t_ms", System.currentTimeMillis());
                emit(ev);
            }
        }
        if (got < count) emit(obj("ev", "timeout", "consumed", got, "want", count));
        if ("sync".equals(commit)) c.commitSync();
        if (!assign) queues = c.assignment();
        Map<String, Object> committed = new LinkedHashMap<>();
        for (MessageQueue q : queues) committed.put(Integer.toString(q.getQueueId()), c.committed(q));
        emit(obj("ev", "done", "consumed", got, "committed", committed));
        c.shutdown();
    }

}
