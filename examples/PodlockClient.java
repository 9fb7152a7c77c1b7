// A podlock client in Java 17+ (java.net.http only, no dependencies) that holds a lock while
// its work lasts and stops the work when it loses the lock. Run it as `java PodlockClient.java`.
//
// The hold is bound to its HTTP connection (POST /v1/locks/{name}/hold): no heartbeat to send,
// and closing the connection, or the process dying, releases it at once. The stream tells the
// hold's end: a `lost` event (lease expired or revoked, key or lock deleted, the sidecar
// stopping), or the stream ending or going silent (the sidecar died, hangs or is unreachable).
//
// PODLOCK_ADDR: the sidecar (default http://127.0.0.1:4040); LOCK: the lock (report);
// STORE_URL: a fenced resource such as examples/fenced_store.py (http://127.0.0.1:8000);
// WORK_ITEMS: writes to make (10). Exit status: 0 done and released, 1 not acquired, 75 the
// lock was lost.

import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.InputStreamReader;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public class PodlockClient {
    static final HttpClient HTTP = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).build();
    /** How often the sidecar sends a keep-alive line; three missed mean it hangs. */
    static final long KEEP_ALIVE_SECONDS = 1;
    /**
     * How long the hold may wait in the queue: the sidecar answers once it is granted, so the
     * answer may take that long, and ANSWER_WITHIN more (no answer by then means the sidecar
     * hangs). A shorter limit would give up, and lose the place in the queue, while still waiting.
     */
    static final long WAIT_SECONDS = 30;
    static final Duration ANSWER_WITHIN = Duration.ofSeconds(2);

    static String env(String name, String def) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? def : v;
    }

    /** A JSON field of a flat object, as text (a JSON library would do this in a real app). */
    static String field(String json, String name) {
        Matcher m = Pattern.compile("\"" + name + "\":\"?([^\",}]*)").matcher(json);
        return m.find() ? m.group(1) : "";
    }

    /** A hold bound to its connection: close() closes the connection and so releases it. */
    static final class Hold implements AutoCloseable {
        final long token;
        private final InputStream stream;
        private final CompletableFuture<String> ended = new CompletableFuture<>();
        private volatile long lastLine = System.nanoTime();

        Hold(String addr, String lock) throws IOException, InterruptedException {
            String container = System.getenv("PODLOCK_CONTAINER");
            // Set by the injector: the hold then ends when this container restarts, and not
            // when another container of the pod does.
            String options = "{\"waitSeconds\": " + WAIT_SECONDS + ", \"keepAliveSeconds\": " + KEEP_ALIVE_SECONDS
                    + (container == null ? "" : ", \"container\": \"" + container + "\"") + "}";
            HttpRequest request = HttpRequest.newBuilder(URI.create(addr + "/v1/locks/" + lock + "/hold"))
                    .header("content-type", "application/json")
                    // The time to the answer's headers; the stream after them has its own limit.
                    .timeout(Duration.ofSeconds(WAIT_SECONDS).plus(ANSWER_WITHIN))
                    .POST(HttpRequest.BodyPublishers.ofString(options))
                    .build();
            HttpResponse<InputStream> resp = HTTP.send(request, HttpResponse.BodyHandlers.ofInputStream());
            stream = resp.body();
            BufferedReader events = new BufferedReader(new InputStreamReader(stream, StandardCharsets.UTF_8));
            if (resp.statusCode() != 200) {
                String error = events.readLine();
                stream.close();
                throw new IOException(field(error, "error") + ": " + field(error, "message"));
            }
            String[] grant = next(events);
            if (grant == null || !grant[0].equals("acquired")) {
                stream.close();
                throw new IOException("the hold's stream began without a grant");
            }
            token = Long.parseLong(field(grant[1], "fencingToken"));
            Thread watcher = new Thread(() -> ended.complete(ending(events)));
            watcher.setDaemon(true);
            watcher.start();
        }

        /** The next server-sent event as {name, data}, skipping keep-alive lines; null at the end. */
        private String[] next(BufferedReader events) throws IOException {
            String event = "", data = "";
            for (String line; (line = events.readLine()) != null; ) {
                lastLine = System.nanoTime();
                if (line.startsWith("event:")) event = line.substring(6).trim();
                else if (line.startsWith("data:")) data = line.substring(5).trim();
                else if (line.isEmpty() && !event.isEmpty()) return new String[] {event, data};
            }
            return null;
        }

        /** Why the hold ended: its last event (`lost`, or `released` by the same holder), or the stream's end. */
        private String ending(BufferedReader events) {
            try {
                String[] last = next(events);
                if (last != null) return last[0] + ": " + field(last[1], "reason");
                return "the hold's stream ended (the sidecar stopped)";
            } catch (IOException e) {
                return "the hold's stream broke (the sidecar died or is unreachable): " + e;
            }
        }

        /** Why the hold has ended, or null while it lasts (a silent stream means a hung sidecar). */
        String lost() {
            if (ended.isDone()) return ended.join();
            if (System.nanoTime() - lastLine > 3 * KEEP_ALIVE_SECONDS * 1_000_000_000L) {
                return "the hold's stream went silent (the sidecar hangs)";
            }
            return null;
        }

        @Override
        public void close() throws IOException {
            stream.close();
        }
    }

    /** One piece of work: false when the store refused the token (a newer holder wrote). */
    static boolean write(String store, long token) throws IOException, InterruptedException {
        URI uri = URI.create(store + "/increment?token=" + token + "&writer=java-example");
        HttpRequest request = HttpRequest.newBuilder(uri).POST(HttpRequest.BodyPublishers.noBody()).build();
        return HTTP.send(request, HttpResponse.BodyHandlers.discarding()).statusCode() != 409;
    }

    static void stop(String lock, String why, int done) {
        System.err.println("lost " + lock + ": " + why + "; stopped after " + done + " writes");
        System.exit(75);
    }

    public static void main(String[] args) throws Exception {
        String lock = env("LOCK", "report");
        String store = env("STORE_URL", "http://127.0.0.1:8000");
        int items = Integer.parseInt(env("WORK_ITEMS", "10"));
        Hold hold;
        try {
            hold = new Hold(env("PODLOCK_ADDR", "http://127.0.0.1:4040"), lock);
        } catch (IOException e) {
            System.err.println("could not acquire " + lock + ": " + e.getMessage());
            System.exit(1);
            return;
        }
        System.out.println("acquired " + lock + " with fencing token " + hold.token);
        for (int done = 0; done < items; done++) {
            String lost = hold.lost();
            if (lost != null) stop(lock, lost, done);
            if (!write(store, hold.token)) {
                stop(lock, "the store refused token " + hold.token + ": a newer holder wrote", done);
            }
            Thread.sleep(100); // the pace of the work
        }
        hold.close(); // closing the connection releases the hold at once
        System.out.println("released");
    }
}
