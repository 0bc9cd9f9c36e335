package io.dstl.flink.it;

import org.junit.jupiter.params.provider.Arguments;

import java.lang.management.ManagementFactory;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/** Configuration shared by the tests, and the storages they run against. */
final class TestSettings {

    static final String DSTL = "dstl";
    static final String FILESYSTEM = "filesystem";

    private TestSettings() {}

    /** The changelog storages to test: {@code DSTL_FLINK_TEST_STORAGES}, default both. */
    static List<String> storages() {
        String env = System.getenv("DSTL_FLINK_TEST_STORAGES");
        String value = env == null || env.isBlank() ? DSTL + "," + FILESYSTEM : env;
        List<String> list = Arrays.stream(value.split(","))
                .map(String::trim)
                .filter(s -> !s.isEmpty())
                .distinct()
                .collect(Collectors.toList());
        for (String s : list) {
            if (!s.equals(DSTL) && !s.equals(FILESYSTEM)) {
                throw new IllegalArgumentException("DSTL_FLINK_TEST_STORAGES: unknown storage " + s);
            }
        }
        return list;
    }

    static boolean enabled(String storage) {
        return storages().contains(storage);
    }

    /** {@code @EnabledIf}: whether dstl is among the storages under test. */
    static boolean dstlEnabled() {
        return enabled(DSTL);
    }

    /** {@code @MethodSource}: every storage. */
    static Stream<String> storageNames() {
        return storages().stream();
    }

    /** {@code @MethodSource}: every storage with both heap and RocksDB state. */
    static Stream<Arguments> storagesAndBackends() {
        return storages().stream().flatMap(s -> Stream.of(Arguments.of(s, "hashmap"), Arguments.of(s, "rocksdb")));
    }

    /**
     * What a cluster configuration file would carry for the changelog state backend. The
     * storage is created from the TaskManager's configuration (Flink's TaskExecutor passes its
     * own configuration, not the job's, to the storage factory), so this must reach the
     * cluster; the tests also pass it to the job so that both sides agree.
     */
    static Map<String, String> changelog(String storage, String backend, Path changelogDir, Path checkpointDir) {
        Map<String, String> c = new LinkedHashMap<>();
        c.put("state.backend.type", backend);
        c.put("state.changelog.enabled", "true");
        c.put("state.changelog.storage", storage);
        c.put("state.changelog.dstl.dfs.base-path", uri(changelogDir));
        c.put("execution.checkpointing.dir", uri(checkpointDir));
        // Without materialization every restore replays the changelog from its very first
        // change; the tests that want materialization turn it on explicitly.
        c.put("state.changelog.periodic-materialize.enabled", "false");
        return c;
    }

    /** Job settings: checkpoints every 200 ms, restarts with a short fixed delay. */
    static Map<String, String> job(int parallelism) {
        Map<String, String> c = new LinkedHashMap<>();
        c.put("parallelism.default", String.valueOf(parallelism));
        c.put("execution.checkpointing.interval", "200ms");
        c.put("restart-strategy.type", "fixed-delay");
        c.put("restart-strategy.fixed-delay.attempts", "5");
        c.put("restart-strategy.fixed-delay.delay", "200ms");
        return c;
    }

    /** Flink's jars: {@code -Ddstl.flink.lib} (set by flink/test.sh), else flink-dist's directory. */
    static Path flinkLib() throws Exception {
        String prop = System.getProperty("dstl.flink.lib");
        if (prop != null) {
            return Path.of(prop);
        }
        return codeSource(Class.forName("org.apache.flink.streaming.api.environment.StreamExecutionEnvironment"))
                .getParent();
    }

    /** The plugin jar: {@code -Ddstl.flink.plugin.jar}, else wherever the factory class comes from. */
    static Path pluginJar() throws Exception {
        String prop = System.getProperty("dstl.flink.plugin.jar");
        Path jar = prop != null ? Path.of(prop) : codeSource(Class.forName("io.dstl.flink.DstlChangelogStorageFactory"));
        if (!java.nio.file.Files.isRegularFile(jar)) {
            throw new IllegalStateException("the dstl plugin jar " + jar + " does not exist; build it with flink/build.sh");
        }
        return jar;
    }

    static Path codeSource(Class<?> c) throws Exception {
        return Path.of(c.getProtectionDomain().getCodeSource().getLocation().toURI());
    }

    static String uri(Path p) {
        return p.toAbsolutePath().toUri().toString();
    }

    @SafeVarargs
    static Map<String, String> merge(Map<String, String>... maps) {
        Map<String, String> out = new LinkedHashMap<>();
        for (Map<String, String> m : maps) {
            out.putAll(m);
        }
        return out;
    }

    /**
     * The command line of a JVM like this one (its heap settings and module openings, not the
     * test launcher's agents, and this classpath: Flink, the plugin jar, the tests) that runs
     * {@code mainClass}, with {@code jvmArgs} before it.
     */
    static List<String> childJvm(List<String> jvmArgs, String mainClass) {
        List<String> cmd = new ArrayList<>();
        cmd.add(Path.of(System.getProperty("java.home"), "bin", "java").toString());
        for (String arg : ManagementFactory.getRuntimeMXBean().getInputArguments()) {
            if (arg.startsWith("-X") || arg.startsWith("--add-")) {
                cmd.add(arg);
            }
        }
        cmd.addAll(jvmArgs);
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(mainClass);
        return cmd;
    }
}
