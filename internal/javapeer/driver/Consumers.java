package dev.runnel.javapeer;

import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.MessageSelector;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyContext;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.LocalTransactionState;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.TransactionListener;
import org.apache.rocketmq.client.producer.TransactionMQProducer;
import org.apache.rocketmq.client.producer.TransactionSendResult;
import org.apache.rocketmq.client.utils.MessageUtil;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

import static dev.runnel.javapeer.Driver.cpuNanos;
import static dev.runnel.javapeer.Driver.emit;
import static dev.runnel.javapeer.Driver.obj;
import static dev.runnel.javapeer.Driver.usage;

import dev.runnel.javapeer.Driver.Args;

// Consumers are the driver's consumer commands: push, litepull.
final class Consumers {
    private Consumers() {}

    // ---- push consumer ----------------------------------------------------

    // push --topic T --group G [--mode concurrent|orderly]
    //   [--model clustering|broadcasting] [--count N] [--timeout-ms D]
    //   [--expr TAGEXPR | --sql SQL92] [--fail-times K] [--max-reconsume M]
    //   [--from first|last] [--batch B] [--quiet true]
    // Prints a "recv" event per delivery (redeliveries included) and exits
    // once N distinct messages (by msgId) were consumed successfully, or
    // after --timeout-ms with a "timeout" event. --fail-times makes the
    // listener fail each message's first K deliveries (RECONSUME_LATER or
    // SUSPEND_CURRENT_QUEUE_A_MOMENT).
    public static void push(Args a) throws Exception {
        String topic = a.req("topic");
        int count = a.num("count", 1);
        int failTimes = a.num("fail-times", 0);
        boolean quiet = a.bool("quiet");
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a.req("group"));
        c.setNamesrvAddr(a.req("namesrv"));
        c.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        setMessageModel(c, "broadcasting".equals(a.get("model", "clustering")) ? "BROADCASTING" : "CLUSTERING");
        c.setConsumeFromWhere("last".equals(a.get("from", "first")) ? ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET : ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.setConsumeMessageBatchMaxSize(a.num("batch", 1));
        if (a.has("max-reconsume")) c.setMaxReconsumeTimes(a.num("max-reconsume", 16));
        if (a.has("suspend-ms")) c.setSuspendCurrentQueueTimeMillis(a.num("suspend-ms", 1000));
        if (a.has("sql")) {
            c.subscribe(topic, MessageSelector.bySql(a.get("sql", "")));
        } else {
            c.subscribe(topic, a.get("expr", "*"));
        }
        Map<String, Integer> deliveries = new ConcurrentHashMap<>();
        Map<String, Boolean> done = new ConcurrentHashMap<>();
        CountDownLatch finished = new CountDownLatch(count);
        AtomicLong received = new AtomicLong();
        if ("orderly".equals(a.get("mode", "concurrent"))) {
            c.registerMessageListener((MessageListenerOrderly) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    if (!consumeOne(m, deliveries, failTimes, quiet, received)) {
                        return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
                    }
                }
                for (MessageExt m : msgs) markDone(m, done, finished);
                return ConsumeOrderlyStatus.SUCCESS;
            });
        } else {
            c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                for (MessageExt m : msgs) {
                    if (!consumeOne(m, deliveries, failTimes, quiet, received)) {
                        return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                    }
                }
                for (MessageExt m : msgs) markDone(m, done, finished);
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
        }
        long cpu0 = cpuNanos(), t0 = System.nanoTime();
        c.start();
        emit(obj("ev", "started"));
        boolean ok = finished.await(a.num("timeout-ms", 60000), TimeUnit.MILLISECONDS);
        long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
        if (!ok) emit(obj("ev", "timeout", "consumed", done.size(), "want", count));
        emit(obj("ev", "done", "consumed", done.size(), "received", received.get(), "ns", wall, "cpu_ns", cpu));
        c.shutdown();
    }

    // setMessageModel sets the push consumer's model by name: the enum moved
    // from org.apache.rocketmq.common.protocol.heartbeat (4.9) to
    // org.apache.rocketmq.remoting.protocol.heartbeat (5.x).
    @SuppressWarnings({"unchecked", "rawtypes"})
    static void setMessageModel(DefaultMQPushConsumer c, String model) throws Exception {
        for (java.lang.reflect.Method mt : DefaultMQPushConsumer.class.getMethods()) {
            if (mt.getName().equals("setMessageModel")) {
                Class t = mt.getParameterTypes()[0];
                mt.invoke(c, Enum.valueOf(t, model));
                return;
            }
        }
        throw new IllegalStateException("no setMessageModel");
    }

    static boolean consumeOne(MessageExt m, Map<String, Integer> deliveries, int failTimes, boolean quiet, AtomicLong received) {
        received.incrementAndGet();
        String key = m.getProperty("UNIQ_KEY") != null ? m.getProperty("UNIQ_KEY") : m.getMsgId();
        int n = deliveries.merge(key, 1, Integer::sum);
        boolean ok = n > failTimes;
        if (!quiet) {
            Map<String, Object> ev = recvEvent(m);
            ev.put("delivery", n);
            ev.put("ok", ok);
            emit(ev);
        }
        return ok;
    }

    static void markDone(MessageExt m, Map<String, Boolean> done, CountDownLatch finished) {
        String key = m.getProperty("UNIQ_KEY") != null ? m.getProperty("UNIQ_KEY") : m.getMsgId();
        if (done.putIfAbsent(key, Boolean.TRUE) == null) finished.countDown();
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
    //   [--from first|last]
    // Polls until N messages arrived (printing "recv" events), then commits
    // as --commit says (commitSync; auto commits on the client's own
    // schedule; none leaves offsets alone) and prints "done" with the
    // committed offsets of the assigned queues.
    public static void litepull(Args a) throws Exception {
        String topic = a.req("topic");
        int count = a.num("count", 1);
        DefaultLitePullConsumer c = new DefaultLitePullConsumer(a.req("group"));
        c.setNamesrvAddr(a.req("namesrv"));
        c.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        String commit = a.get("commit", "sync");
        c.setAutoCommit("auto".equals(commit));
        c.setConsumeFromWhere("last".equals(a.get("from", "first")) ? ConsumeFromWhere.CONSUME_FROM_LAST_OFFSET : ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        boolean assign = "assign".equals(a.get("mode", "subscribe"));
        if (!assign) c.subscribe(topic, a.get("expr", "*"));
        c.start();
        Collection<MessageQueue> queues;
        if (assign) {
            queues = c.fetchMessageQueues(topic);
            c.assign(queues);
            if (a.has("seek")) {
                for (String s : a.get("seek", "").split(",")) {
                    String[] qo = s.split(":");
                    for (MessageQueue q : queues) {
                        if (q.getQueueId() == Integer.parseInt(qo[0])) c.seek(q, Long.parseLong(qo[1]));
                    }
                }
            }
        } else {
            queues = c.fetchMessageQueues(topic);
        }
        long deadline = System.currentTimeMillis() + a.num("timeout-ms", 60000);
        int got = 0;
        while (got < count && System.currentTimeMillis() < deadline) {
            for (MessageExt m : c.poll(500)) {
                got++;
                emit(recvEvent(m));
            }
        }
        if (got < count) emit(obj("ev", "timeout", "consumed", got, "want", count));
        if ("sync".equals(commit)) c.commitSync();
        Map<String, Object> committed = new LinkedHashMap<>();
        for (MessageQueue q : queues) committed.put(Integer.toString(q.getQueueId()), c.committed(q));
        emit(obj("ev", "done", "consumed", got, "committed", committed));
        c.shutdown();
    }

}
