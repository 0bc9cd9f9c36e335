package io.dstl.flink.it;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.stream.Collectors;
import java.util.stream.Stream;

/**
 * Everything below a changelog base path: every directory and regular file, by path relative
 * to the base. Deletions of discarded checkpoints run asynchronously (the JobManager's I/O
 * executor, the storages' discard threads), so a listing counts only once it has stopped
 * changing.
 */
final class BasePathListing {

    /** Relative paths, sorted; directories end with {@code /}. */
    final List<String> entries;

    private BasePathListing(List<String> entries) {
        this.entries = entries;
    }

    static BasePathListing of(Path base) throws IOException {
        List<String> out = new ArrayList<>();
        if (Files.isDirectory(base)) {
            try (Stream<Path> s = Files.walk(base)) {
                for (Path p : s.sorted().collect(Collectors.toList())) {
                    if (p.equals(base)) {
                        continue;
                    }
                    String rel = base.relativize(p).toString();
                    out.add(Files.isDirectory(p) ? rel + "/" : rel);
                }
            } catch (UncheckedIOException e) {
                // A file deleted while the walk visited it: the caller lists again.
                throw e.getCause();
            }
        }
        return new BasePathListing(out);
    }

    /**
     * Lists {@code base} until two listings {@code quiet} apart are equal; fails if it still
     * changes after {@code timeout}.
     */
    static BasePathListing awaitStable(Path base, Duration quiet, Duration timeout, String context)
            throws Exception {
        long deadline = System.nanoTime() + timeout.toNanos();
        BasePathListing last = null;
        while (true) {
            BasePathListing now;
            try {
                now = of(base);
            } catch (IOException racedWithADeletion) {
                now = null;
            }
            if (now != null && last != null && now.entries.equals(last.entries)) {
                return now;
            }
            if (System.nanoTime() > deadline) {
                throw new AssertionError(context + ": the changelog base path " + base + " was still changing "
                        + timeout + " after the job ended; last listing: " + (now == null ? last : now));
            }
            last = now;
            Thread.sleep(quiet.toMillis());
        }
    }

    List<String> files() {
        return entries.stream().filter(e -> !e.endsWith("/")).collect(Collectors.toList());
    }

    /** Entries inside a {@code leases} directory, at any depth. */
    List<String> leaseEntries() {
        return entries.stream().filter(e -> e.contains("leases/") && !e.endsWith("leases/"))
                .collect(Collectors.toList());
    }

    /** Directories named {@code leases} themselves. */
    List<String> leaseDirectories() {
        return entries.stream().filter(e -> e.equals("leases/") || e.endsWith("/leases/"))
                .collect(Collectors.toList());
    }

    /** Entries with a name component starting with a dot: staging files that never got moved into place. */
    List<String> hiddenEntries() {
        return entries.stream().filter(e -> {
            for (String part : e.split("/")) {
                if (part.startsWith(".")) {
                    return true;
                }
            }
            return false;
        }).collect(Collectors.toList());
    }

    @Override
    public String toString() {
        if (entries.isEmpty()) {
            return "(nothing)";
        }
        return files().size() + " file(s), " + (entries.size() - files().size()) + " dir(s):\n      "
                + String.join("\n      ", entries);
    }
}
