package dev.runnel.javapeer;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.net.Socket;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendCallback;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.client.producer.SendStatus;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;

import static dev.runnel.javapeer.Driver.cpuNanos;
import static dev.runnel.javapeer.Driver.obj;

import dev.runnel.javapeer.Driver.Args;

// Bench is the driver's benchmark command: one long-lived JVM that runs
// the official Java client's loads on request, so that JVM start-up, client
// start-up and JIT warm-up stay outside every measured window.
//
//   bench --namesrv NS --control HOST:PORT
//
// It connects to the control address (a Go benchmark listens there) and
// reads one request per line, "op key=value ...", answering each with one
// JSON line: {"ev":"done", ...} or {"ev":"error","error":...}. Requests name
// their own name server (ns=), so one JVM serves several clusters; clients
// are created on first use per name server (and topic, for latency) and
// kept until "quit" or the end of the control connection.
//
//   produce ns= topic= size= count= inflight= [ms=]   async sends of count
//       messages of size bytes (count=0: for ms milliseconds), at most
//       inflight outstanding (retries off). Answers sent, failed, ns (wall
//       time), cpu_ns (this JVM's CPU time) of exactly those sends.
//   pull ns= topic= count= wrap= [ms=]   DefaultMQPullConsumer.pull loop on
//       queue 0 (32 per pull) from a cursor kept per topic, wrapping to 0 at
//       wrap, until count messages were read (count=0: for ms
//       milliseconds). Answers got, ns, cpu_ns.
//   latency ns= topic= count=   one message at a time (sync send, 128 B,
//       its sequence and send time in the body) to a push consumer of the
//       same JVM (long polling); the next is sent once the previous one
//       arrived. Answers n, p50_ns, p99_ns, ns, cpu_ns.
//   quit
final class Bench {
    private Bench() {}

    public static void bench(Args a) throws Exception {
        String[] hp = a.req("control").split(":");
        Bench.Session ss = new Bench.Session();
        try (Socket s = new Socket(hp[0], Integer.parseInt(hp[1]))) {
            s.setTcpNoDelay(true);
            BufferedReader in = new BufferedReader(new InputStreamReader(s.getInputStream(), StandardCharsets.UTF_8));
            Writer out = new OutputStreamWriter(s.getOutputStream(), StandardCharsets.UTF_8);
            for (String line; (line = in.readLine()) != null; ) {
                Map<String, String> req = parse(line);
                String op = req.getOrDefault("op", "");
                Map<String, Object> res;
                try {
                    res = ss.run(op, req);
                } catch (Exception e) {
                    e.printStackTrace(System.err);
                    res = obj("ev", "error", "error", e.toString());
                }
                StringBuilder b = new StringBuilder();
                Driver.json(b, res);
                out.write(b.append('\n').toString());
                out.flush();
                if (op.equals("quit")) break;
            }
        } finally {
            ss.close();
        }
    }

    static Map<String, String> parse(String line) {
        Map<String, String> m = new HashMap<>();
        String[] f = line.trim().split(" +");
        m.put("op", f[0]);
        for (int i = 1; i < f.length; i++) {
            int eq = f[i].indexOf('=');
            if (eq > 0) m.put(f[i].substring(0, eq), f[i].substring(eq + 1));
        }
        return m;
    }

    static String req(Map<String, String> m, String k) {
        String v = m.get(k);
        if (v == null) throw new IllegalArgumentException("bench request lacks " + k + "=");
        return v;
    }

    static int num(Map<String, String> m, String k) { return Integer.parseInt(req(m, k)); }

    // Latency is one topic's latency rig: a producer and a push consumer.
    static final class Latency {
        DefaultMQProducer producer;
        DefaultMQPushConsumer consumer;
        String topic;
        // (sequence, latency ns) pairs as the consumer saw them
        final BlockingQueue<long[]> arrived = new LinkedBlockingQueue<>();
        long seq;
    }

    static final class Session {
        final Map<String, DefaultMQProducer> producers = new HashMap<>();
        final Map<String, DefaultMQPullConsumer> pullers = new HashMap<>();
        final Map<String, MessageQueue> queues = new HashMap<>();
        final Map<String, Long> cursors = new HashMap<>();
        final Map<String, Latency> latency = new HashMap<>();
        final AtomicInteger seq = new AtomicInteger();

