// Scenarios run with the RabbitMQ Java client (Debian's librabbitmq-client-java, 5.0.0) against a
// broker given by URL. Usage: java Scenarios URL SCENARIO QUEUE_PREFIX. Prints one JSON object:
// what the client saw. tests/e2e/test_java_client.py compiles this file, runs each scenario
// against Leveret and against the reference RabbitMQ, and asserts the same output on both.
//
// There is no update_secret scenario: the 5.0.0 client has no Connection.updateSecret (javap
// shows none, and the jar has no AMQP.Connection.UpdateSecret class).

import com.rabbitmq.client.AMQP;
import com.rabbitmq.client.Channel;
import com.rabbitmq.client.Command;
import com.rabbitmq.client.Connection;
import com.rabbitmq.client.ConnectionFactory;
import com.rabbitmq.client.DefaultConsumer;
import com.rabbitmq.client.Envelope;
import com.rabbitmq.client.MessageProperties;
import com.rabbitmq.client.Method;
import com.rabbitmq.client.ShutdownSignalException;
import com.rabbitmq.client.impl.AMQChannel;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.AbstractExecutorService;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.TimeUnit;

public final class Scenarios {
    private Scenarios() {}

    /** Runs each task at once in the calling thread: the connection's reader thread. */
    static final class InlineExecutor extends AbstractExecutorService {
        private volatile boolean shutdown;

        @Override public void execute(Runnable task) { task.run(); }
        @Override public void shutdown() { shutdown = true; }
        @Override public List<Runnable> shutdownNow() { shutdown = true; return new ArrayList<>(); }
        @Override public boolean isShutdown() { return shutdown; }
        @Override public boolean isTerminated() { return shutdown; }
        @Override public boolean awaitTermination(long timeout, TimeUnit unit) { return true; }
    }

    interface Scenario {
        Map<String, Object> run(ConnectionFactory factory, String prefix) throws Exception;
    }

