package dev.runnel.javapeer;

import java.lang.management.ManagementFactory;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
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
import org.apache.rocketmq.common.message.MessageClientExt;
import org.apache.rocketmq.common.message.MessageClientIDSetter;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageId;
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

    // produce --topic T --mode sync|async|oneway|batch|ordered[,mode...] --count N
    //   [--group G] [--size B] [--tag T] [--keys PREFIX] [--inflight W]
    //   [--batch B] [--shards K] [--delay-level L] [--deliver-after-ms D]
    //   [--prop k=v,...] [--retries N] [--quiet true] [--view true]
//   [--level L] [--delay-topic T2]
    // Bodies are "<topic>-<i>" padded with '.' to --size. Several modes run
    // one after the other in the same producer, N messages each, numbered
    // on (mode k sends i = k*N … k*N+N-1); every event names its mode. Mode
    // delay sends synchronously with delay level --level (default 2) to
    // --delay-topic (default --topic).
    // "sent" events carry the SendResult, the wall-clock window of the send
    // (t0, t1: ms) and the offset message ids as Java decodes them
    // (MessageDecoder.decodeMessageId: "decoded" [{addr, off}]). --view
    // then reads every sent message back by its offset id
    // (DefaultMQProducer.viewMessage, VIEW_MESSAGE_BY_ID) and prints it as
    // Java decoded it ("stored" events). --quiet prints only the summary
    // ({"ev":"done","sent":n,"ns":wall,"cpu_ns":cpu}).
    public static void produce(Args a) throws Exception {
        String topic = a.req("topic");
        String[] modes = a.get("mode", "sync").split(",");
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
        List<String> offsetIds = Collections.synchronizedList(new ArrayList<>());
        try {
            for (int k = 0; k < modes.length; k++) {
                produceMode(a, p, topic, modes[k], k * count, count, quiet, sent, offsetIds);
            }
            if (a.bool("view")) {
                for (String id : new ArrayList<>(offsetIds)) {
                    emit(stored(p.viewMessage(topic, id)));
                }
            }
        } finally {
            long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
            emit(obj("ev", "done", "sent", sent.get(), "ns", wall, "cpu_ns", cpu));
            p.shutdown();
        }
    }

    static void produceMode(Args a, DefaultMQProducer p, String topic, String mode, int first, int count,
            boolean quiet, AtomicInteger sent, List<String> offsetIds) throws Exception {
        int end = first + count;
        switch (mode) {
            case "sync":
                for (int i = first; i < end; i++) {
                    long t0 = System.currentTimeMillis();
                    SendResult r = p.send(message(a, topic, i));
                    long t1 = System.currentTimeMillis();
                    sent.incrementAndGet();
                    if (!quiet) emit(sendEvent(mode, i, r, t0, t1, offsetIds));
                }
                break;
            case "delay": {
                // sync sends with delay level --level (default 2: 5 s) to
                // --delay-topic (default the topic)
                String dt = a.get("delay-topic", topic);
                for (int i = first; i < end; i++) {
                    Message m = message(a, dt, i);
                    m.setDelayTimeLevel(a.num("level", 2));
                    long t0 = System.currentTimeMillis();
                    SendResult r = p.send(m);
                    long t1 = System.currentTimeMillis();
                    sent.incrementAndGet();
                    if (!quiet) emit(sendEvent(mode, i, r, t0, t1, offsetIds));
                }
                break;
            }
            case "oneway":
                for (int i = first; i < end; i++) {
                    long t0 = System.currentTimeMillis();
                    p.sendOneway(message(a, topic, i));
                    sent.incrementAndGet();
                    if (!quiet) emit(obj("ev", "sent", "mode", mode, "i", i, "t0", t0, "t1", System.currentTimeMillis()));
                }
                break;
            case "async": {
                Semaphore window = new Semaphore(a.num("inflight", 64));
                CountDownLatch all = new CountDownLatch(count);
                AtomicLong failed = new AtomicLong();
                AtomicInteger inflight = new AtomicInteger(), maxInflight = new AtomicInteger();
                for (int i = first; i < end; i++) {
                    final int n = i;
                    window.acquire();
                    final long t0 = System.currentTimeMillis();
                    maxInflight.accumulateAndGet(inflight.incrementAndGet(), Math::max);
                    p.send(message(a, topic, i), new SendCallback() {
                        @Override public void onSuccess(SendResult r) {
                            inflight.decrementAndGet();
                            sent.incrementAndGet();
                            if (!quiet) emit(sendEvent(mode, n, r, t0, System.currentTimeMillis(), offsetIds));
                            window.release();
                            all.countDown();
                        }
                        @Override public void onException(Throwable e) {
                            inflight.decrementAndGet();
                            failed.incrementAndGet();
                            emit(obj("ev", "send-error", "mode", mode, "i", n, "error", e.toString()));
                            window.release();
                            all.countDown();
                        }
                    });
                }
                if (!all.await(120, TimeUnit.SECONDS)) throw new IllegalStateException("async sends did not finish in 120 s");
                emit(obj("ev", "async-done", "mode", mode, "max_inflight", maxInflight.get(), "failed", failed.get()));
                if (failed.get() > 0) throw new IllegalStateException(failed.get() + " async sends failed");
                break;
            }
            case "batch": {
                int size = a.num("batch", 16);
                for (int i = first; i < end; i += size) {
                    List<Message> batch = new ArrayList<>();
                    for (int j = i; j < Math.min(end, i + size); j++) batch.add(message(a, topic, j));
                    long t0 = System.currentTimeMillis();
                    SendResult r = p.send(batch);
                    long t1 = System.currentTimeMillis();
                    sent.addAndGet(batch.size());
                    if (!quiet) {
                        Map<String, Object> ev = sendEvent(mode, i, r, t0, t1, offsetIds);
                        ev.put("n", batch.size());
                        emit(ev);
                    }
                }
                break;
            }
            case "ordered": {
                int shards = a.num("shards", 4);
                for (int i = first; i < end; i++) {
                    Message m = message(a, topic, i);
                    int shard = i % shards;
                    m.setKeys("shard-" + shard);
                    long t0 = System.currentTimeMillis();
                    SendResult r = p.send(m, (mqs, msg, arg) -> mqs.get((Integer) arg % mqs.size()), shard);
                    long t1 = System.currentTimeMillis();
                    sent.incrementAndGet();
                    if (!quiet) {
                        Map<String, Object> ev = sendEvent(mode, i, r, t0, t1, offsetIds);
                        ev.put("shard", shard);
                        emit(ev);
                    }
                }
                break;
            }
            default: usage("unknown produce mode " + mode);
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

    // sendEvent with the mode, the send's window and Java's decoding of the
    // ids; it records the offset ids in offsetIds (for --view).
    static Map<String, Object> sendEvent(String mode, int i, SendResult r, long t0, long t1, List<String> offsetIds) {
        Map<String, Object> ev = sendEvent(i, r);
        ev.put("mode", mode);
        ev.put("t0", t0);
        ev.put("t1", t1);
        ev.put("region", r.getRegionId());
        List<Object> decoded = new ArrayList<>();
        if (r.getOffsetMsgId() != null) {
            for (String id : r.getOffsetMsgId().split(",")) {
                offsetIds.add(id);
                try {
                    MessageId d = MessageDecoder.decodeMessageId(id);
                    decoded.add(obj("addr", addr(d.getAddress()), "off", d.getOffset()));
                } catch (Exception e) {
                    decoded.add(obj("error", e.toString()));
                }
            }
        }
        ev.put("decoded", decoded);
        if (r.getMsgId() != null) {
            String first = r.getMsgId().split(",")[0];
            ev.put("id_ip", MessageClientIDSetter.getIPStrFromID(first));
            ev.put("id_pid", MessageClientIDSetter.getPidFromID(first));
        }
        return ev;
    }

    static String addr(java.net.SocketAddress a) {
        if (a instanceof InetSocketAddress) {
            InetSocketAddress s = (InetSocketAddress) a;
            return s.getAddress().getHostAddress() + ":" + s.getPort();
        }
        return String.valueOf(a);
    }

    // stored is a message as Java's client decoded it from the broker.
    static Map<String, Object> stored(MessageExt m) {
        Map<String, Object> ev = obj("ev", "stored", "topic", m.getTopic(), "q", m.getQueueId(), "qoff", m.getQueueOffset(),
            "commit_off", m.getCommitLogOffset(), "size", m.getStoreSize(), "sysflag", m.getSysFlag(),
            "born_ts", m.getBornTimestamp(), "born_host", addr(m.getBornHost()),
            "store_ts", m.getStoreTimestamp(), "store_host", addr(m.getStoreHost()),
            "reconsume", m.getReconsumeTimes(), "prepared_off", m.getPreparedTransactionOffset(),
            "body_crc", m.getBodyCRC(), "flag", m.getFlag(), "id", m.getMsgId(),
            "tags", m.getTags(), "keys", m.getKeys(),
            "body", m.getBody() == null ? null : new String(m.getBody(), StandardCharsets.UTF_8),
            "props", new LinkedHashMap<String, Object>(m.getProperties()));
        if (m instanceof MessageClientExt) ev.put("offset_id", ((MessageClientExt) m).getOffsetMsgId());
        return ev;
    }

    // ---- transactions -----------------------------------------------------

    // tx --topic T --count N --local commit|rollback|unknown[,...]
    //   [--check commit|rollback|unknown[,...]] [--linger-ms D]
    //   [--want-checks C] [--until-resolved true] [--group G]
    // Sends N transactional messages; executeLocalTransaction answers message
    // i with --local's entry i % len, checkLocalTransaction with --check's
    // entry i % len, where an entry may be a sequence ("unknown>commit":
    // the first check-back of the message answers unknown, later ones
    // commit). Each check-back prints a "check" event with the message as
    // Java decoded it from the broker's CHECK_TRANSACTION_STATE. Lingers up
    // to --linger-ms afterwards to answer check-backs, or until
    // --want-checks have been answered, or with --until-resolved true until
    // every message whose local answer was unknown got a commit or rollback
    // answer from a check-back.
    public static void tx(Args a) throws Exception {
        String topic = a.req("topic");
        int count = a.num("count", 1);
        String[] local = a.get("local", "commit").split(",");
        String[] check = a.get("check", "commit").split(",");
        for (String s : local) state(s);
        for (String s : check) for (String t : s.split(">")) state(t);
        TransactionMQProducer p = new TransactionMQProducer(a.get("group", "javapeer_tx"));
        p.setNamesrvAddr(a.req("namesrv"));
        p.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        AtomicInteger checks = new AtomicInteger();
        Map<String, AtomicInteger> checksOf = new ConcurrentHashMap<>();
        Set<String> resolved = ConcurrentHashMap.newKeySet();
        AtomicInteger unknowns = new AtomicInteger();
        p.setTransactionListener(new TransactionListener() {
            @Override public LocalTransactionState executeLocalTransaction(Message msg, Object arg) {
                return state(local[Integer.parseInt(msg.getUserProperty("javapeer_i")) % local.length]);
            }
            @Override public LocalTransactionState checkLocalTransaction(MessageExt msg) {
                String is = msg.getUserProperty("javapeer_i");
                int i = is == null ? 0 : Integer.parseInt(is);
                String[] seq = check[i % check.length].split(">");
                int n = checksOf.computeIfAbsent(msg.getTransactionId() + "", k -> new AtomicInteger()).incrementAndGet();
                LocalTransactionState answer = state(seq[Math.min(n, seq.length) - 1]);
                checks.incrementAndGet();
                if (answer != LocalTransactionState.UNKNOW) resolved.add(msg.getTransactionId() + "");
                Map<String, Object> ev = stored(msg);
                ev.put("ev", "check");
                ev.put("i", is);
                ev.put("n", n);
                ev.put("tx", msg.getTransactionId());
                ev.put("answer", answer.name());
                emit(ev);
                return answer;
            }
        });
        p.start();
        try {
            for (int i = 0; i < count; i++) {
                long t0 = System.currentTimeMillis();
                if (state(local[i % local.length]) == LocalTransactionState.UNKNOW) unknowns.incrementAndGet();
                TransactionSendResult r = p.sendMessageInTransaction(message(a, topic, i), null);
                Map<String, Object> ev = sendEvent("tx", i, r, t0, System.currentTimeMillis(), new ArrayList<>());
                ev.put("local", r.getLocalTransactionState().name());
                ev.put("tx", r.getTransactionId());
                emit(ev);
            }
            long linger = a.num("linger-ms", 0);
            int wantChecks = a.num("want-checks", 0);
            boolean untilResolved = a.bool("until-resolved");
            long deadline = System.currentTimeMillis() + linger;
            while (System.currentTimeMillis() < deadline) {
                if (untilResolved ? resolved.size() >= unknowns.get() : wantChecks > 0 && checks.get() >= wantChecks) break;
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

    // request --topic T --count N [--timeout-ms D] [--api sync|callback]:
    // producer.request(), printing each reply's body and properties, with
    // the requester's client id ("client"). --api callback uses
    // request(msg, RequestCallback, timeout) instead of the blocking call:
    // the blocking request() of 5.3.0–5.3.3 returns as soon as the request
    // is sent (its send callback counts the reply latch down; fixed upstream
    // by apache/rocketmq#9608), and the callback form of those versions
    // first calls onSuccess(null) when the request is sent, then
    // onSuccess(reply); the null is reported as a "reply-null" event and
    // the reply waited for.
    public static void request(Args a) throws Exception {
        String topic = a.req("topic");
        boolean callback = a.get("api", "sync").equals("callback");
        long timeout = a.num("timeout-ms", 10000);
        DefaultMQProducer p = new DefaultMQProducer(a.get("group", "javapeer_requester"));
        p.setNamesrvAddr(a.req("namesrv"));
        p.setInstanceName(a.get("instance", "javapeer-" + ProcessHandle.current().pid()));
        p.start();
        try {
            for (int i = 0; i < a.num("count", 1); i++) {
                Message reply;
                long t0 = System.currentTimeMillis();
                if (callback) {
                    java.util.concurrent.CompletableFuture<Message> f = new java.util.concurrent.CompletableFuture<>();
                    final int n = i;
                    p.request(message(a, topic, i), new org.apache.rocketmq.client.producer.RequestCallback() {
                        @Override public void onSuccess(Message m) {
                            if (m == null) emit(obj("ev", "reply-null", "i", n));
                            else f.complete(m);
                        }
                        @Override public void onException(Throwable e) { f.completeExceptionally(e); }
                    }, timeout);
                    reply = f.get(timeout + 5000, TimeUnit.MILLISECONDS);
                } else {
                    reply = p.request(message(a, topic, i), timeout);
                }
                Map<String, Object> ev = obj("ev", "reply", "i", i, "topic", reply.getTopic(), "t0", t0, "t1", System.currentTimeMillis(),
                    "body", new String(reply.getBody(), StandardCharsets.UTF_8),
                    "client", p.getDefaultMQProducerImpl().getMqClientFactory().getClientId(),
                    "props", new LinkedHashMap<String, Object>(reply.getProperties()));
                if (reply instanceof MessageExt) {
                    // the fields of PUSH_REPLY_MESSAGE_TO_CLIENT's header
                    MessageExt m = (MessageExt) reply;
                    ev.put("q", m.getQueueId());
                    ev.put("born_ts", m.getBornTimestamp());
                    ev.put("store_ts", m.getStoreTimestamp());
                    ev.put("born_host", m.getBornHost() == null ? null : addr(m.getBornHost()));
                    ev.put("store_host", m.getStoreHost() == null ? null : addr(m.getStoreHost()));
                    ev.put("flag", m.getFlag());
                }
                emit(ev);
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