        // instance names the JVM's clients per name server: the Java client
        // shares one MQClientInstance (and its name server list) per
        // instance name.
        String instance(String ns) { return "bench-" + ProcessHandle.current().pid() + "-" + ns.replace(':', '_'); }

        Map<String, Object> run(String op, Map<String, String> r) throws Exception {
            switch (op) {
                case "produce": return produce(r);
                case "pull": return pull(r);
                case "latency": return latency(r);
                case "quit": return obj("ev", "done");
                default: throw new IllegalArgumentException("unknown bench op " + op);
            }
        }

        DefaultMQProducer producer(String ns) throws Exception {
            DefaultMQProducer p = producers.get(ns);
            if (p == null) {
                p = new DefaultMQProducer("bench_producer_" + seq.incrementAndGet());
                p.setNamesrvAddr(ns);
                p.setInstanceName(instance(ns));
                p.setRetryTimesWhenSendFailed(0);
                p.setRetryTimesWhenSendAsyncFailed(0);
                p.setSendMsgTimeout(30000);
                p.start();
                producers.put(ns, p);
            }
            return p;
        }

        Map<String, Object> produce(Map<String, String> r) throws Exception {
            DefaultMQProducer p = producer(req(r, "ns"));
            String topic = req(r, "topic");
            int count = num(r, "count"), inflight = num(r, "inflight");
            long until = until(r);
            byte[] body = new byte[num(r, "size")];
            Arrays.fill(body, (byte) 'a');
            Semaphore window = new Semaphore(inflight);
            AtomicLong failed = new AtomicLong();
            AtomicReference<String> firstErr = new AtomicReference<>();
            SendCallback cb = new SendCallback() {
                @Override public void onSuccess(SendResult res) {
                    if (res.getSendStatus() != SendStatus.SEND_OK) {
                        failed.incrementAndGet();
                        firstErr.compareAndSet(null, res.getSendStatus().name());
                    }
                    window.release();
                }
                @Override public void onException(Throwable e) {
                    failed.incrementAndGet();
                    firstErr.compareAndSet(null, e.toString());
                    window.release();
                }
            };
            long cpu0 = cpuNanos(), t0 = System.nanoTime();
            long sent = 0;
            for (; count > 0 ? sent < count : System.nanoTime() < until; sent++) {
                window.acquire();
                try {
                    p.send(new Message(topic, body), cb);
                } catch (Exception e) {
                    cb.onException(e);
                }
            }
            // every send has completed once the whole window is free again
            if (!window.tryAcquire(inflight, 300, TimeUnit.SECONDS)) throw new IllegalStateException("async sends did not finish in 300 s");
            long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
            return obj("ev", "done", "sent", sent - failed.get(), "failed", failed.get(), "first_error", firstErr.get(),
                "ns", wall, "cpu_ns", cpu);
        }

        // until is the deadline of a request with ms= (count=0: run for ms
        // milliseconds instead of a count).
        static long until(Map<String, String> r) {
            return System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(Long.parseLong(r.getOrDefault("ms", "0")));
        }

        Map<String, Object> pull(Map<String, String> r) throws Exception {
            String ns = req(r, "ns"), topic = req(r, "topic");
            int count = num(r, "count"), wrap = num(r, "wrap");
            DefaultMQPullConsumer c = pullers.get(ns);
            if (c == null) {
                c = new DefaultMQPullConsumer("bench_pull_" + seq.incrementAndGet());
                c.setNamesrvAddr(ns);
                c.setInstanceName(instance(ns));
                c.start();
                pullers.put(ns, c);
            }
            String key = ns + "/" + topic;
            MessageQueue mq = queues.get(key);
            if (mq == null) {
                for (MessageQueue q : c.fetchSubscribeMessageQueues(topic)) {
                    if (q.getQueueId() == 0) mq = q;
                }
                if (mq == null) throw new IllegalStateException("no queue 0 of " + topic);
                queues.put(key, mq);
            }
            long off = cursors.getOrDefault(key, 0L);
            long until = until(r);
            long cpu0 = cpuNanos(), t0 = System.nanoTime();
            int got = 0;
            while (count > 0 ? got < count : System.nanoTime() < until) {
                PullResult res = c.pull(mq, "*", off, 32);
                if (res.getPullStatus() != PullStatus.FOUND) {
                    throw new IllegalStateException("pull " + topic + " @" + off + ": " + res.getPullStatus());
                }
                int n = res.getMsgFoundList().size();
                got += n;
                off += n;
                if (off >= wrap) off = 0;
            }
            long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
            cursors.put(key, off);
            return obj("ev", "done", "got", got, "ns", wall, "cpu_ns", cpu);
        }

