package io.dstl.flink.it;

import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * Runs the plugin's orphan collection ({@code io.dstl.flink.ChangelogGc}) as an operator does:
 * in a JVM of its own, with Flink's jars and the plugin jar on the classpath.
 */
final class Gc {
    final int exit;
    final String output;

    private Gc(int exit, String output) {
        this.exit = exit;
        this.output = output;
    }

    /** Runs it with {@code args}, each of {@code settings} as {@code -D key=value}. */
    static Gc run(Map<String, String> settings, String... args) throws Exception {
        List<String> cmd = TestSettings.childJvm(List.of(), "io.dstl.flink.ChangelogGc");
        cmd.addAll(List.of(args));
        settings.forEach((k, v) -> {
            cmd.add("-D");
            cmd.add(k + "=" + v);
        });
        Process child = new ProcessBuilder(cmd).redirectErrorStream(true).start();
        byte[] out = child.getInputStream().readAllBytes();
        if (!child.waitFor(120, TimeUnit.SECONDS)) {
            child.destroyForcibly();
            throw new AssertionError("ChangelogGc still running after 120 s");
        }
        return new Gc(child.exitValue(), new String(out, StandardCharsets.UTF_8));
    }

    /** The lines the tool itself printed (not the logging of Flink's classes). */
    String report() {
        StringBuilder b = new StringBuilder();
        for (String line : output.split("\n")) {
            if (line.startsWith("orphan ") || line.startsWith("error: ") || line.contains("changelog files")
                    || line.startsWith("job ")) {
                b.append(line).append('\n');
            }
        }
        return b.toString();
    }

    @Override
    public String toString() {
        return "exit " + exit + ":\n" + output;
    }
}
