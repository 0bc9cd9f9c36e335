package io.dstl.flink.it;

import org.junit.jupiter.api.Timeout;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;

/**
 * (q) Closing a storage as a TaskManager does never takes the JVM down or hangs: with a writer
 * whose native call panicked (injected), with task threads back-pressured against a store that
 * never answers, and while writers are being created. Each case is a Flink-style program
 * ({@code io.dstl.flink.CloseScenarios}) in a JVM of its own, since a native abort ends the
 * whole process; it must exit 0 having printed {@code SURVIVED}.
 */
@Timeout(300)
class StorageCloseTest extends JobTest {

    @DstlOnly
    void aStorageWithAPoisonedWriterClosesAndTheJvmSurvives() throws Exception {
        String hooks = System.getProperty("dstl.flink.test.hooks.library");
        if (hooks == null || !Files.isRegularFile(Path.of(hooks))) {
            throw new AssertionError("the test-hooks library is missing (-Ddstl.flink.test.hooks.library="
                    + hooks + "); flink/test.sh builds it");
        }
        run("poisoned", List.of("-Ddstl.native.library=" + hooks), dir.toString());
    }

    @DstlOnly
    void backPressuredTaskThreadsLeaveOnInterruptAndOnCloseAndTheJvmSurvives() throws Exception {
        try (Seaweed weed = Seaweed.start(dir.resolve("weed"), "closing")) {
            run("back-pressured", List.of(), weed.endpoint(), weed.bucket, Seaweed.ACCESS_KEY, Seaweed.SECRET_KEY,
                    Long.toString(weed.pid()));
        }
    }

    @DstlOnly
    void writersCreatedWhileTheStorageClosesAreSafeAndTheJvmSurvives() throws Exception {
        run("mid-create", List.of(), dir.toString());
    }

    /** Runs the scenario in a JVM like this one; fails with its output unless it survived. */
    private void run(String scenario, List<String> jvmArgs, String... args) throws Exception {
        String label = "(q) close " + scenario;
        List<String> cmd = TestSettings.childJvm(jvmArgs, "io.dstl.flink.CloseScenarios");
        cmd.add(scenario);
        cmd.addAll(List.of(args));
        Path out = Files.createTempFile(dir, scenario, ".out");
        long start = System.nanoTime();
        Process child = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(out.toFile()).start();
        if (!child.waitFor(240, TimeUnit.SECONDS)) {
            child.destroyForcibly().waitFor();
            throw new AssertionError(label + ": still running after 240 s (a hang):\n" + tail(out));
        }
        int exit = child.exitValue();
        String output = Files.readString(out);
        if (exit != 0 || !output.contains("SURVIVED " + scenario)) {
            throw new AssertionError(label + ": the JVM exited with " + exit
                    + (exit == 134 ? " (SIGABRT: the process aborted)" : "") + ":\n" + tail(out));
        }
        List<String> notes = new ArrayList<>();
        for (String line : output.split("\n")) {
            if (!line.contains("SURVIVED") && !line.startsWith("WARNING") && !line.contains("SLF4J")
                    && !line.isBlank() && !line.startsWith("\tat ") && !line.contains(" WARN ")) {
                notes.add(line);
            }
        }
        Scenarios.note(label, String.format("survived in %.1f s; %s", (System.nanoTime() - start) / 1e9,
                String.join("; ", notes.subList(Math.max(0, notes.size() - 3), notes.size()))));
    }

    private static String tail(Path out) throws Exception {
        List<String> lines = Files.readAllLines(out);
        return String.join("\n", lines.subList(Math.max(0, lines.size() - 60), lines.size()));
    }
}