        Map<String, Object> latency(Map<String, String> r) throws Exception {
            String ns = req(r, "ns"), topic = req(r, "topic");
            int count = num(r, "count");
            String key = ns + "/" + topic;
            Latency l = latency.get(key);
            if (l == null) {
                l = startLatency(ns, topic);
                latency.put(key, l);
            }
            long[] lat = new long[count];
            long cpu0 = cpuNanos(), t0 = System.nanoTime();
            for (int i = 0; i < count; i++) {
                lat[i] = roundTrip(l, 10000);
                if (lat[i] < 0) throw new IllegalStateException("message " + l.seq + " not delivered in 10 s");
            }
            long wall = System.nanoTime() - t0, cpu = cpuNanos() - cpu0;
            Arrays.sort(lat);
            return obj("ev", "done", "n", count, "p50_ns", count == 0 ? 0 : lat[Math.min(count - 1, (int) (0.50 * count))],
                "p99_ns", count == 0 ? 0 : lat[Math.min(count - 1, (int) (0.99 * count))], "ns", wall, "cpu_ns", cpu);
        }

        // startLatency starts a topic's rig and returns once a message has
        // gone round (the consumer's queues are assigned and its pull parked).
        Latency startLatency(String ns, String topic) throws Exception {
            Latency l = new Latency();
            l.topic = topic;
            int k = seq.incrementAndGet();
            l.producer = new DefaultMQProducer("bench_lat_producer_" + k);
            l.producer.setNamesrvAddr(ns);
            l.producer.setInstanceName(instance(ns) + "-lat" + k);
            l.producer.start();
            l.consumer = new DefaultMQPushConsumer("bench_lat_" + k);
            l.consumer.setNamesrvAddr(ns);
            l.consumer.setInstanceName(instance(ns) + "-lat" + k);
            l.consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
            l.consumer.subscribe(topic, "*");
            final Latency rig = l;
            l.consumer.registerMessageListener((MessageListenerConcurrently) (msgs, ctx) -> {
                long now = System.nanoTime();
                for (MessageExt m : msgs) {
                    ByteBuffer b = ByteBuffer.wrap(m.getBody());
                    long s = b.getLong(), sent = b.getLong();
                    rig.arrived.offer(new long[] {s, now - sent});
                }
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            });
            l.consumer.start();
            long deadline = System.currentTimeMillis() + 120000;
            while (roundTrip(l, 1000) < 0) {
                if (System.currentTimeMillis() > deadline) throw new IllegalStateException("latency rig of " + topic + ": nothing delivered in 120 s");
            }
            return l;
        }

        // roundTrip sends the rig's next message and waits up to timeoutMs
        // for it (skipping earlier ones that arrive late); -1 on a timeout.
        long roundTrip(Latency l, long timeoutMs) throws Exception {
            long s = ++l.seq;
            byte[] body = new byte[128];
            ByteBuffer.wrap(body).putLong(s).putLong(System.nanoTime());
            SendResult res = l.producer.send(new Message(l.topic, body));
            if (res.getSendStatus() != SendStatus.SEND_OK) throw new IllegalStateException("latency send: " + res.getSendStatus());
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
            for (;;) {
                long left = deadline - System.nanoTime();
                long[] got = left > 0 ? l.arrived.poll(left, TimeUnit.NANOSECONDS) : null;
                if (got == null) return -1;
                if (got[0] == s) return got[1];
            }
        }

        void close() {
            for (Latency l : latency.values()) {
                l.consumer.shutdown();
                l.producer.shutdown();
            }
            for (DefaultMQPullConsumer c : pullers.values()) c.shutdown();
            for (DefaultMQProducer p : producers.values()) p.shutdown();
        }
    }
}
