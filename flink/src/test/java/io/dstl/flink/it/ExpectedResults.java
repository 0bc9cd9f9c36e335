package io.dstl.flink.it;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * The exact final state of {@link ChangelogTestJob}, computed from its parameters alone, and the
 * comparison with what the job's sink wrote.
 */
final class ExpectedResults {

    private ExpectedResults() {}

    /** The state key {@code key} must end with: every sequence number exactly once. */
    static String expectedState(ChangelogTestJob.Params p, int key) {
        long n = p.recordsPerKey;
        List<Long> seqs = new ArrayList<>();
        Map<Integer, Long> buckets = new TreeMap<>();
        Map<Integer, Integer> toggles = new TreeMap<>();
        long sum = 0;
        for (long seq = 0; seq < n; seq++) {
            seqs.add(seq);
            sum += seq;
            buckets.merge(ChangelogTestJob.sumBucket(seq), seq + 1, Long::sum);
            int slot = ChangelogTestJob.toggleSlot(key, seq);
            if (toggles.remove(slot) == null) {
                toggles.put(slot, ChangelogTestJob.toggleValue(key, slot));
            }
        }
        return ChangelogTestJob.describe(key, n, sum, seqs, 0, buckets, toggles);
    }

    /**
     * Asserts that {@code outputDir} holds exactly one result file per key with exactly the
     * expected state, and nothing else (no overflow, incomplete or conflict files).
     */
    static void verify(ChangelogTestJob.Params p, Path outputDir, String context) throws IOException {
        List<String> problems = new ArrayList<>();
        TreeSet<String> names = new TreeSet<>();
        if (Files.isDirectory(outputDir)) {
            try (Stream<Path> files = Files.list(outputDir)) {
                files.map(f -> f.getFileName().toString())
                        .filter(n -> !n.startsWith(".tmp-"))
                        .forEach(names::add);
            }
        }
        for (int key = 0; key < p.keys; key++) {
            String name = ChangelogTestJob.RESULT_PREFIX + key;
            if (!names.remove(name)) {
                problems.add("key " + key + ": no result (the key never saw all " + p.recordsPerKey
                        + " events, or the sink lost it)");
                continue;
            }
            String actual = Files.readString(outputDir.resolve(name), StandardCharsets.UTF_8);
            String expected = expectedState(p, key);
            if (!actual.equals(expected)) {
                problems.add("key " + key + ": wrong final state\n" + diff(expected, actual));
            }
        }
        for (String extra : names) {
            String content = Files.readString(outputDir.resolve(extra), StandardCharsets.UTF_8);
            problems.add("unexpected output " + extra + " (overflow = duplicated events, incomplete = lost"
                    + " events, conflict = different state emitted twice):\n" + indent(summarize(content)));
        }
        if (!problems.isEmpty()) {
            throw new AssertionError(context + ": " + problems.size() + " problem(s) with the final state in "
                    + outputDir + "\n" + String.join("\n", problems));
        }
    }

    /** Line-by-line difference; for the sequence list, the missing and the surplus elements. */
    static String diff(String expected, String actual) {
        Map<String, String> e = fields(expected);
        Map<String, String> a = fields(actual);
        StringBuilder sb = new StringBuilder();
        TreeSet<String> keys = new TreeSet<>(e.keySet());
        keys.addAll(a.keySet());
        for (String k : keys) {
            String ev = e.get(k);
            String av = a.get(k);
            if (ev != null && ev.equals(av)) {
                continue;
            }
            if (k.equals("list.seqs") && ev != null && av != null) {
                List<Long> missing = multisetMinus(parseLongs(ev), parseLongs(av));
                List<Long> surplus = multisetMinus(parseLongs(av), parseLongs(ev));
                sb.append("    list.seqs: missing ").append(abbreviate(missing))
                        .append(", surplus (duplicates or foreign) ").append(abbreviate(surplus)).append('\n');
            } else {
                sb.append("    ").append(k).append(": expected ").append(ev).append(", actual ").append(av).append('\n');
            }
        }
        return sb.toString();
    }

    private static String summarize(String content) {
        return fields(content).entrySet().stream()
                .map(en -> en.getKey() + "=" + (en.getValue().length() > 200
                        ? en.getValue().substring(0, 200) + "..." : en.getValue()))
                .collect(Collectors.joining("\n"));
    }

    private static String indent(String s) {
        return "    " + s.replace("\n", "\n    ");
    }

    private static Map<String, String> fields(String content) {
        Map<String, String> m = new TreeMap<>();
        for (String line : content.split("\n")) {
            int eq = line.indexOf('=');
            if (eq > 0) {
                m.put(line.substring(0, eq), line.substring(eq + 1));
            }
        }
        return m;
    }

    private static List<Long> parseLongs(String csv) {
        List<Long> out = new ArrayList<>();
        for (String s : csv.split(",")) {
            if (!s.isEmpty()) {
                out.add(Long.parseLong(s));
            }
        }
        return out;
    }

    private static List<Long> multisetMinus(List<Long> from, List<Long> remove) {
        Map<Long, Integer> counts = new TreeMap<>();
        remove.forEach(v -> counts.merge(v, 1, Integer::sum));
        List<Long> out = new ArrayList<>();
        for (Long v : from) {
            Integer c = counts.get(v);
            if (c == null || c == 0) {
                out.add(v);
            } else {
                counts.put(v, c - 1);
            }
        }
        return out;
    }

    private static String abbreviate(List<Long> values) {
        if (values.size() <= 20) {
            return values.toString();
        }
        return values.subList(0, 20) + " ... (" + values.size() + " in total)";
    }
}
