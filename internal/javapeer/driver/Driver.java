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
// Commands live in Producers.java, Consumers.java and the other classes
// named in COMMANDS: a public static void <command>(Args) method each.
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

    // COMMANDS name the classes (of this package) whose public static void
    // <command>(Args) methods are the driver's commands; a class that is not
    // there is skipped, so a new file of commands needs only its name here.
    static final String[] COMMANDS = {"Producers", "Consumers", "Bench", "Admin"};

    public static void main(String[] argv) {
        if (argv.length < 1) {
            usage("no command");
        }
        Args a = new Args(Arrays.copyOfRange(argv, 1, argv.length));
        java.lang.reflect.Method cmd = null;
        for (String name : COMMANDS) {
            try {
                cmd = Class.forName("dev.runnel.javapeer." + name).getMethod(argv[0], Args.class);
                break;
            } catch (ClassNotFoundException | NoSuchMethodException e) {
                // not this class's command, or no such class
            }
        }
        if (cmd == null) usage("unknown command " + argv[0]);
        try {
            cmd.invoke(null, a);
        } catch (Throwable e) {
            Throwable cause = e instanceof java.lang.reflect.InvocationTargetException ? e.getCause() : e;
            emit(obj("ev", "error", "error", describe(cause)));
            cause.printStackTrace(System.err);
            System.out.flush();
            System.exit(1);
        }
        System.out.flush();
        System.exit(0);
    }

    // ---- plumbing ---------------------------------------------------------

    // describe is e and its causes, outermost first: the client's own
    // messages ("Invoke Broker[...] exception") say little without them.
    static String describe(Throwable e) {
        StringBuilder b = new StringBuilder(e.toString());
        int depth = 0;
        for (Throwable c = e.getCause(); c != null && c != e && depth < 8; c = c.getCause(), depth++) {
            b.append(" <- caused by ").append(c);
        }
        return b.toString();
    }

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
    public static final class Args {
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
