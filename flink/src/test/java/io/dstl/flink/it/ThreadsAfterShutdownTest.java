package io.dstl.flink.it;

import org.apache.flink.api.common.JobID;
import org.junit.jupiter.api.Timeout;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * (h) A MiniCluster runs in the test JVM, as a TaskManager runs in its own: once a dstl job
 * has finished and the cluster has shut down, nothing of dstl may keep running. A non-daemon
 * Java thread would keep a TaskManager (or any embedding JVM) from exiting; a {@code dstl*}
 * thread, Java or native (the storage's tokio runtimes, the discard threads, the engine's
 * epoch ticker, which are invisible to {@link Thread#getAllStackTraces}), would mean a storage
 * or engine that was never released. Native threads are read from {@code /proc/self/task}.
 */
@Timeout(120)
class ThreadsAfterShutdownTest extends JobTest {

    @DstlOnly
    void noThreadOutlivesTheClusterOfAFinishedDstlJob() throws Exception {
        String label = "(h) threads after shutdown";
        ChangelogTestJob.Params p = params(150);
        Map<String, String> clusterConfig = changelog(TestSettings.DSTL);

        Set<Thread> before = Thread.getAllStackTraces().keySet();
        Map<Long, String> nativeBefore = nativeThreads();
        List<String> dstlNativeBefore = dstlNames(nativeBefore);
        List<String> dstlDuring;
        long start = System.nanoTime();
        try (LocalCluster cluster = LocalCluster.start(clusterConfig, 4)) {
            JobID job = cluster.submit(TestSettings.merge(clusterConfig, TestSettings.job(2)), p);
            cluster.awaitCompletedCheckpoints(job, 2, Duration.ofSeconds(60));
            Scenarios.assertChangelogWritten(clusterConfig, label);
            // Evidence that the native view sees dstl's threads at all: it must show them
            // while the storage is open, or its emptiness after shutdown proves nothing.
            dstlDuring = dstlNames(nativeThreads());
            cluster.awaitSuccess(job, Scenarios.JOB_TIMEOUT);
            ExpectedResults.verify(p, Path.of(p.outputDir), label);
        }
        Scenarios.note(label, "native dstl threads while the job ran: " + dstlDuring);
        if (dstlDuring.isEmpty()) {
            throw new AssertionError(label + ": /proc/self/task showed no dstl thread while a dstl storage was"
                    + " open, so the native check below would be blind");
        }

        // Threads end asynchronously after close (a runtime's workers notice their shutdown
        // and exit): poll until nothing is left or the timeout passes.
        Duration settleTimeout = Duration.ofSeconds(10);
        long deadline = System.nanoTime() + settleTimeout.toNanos();
        List<String> newNonDaemon;
        List<String> dstlJava;
        List<String> dstlNative;
        while (true) {
            Set<Thread> now = Thread.getAllStackTraces().keySet();
            newNonDaemon = now.stream()
                    .filter(t -> t.isAlive() && !t.isDaemon() && !before.contains(t))
                    .map(t -> t.getName() + " (" + t.getState() + ")")
                    .sorted()
                    .collect(Collectors.toList());
            dstlJava = now.stream()
                    .filter(t -> t.isAlive() && t.getName().startsWith("dstl"))
                    .map(t -> t.getName() + (t.isDaemon() ? " (daemon)" : ""))
                    .sorted()
                    .collect(Collectors.toList());
            dstlNative = dstlNames(nativeThreads());
            boolean clean = newNonDaemon.isEmpty() && dstlJava.isEmpty() && dstlNative.isEmpty();
            if (clean || System.nanoTime() > deadline) {
                break;
            }
            Thread.sleep(100);
        }
        Scenarios.note(label, String.format("%.1f s after the start; new non-daemon Java threads: %s; dstl Java"
                        + " threads: %s; dstl native threads: %s (before the job: %s)",
                (System.nanoTime() - start) / 1e9, newNonDaemon, dstlJava, dstlNative, dstlNativeBefore));
        List<String> problems = new ArrayList<>();
        if (!newNonDaemon.isEmpty()) {
            problems.add("non-daemon Java threads that were not there before the job: " + newNonDaemon);
        }
        if (!dstlJava.isEmpty()) {
            problems.add("Java threads named dstl*: " + dstlJava);
        }
        if (!dstlNative.isEmpty()) {
            problems.add("native threads named dstl*: " + dstlNative
                    + (dstlNativeBefore.isEmpty() ? "" : " (of which already there before this job, so left by"
                    + " an earlier test in this JVM: " + dstlNativeBefore + ")"));
        }
        if (!problems.isEmpty()) {
            throw new AssertionError(label + ": " + settleTimeout + " after the MiniCluster closed:\n    "
                    + String.join("\n    ", problems));
        }
    }

    /** Every thread of this process, Java or not, by its kernel name (at most 15 characters). */
    private static Map<Long, String> nativeThreads() throws IOException {
        Map<Long, String> out = new TreeMap<>();
        try (Stream<Path> tasks = Files.list(Path.of("/proc/self/task"))) {
            for (Path t : tasks.collect(Collectors.toList())) {
                try {
                    out.put(Long.parseLong(t.getFileName().toString()),
                            Files.readString(t.resolve("comm"), StandardCharsets.UTF_8).trim());
                } catch (NoSuchFileException | java.nio.file.AccessDeniedException exited) {
                    // the thread ended between the listing and the read
                }
            }
        }
        return out;
    }

    private static List<String> dstlNames(Map<Long, String> threads) {
        return threads.entrySet().stream()
                .filter(e -> e.getValue().startsWith("dstl"))
                .map(e -> e.getValue() + " [tid " + e.getKey() + "]")
                .collect(Collectors.toList());
    }
}