    // Publish with confirms, consume with a prefetch, ack: the everyday path.
    static Map<String, Object> basics(ConnectionFactory factory, String prefix) throws Exception {
        try (Connection conn = factory.newConnection()) {
            Channel ch = conn.createChannel();
            String q = prefix + "-basics";
            ch.confirmSelect();
            ch.queueDeclare(q, true, false, false, null);
            for (int i = 0; i < 5; i++) {
                ch.basicPublish("", q, MessageProperties.PERSISTENT_BASIC,
                        ("m" + i).getBytes(StandardCharsets.UTF_8));
            }
            ch.waitForConfirmsOrDie(10_000);
            ch.basicQos(2);
            List<String> got = Collections.synchronizedList(new ArrayList<>());
            CountDownLatch five = new CountDownLatch(5);
            ch.basicConsume(q, false, new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String tag, Envelope envelope,
                                           AMQP.BasicProperties props, byte[] body)
                        throws IOException {
                    got.add(new String(body, StandardCharsets.UTF_8));
                    getChannel().basicAck(envelope.getDeliveryTag(), false);
                    five.countDown();
                }

                @Override
                public void handleCancel(String tag) {
                    got.add("cancelled");
                }
            });
            if (!five.await(10, TimeUnit.SECONDS)) {
                got.add("timeout");
            }
            ch.queueDelete(q);
            Thread.sleep(300);
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("received", new ArrayList<>(got));
            return out;
        }
    }

    // A second exclusive consumer from another channel of the same connection.
    static Map<String, Object> exclusiveOtherChannel(ConnectionFactory factory, String prefix)
            throws Exception {
        try (Connection conn = factory.newConnection()) {
            String q = prefix + "-excl";
            Channel ch1 = conn.createChannel();
            ch1.queueDeclare(q, false, false, false, null);
            ch1.basicConsume(q, false, "", false, true, null, new DefaultConsumer(ch1));
            Channel ch2 = conn.createChannel();
            Map<String, Object> error = null;
            try {
                ch2.basicConsume(q, false, "", false, true, null, new DefaultConsumer(ch2));
            } catch (IOException e) {
                if (!(e.getCause() instanceof ShutdownSignalException)) {
                    throw e;
                }
                error = shutdown((ShutdownSignalException) e.getCause());
            }
            Thread.sleep(300); // anything the broker sends after its answer arrives too
            ShutdownSignalException closed = ch2.getCloseReason();
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("error", error);
            out.put("channel2_closed_with", closed == null ? null : shutdown(closed));
            out.put("channel1_open", ch1.isOpen());
            out.put("channel2_open", ch2.isOpen());
            out.put("connection_open", conn.isOpen());
            if (ch1.isOpen()) {
                ch1.queueDelete(q);
            }
            return out;
        }
    }

    // The consuming channel deletes its own queue: is the consumer told (handleCancel), and
    // before or after delete-ok? Both events are recorded on the connection's reader thread, in
    // the order it reads the frames: the consumer callbacks run inline there (InlineExecutor),
    // and queue.delete goes through AMQChannel.asyncRpc with a future whose callback is attached
    // before the method is sent, so the reader thread runs it when delete-ok arrives. (With the
    // default thread pool and a blocking queueDelete, handleCancel and the return of queueDelete
    // run on two threads and race.)
    static Map<String, Object> deleteUnderConsumer(ConnectionFactory factory, String prefix)
            throws Exception {
        ExecutorService inline = new InlineExecutor();
        try (Connection conn = factory.newConnection(inline)) {
            String q = prefix + "-del";
            Channel ch = conn.createChannel();
            ch.queueDeclare(q, false, false, false, null);
            List<String> events = Collections.synchronizedList(new ArrayList<>());
            ch.basicConsume(q, false, new DefaultConsumer(ch) {
                @Override
                public void handleDelivery(String tag, Envelope envelope,
                                           AMQP.BasicProperties props, byte[] body) {
                    events.add("message");
                }

                @Override
                public void handleCancel(String tag) {
                    events.add("cancelled");
                }
            });
            CompletableFuture<Command> deleted = new CompletableFuture<>();
            CompletableFuture<Integer> count = deleted.thenApply(reply -> {
                events.add("delete-ok");
                return ((AMQP.Queue.DeleteOk) reply.getMethod()).getMessageCount();
            });
            ((AMQChannel) ch).asyncRpc(new AMQP.Queue.Delete.Builder().queue(q).build(), deleted);
            int messageCount = count.get(10, TimeUnit.SECONDS);
            Thread.sleep(300); // a cancel that comes after delete-ok arrives too
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("events", new ArrayList<>(events));
            out.put("message_count", messageCount);
            return out;
        }
    }

    static Map<String, Object> shutdown(ShutdownSignalException sse) {
        Map<String, Object> error = new LinkedHashMap<>();
        Method reason = sse.getReason();
        if (reason instanceof AMQP.Channel.Close) {
            error.put("code", ((AMQP.Channel.Close) reason).getReplyCode());
            error.put("text", ((AMQP.Channel.Close) reason).getReplyText());
        } else if (reason instanceof AMQP.Connection.Close) {
            error.put("code", ((AMQP.Connection.Close) reason).getReplyCode());
            error.put("text", ((AMQP.Connection.Close) reason).getReplyText());
        } else {
            error.put("code", null);
            error.put("text", String.valueOf(sse.getMessage()));
        }
        error.put("hard", sse.isHardError());
        return error;
    }

    // -- a minimal JSON writer (the Debian classpath has no JSON library) -----------------------

    static void json(StringBuilder sb, Object value) {
        if (value == null) {
            sb.append("null");
        } else if (value instanceof String) {
            sb.append('"');
            for (char c : ((String) value).toCharArray()) {
                if (c == '"' || c == '\\') {
                    sb.append('\\').append(c);
                } else if (c < 0x20) {
                    sb.append(String.format("\\u%04x", (int) c));
                } else {
                    sb.append(c);
                }
            }
            sb.append('"');
        } else if (value instanceof Number || value instanceof Boolean) {
            sb.append(value);
        } else if (value instanceof Map) {
            sb.append('{');
            String sep = "";
            for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                sb.append(sep);
                json(sb, String.valueOf(e.getKey()));
                sb.append(':');
                json(sb, e.getValue());
                sep = ",";
            }
            sb.append('}');
        } else if (value instanceof List) {
            sb.append('[');
            String sep = "";
            for (Object item : (List<?>) value) {
                sb.append(sep);
                json(sb, item);
                sep = ",";
            }
            sb.append(']');
        } else {
            json(sb, value.toString());
        }
    }

    static String json(Object value) {
        StringBuilder sb = new StringBuilder();
        json(sb, value);
        return sb.toString();
    }

    public static void main(String[] args) {
        String url = args[0];
        String scenario = args[1];
        String prefix = args[2];
        Map<String, Scenario> scenarios = new LinkedHashMap<>();
        scenarios.put("basics", Scenarios::basics);
        scenarios.put("exclusive_other_channel", Scenarios::exclusiveOtherChannel);
        scenarios.put("delete_under_consumer", Scenarios::deleteUnderConsumer);
        int status = 0;
        Object result;
        try {
            Scenario chosen = scenarios.get(scenario);
            if (chosen == null) {
                throw new IllegalArgumentException("unknown scenario " + scenario);
            }
            ConnectionFactory factory = new ConnectionFactory();
            factory.setUri(url);
            factory.setConnectionTimeout(10_000);
            factory.setAutomaticRecoveryEnabled(false);
            result = chosen.run(factory, prefix);
        } catch (Exception e) {
            e.printStackTrace();
            Map<String, Object> crashed = new LinkedHashMap<>();
            crashed.put("type", e.getClass().getName());
            crashed.put("message", String.valueOf(e.getMessage()));
            if (e.getCause() instanceof ShutdownSignalException) {
                crashed.put("shutdown", shutdown((ShutdownSignalException) e.getCause()));
            }
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("crashed", crashed);
            result = out;
            status = 1;
        }
        System.out.println(json(result));
        System.out.flush();
        System.exit(status);
    }
}
