// Driver runs the official Apache RocketMQ Java client's flows on command,
// for runnel's tests (internal/javapeer compiles it against the client jars
// of the pinned version). One command per JVM:
//
//   java dev.runnel.javapeer.Driver <command> --namesrv HOST:PORT [--flag value]...
//
// It prints one JSON object per line on stdout ("ev" names the event) and
// exits 0 once the command is done, 2 on a bad command line, 1 on a failure
// (after an {"ev":"error"} line). Everything else the client logs goes to
// its own log files under user.home.
//
// It compiles against both 4.9.x and 5.x: it uses only API both have.
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

public final class Driver {
    private Driver() {}

    public static void main(String[] argv) {
        if (argv.length < 1) {
            usage("no command");
        }
        Args a = new Args(Arrays.copyOfRange(argv, 1, argv.length));
        try {
            switch (argv[0]) {
                case "produce": produce(a); break;
                case "tx": transactions(a); break;
                case "push": push(a); break;
                case "litepull": litePull(a); break;
                case "request": request(a); break;
                case "reply": reply(a); break;
                default: usage("unknown command " + argv[0]);
            }
        } catch (Throwable e) {
            emit(obj("ev", "error", "error", e.toString()));
            e.printStackTrace(System.err);
            System.out.flush();
            System.exit(1);
        }
        System.out.flush();
        System.exit(0);
    }

    // ---- produce ----------------------------------------------------------

    // produce --topic T --mode sync|async|oneway|batch|ordered --count N
    //   [--group G] [--size B] [--tag T] [--keys PREFIX] [--inflight W]
    //   [--batch B] [--shards K] [--delay-level L] [--deliver-after-ms D]
    //   [--prop k=v,...] [--retries N] [--quiet true]
    // Bodies are "<topic>-<i>" padded with '.' to --size. --quiet prints only
    // the summary ({"ev":"done","sent":n,"ns":wall,"cpu_ns":cpu}).
    static void produce(Args a) throws Exception {
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
    static void transactions(Args a) throws Exception {
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
    static void push(Args a) throws Exception {
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
    static void litePull(Args a) throws Exception {
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

    // ---- request / reply --------------------------------------------------

    // request --topic T --count N [--timeout-ms D]: producer.request(),
    // printing each reply's body and properties.
    static void request(Args a) throws Exception {
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
    static void reply(Args a) throws Exception {
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

    // ---- plumbing ---------------------------------------------------------

    static long cpuNanos() {
        java.lang.management.OperatingSystemMXBean os = ManagementFactory.getOperatingSystemMXBean();
        if (os instanceof com.sun.management.OperatingSystemMXBean) {
            return ((com.sun.management.OperatingSystemMXBean) os).getProcessCpuTime();
        }
        return -1;
    }

    static void usage(String why) {
        System.err.println("javapeer driver: " + why);
        System.exit(2);
    }

    static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i + 1 < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    // emit prints one JSON object as a line; synchronized so that lines from
    // client callback threads never interleave.
    static synchronized void emit(Map<String, Object> m) {
        StringBuilder b = new StringBuilder();
        json(b, m);
        System.out.println(b);
        System.out.flush();
    }

    @SuppressWarnings("unchecked")
    static void json(StringBuilder b, Object v) {
        if (v == null) {
            b.append("null");
        } else if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                if (!first) b.append(',');
                first = false;
                str(b, e.getKey());
                b.append(':');
                json(b, e.getValue());
            }
            b.append('}');
        } else if (v instanceof Collection) {
            b.append('[');
            boolean first = true;
            for (Object o : (Collection<Object>) v) {
                if (!first) b.append(',');
                first = false;
                json(b, o);
            }
            b.append(']');
        } else if (v instanceof Number || v instanceof Boolean) {
            b.append(v);
        } else {
            str(b, v.toString());
        }
    }

    static void str(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            switch (ch) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (ch < 0x20) b.append(String.format("\\u%04x", (int) ch));
                    else b.append(ch);
            }
        }
        b.append('"');
    }

    // Args holds --key value pairs.
    static final class Args {
        private final Map<String, String> m = new HashMap<>();

        Args(String[] argv) {
            for (int i = 0; i < argv.length; i++) {
                if (!argv[i].startsWith("--") || i + 1 >= argv.length) usage("bad argument " + argv[i]);
                m.put(argv[i].substring(2), argv[++i]);
            }
        }

        boolean has(String k) { return m.containsKey(k); }
        String get(String k, String def) { return m.getOrDefault(k, def); }
        boolean bool(String k) { return Boolean.parseBoolean(m.getOrDefault(k, "false")); }
        int num(String k, int def) { return m.containsKey(k) ? Integer.parseInt(m.get(k)) : def; }

        String req(String k) {
            String v = m.get(k);
            if (v == null) usage("--" + k + " is required");
            return v;
        }

        // props parses --prop k=v,k2=v2.
        Map<String, String> props() {
            if (!m.containsKey("prop")) return Collections.emptyMap();
            Map<String, String> out = new LinkedHashMap<>();
            for (String kv : m.get("prop").split(",")) {
                int eq = kv.indexOf('=');
                if (eq > 0) out.put(kv.substring(0, eq), kv.substring(eq + 1));
            }
            return out;
        }
    }
}
