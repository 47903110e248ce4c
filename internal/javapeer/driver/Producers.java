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

// Producers are the driver's producer commands: produce, tx, request, reply.
final class Producers {
    private Producers() {}

    // ---- produce ----------------------------------------------------------

    // produce --topic T --mode sync|async|oneway|batch|ordered --count N
    //   [--group G] [--size B] [--tag T] [--keys PREFIX] [--inflight W]
    //   [--batch B] [--shards K] [--delay-level L] [--deliver-after-ms D]
    //   [--prop k=v,...] [--retries N] [--quiet true]
    // Bodies are "<topic>-<i>" padded with '.' to --size. --quiet prints only
    // the summary ({"ev":"done","sent":n,"ns":wall,"cpu_ns":cpu}).
    public static void produce(Args a) throws Exception {
        String topic = a.req("topic");
        String mode = a.get("mode", "sync");
        int count = a.num("count", 1);
        boolean quiet = a.bool("quiet");
        DefaultMQProducer p = new DefaultMQProducer(a.get("group", "javapeer_producer"));
        p.setNamesrvAddr(a.req("namesrv"));
        p.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        p.setRetryTimesWhenSendFailed(a.num("retries", 2));
        p.setRetryTimesWhenSendAsyncFailed(a.num("retries", 2));
        p.setSendMsgTimeout(a.num("timeout-ms", 5000));
        p.start();
        long cpu0 = cpuNanos(), t0 = System.nanoTime();
        AtomicInteger sent = new AtomicInteger();
        try {
            switch (mode) {
                case "sync":
                    for (int i = 0; i < count; i++) {
                        SendResult r = p.send(message(a, topic, i));
                        sent.incrementAndGet();
                        if (!quiet) emit(sendEvent(i, r));
                    }
                    break;
                case "oneway":
                    for (int i = 0; i < count; i++) {
                        p.sendOneway(message(a, topic, i));
                        sent.incrementAndGet();
                        if (!quiet) emit(obj("ev", "sent", "i", i));
                    }
                    break;
                case "async": {
                    Semaphore window = new Semaphore(a.num("inflight", 64));
                    CountDownLatch all = new CountDownLatch(count);
                    AtomicLong failed = new AtomicLong();
                    for (int i = 0; i < count; i++) {
                        final int n = i;
                        window.acquire();
                        p.send(message(a, topic, i), new SendCallback() {
                            @Override public void onSuccess(SendResult r) {
                                sent.incrementAndGet();
                                if (!quiet) emit(sendEvent(n, r));
                                window.release();
                                all.countDown();
                            }
                            @Override public void onException(Throwable e) {
                                failed.incrementAndGet();
                                emit(obj("ev", "send-error", "i", n, "error", e.toString()));
                                window.release();
                                all.countDown();
                            }
                        });
                    }
                    if (!all.await(120, TimeUnit.SECONDS)) throw new IllegalStateException("async sends did not finish in 120 s");
                    if (failed.get() > 0) throw new IllegalStateException(failed.get() + " async sends failed");
                    break;
                }
                case "batch": {
                    int size = a.num("batch", 16);
                    for (int i = 0; i < count; i += size) {
                        List<Message> batch = new ArrayList<>();
                        for (int j = i; j < Math.min(count, i + size); j++) batch.add(message(a, topic, j));
                        SendResult r = p.send(batch);
                        sent.addAndGet(batch.size());
                        if (!quiet) {
                            Map<String, Object> ev = sendEvent(i, r);
                            ev.put("n", batch.size());
                            emit(ev);
                        }
                    }
                    break;
                }
                case "ordered": {
                    int shards = a.num("shards", 4);
                    for (int i = 0; i < count; i++) {
                        Message m = message(a, topic, i);
                        int shard = i % shards;
                        m.setKeys("shard-" + shard);
                        SendResult r = p.send(m, (mqs, msg, arg) -> mqs.get((Integer) arg % mqs.size()), shard);
                        sent.incrementAndGet();
                        if (!quiet) {
                            Map<String, Object> ev = sendEvent(i, r);
                            ev.put("shard", shard);
                            emit(ev);
                        }
                    }
                    break;
                }
                default: usage("unknown produce mode " + mode);
            }
        } finally {
            long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
            emit(obj("ev", "done", "sent", sent.get(), "ns", wall, "cpu_ns", cpu));
            p.shutdown();
        }
    }

    static Message message(Args a, String topic, int i) {
        StringBuilder body = new StringBuilder(a.get("body-prefix", topic)).append('-').append(i);
        int size = a.num("size", 0);
        while (body.length() < size) body.append('.');
        Message m = new Message(topic, a.get("tag", ""), body.toString().getBytes(StandardCharsets.UTF_8));
        if (a.has("keys")) m.setKeys(a.get("keys", "") + i);
        if (a.has("delay-level")) m.setDelayTimeLevel(a.num("delay-level", 0));
        if (a.has("deliver-after-ms")) m.putUserProperty("TIMER_DELAY_MS", a.get("deliver-after-ms", "0"));
        for (Map.Entry<String, String> e : a.props().entrySet()) m.putUserProperty(e.getKey(), e.getValue());
        m.putUserProperty("javapeer_i", Integer.toString(i));
        return m;
    }

    static Map<String, Object> sendEvent(int i, SendResult r) {
        MessageQueue q = r.getMessageQueue();
        return obj("ev", "sent", "i", i, "id", r.getMsgId(), "offset_id", r.getOffsetMsgId(),
            "status", r.getSendStatus().name(), "broker", q.getBrokerName(), "q", q.getQueueId(),
            "qoff", r.getQueueOffset());
    }

    // ---- transactions -----------------------------------------------------

    // tx --topic T --count N --local commit|rollback|unknown
    //   [--check commit|rollback|unknown] [--linger-ms D] [--group G]
    // Sends N transactional messages; executeLocalTransaction answers --local
    // for each, checkLocalTransaction answers --check (and prints a "check"
    // event). Lingers --linger-ms afterwards to answer check-backs.
    public static void tx(Args a) throws Exception {
        String topic = a.req("topic");
        int count = a.num("count", 1);
        LocalTransactionState local = state(a.get("local", "commit"));
        LocalTransactionState check = state(a.get("check", "commit"));
        TransactionMQProducer p = new TransactionMQProducer(a.get("group", "javapeer_tx"));
        p.setNamesrvAddr(a.req("namesrv"));
        p.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        AtomicInteger checks = new AtomicInteger();
        p.setTransactionListener(new TransactionListener() {
            @Override public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return local;
            }
            @Override public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                checks.incrementAndGet();
                emit(obj("ev", "check", "id", msg.getMsgId(), "tx", msg.getTransactionId(),
                    "i", msg.getUserProperty("javapeer_i"), "answer", check.name()));
                return check;
            }
        });
        p.start();
        try {
            for (int i = 0; i < count; i++) {
                TransactionSendResult r = p.sendMessageInTransaction(message(a, topic, i), null);
                Map<String, Object> ev = sendEvent(i, r);
                ev.put("local", r.getLocalTransactionState().name());
                ev.put("tx", r.getTransactionId());
                emit(ev);
            }
            long linger = a.num("linger-ms", 0);
            int wantChecks = a.num("want-checks", 0);
            long deadline = System.currentTimeMillis() + linger;
            while (System.currentTimeMillis() < deadline && (wantChecks == 0 || checks.get() < wantChecks)) {
                Thread.sleep(50);
            }
            emit(obj("ev", "done", "sent", count, "checks", checks.get()));
        } finally {
            p.shutdown();
        }
    }

    static LocalTransactionState state(String s) {
        switch (s) {
            case "commit": return LocalTransactionState.COMMIT_MESSAGE;
            case "rollback": return LocalTransactionState.ROLLBACK_MESSAGE;
            case "unknown": return LocalTransactionState.UNKNOW;
            default: usage("bad transaction state " + s); return null;
        }
    }

    // ---- request / reply --------------------------------------------------

    // request --topic T --count N [--timeout-ms D]: producer.request(),
    // printing each reply's body and properties.
    public static void request(Args a) throws Exception {
        String topic = a.req("topic");
        DefaultMQProducer p = new DefaultMQProducer(a.get("group", "javapeer_requester"));
        p.setNamesrvAddr(a.req("namesrv"));
        p.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        p.start();
        try {
            for (int i = 0; i < a.num("count", 1); i++) {
                Message reply = p.request(message(a, topic, i), a.num("timeout-ms", 10000));
                emit(obj("ev", "reply", "i", i, "topic", reply.getTopic(),
                    "body", new String(reply.getBody(), StandardCharsets.UTF_8),
                    "props", new LinkedHashMap<String, Object>(reply.getProperties())));
            }
            emit(obj("ev", "done"));
        } finally {
            p.shutdown();
        }
    }

    // reply --topic T --group G [--count N] [--timeout-ms D]: a push
    // consumer that answers every request with a reply message whose body
    // is "reply:" + the request's body.
    public static void reply(Args a) throws Exception {
        String topic = a.req("topic");
        int count = a.num("count", 1);
        DefaultMQProducer p = new DefaultMQProducer(a.get("producer-group", "javapeer_replier"));
        p.setNamesrvAddr(a.req("namesrv"));
        p.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        p.start();
        DefaultMQPushConsumer c = new DefaultMQPushConsumer(a.req("group"));
        c.setNamesrvAddr(a.req("namesrv"));
        c.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        c.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        c.subscribe(topic, "*");
        CountDownLatch replied = new CountDownLatch(count);
        c.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
            for (MessageExt m : msgs) {
                try {
                    Message r = MessageUtil.createReplyMessage(m, ("reply:" + new String(m.getBody(), StandardCharsets.UTF_8)).getBytes(StandardCharsets.UTF_8));
                    SendResult sr = p.send(r);
                    emit(obj("ev", "replied", "id", m.getMsgId(), "reply_topic", r.getTopic(), "status", sr.getSendStatus().name()));
                    replied.countDown();
                } catch (Exception e) {
                    emit(obj("ev", "reply-error", "id", m.getMsgId(), "error", e.toString()));
                    return ConsumeConcurrentlyStatus.RECONSUME_LATER;
                }
            }
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        c.start();
        emit(obj("ev", "started"));
        boolean ok = replied.await(a.num("timeout-ms", 60000), TimeUnit.MILLISECONDS);
        if (!ok) emit(obj("ev", "timeout"));
        emit(obj("ev", "done"));
        c.shutdown();
        p.shutdown();
    }

}
