package io.dstl.flink.it;

import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.FileTime;
import java.time.Instant;
import java.time.temporal.ChronoUnit;
import java.util.List;
import java.util.Map;

/**
 * (v) The plugin's orphan collection on a local base path, where a case is quick to set up:
 * what it refuses (by name), and what it keeps. Its work on an object store with real
 * checkpoints is in {@code ObjectStoreClusterTest} and {@code ObjectStoreTest}.
 */
@Timeout(120)
class ChangelogGcTest extends JobTest {
    private static final String JOB = "0123456789abcdef0123456789abcdef";

    private Path changelog;
    private Path checkpoints;

    private Path file(Path path, Instant modified) throws Exception {
        Files.createDirectories(path.getParent());
        Files.write(path, new byte[] {1, 2, 3});
        Files.setLastModifiedTime(path, FileTime.from(modified));
        return path;
    }

    private Gc gc(String... extra) throws Exception {
        String[] args = new String[extra.length + 6];
        args[0] = "--changelog";
        args[1] = changelog.toUri().toString();
        args[2] = "--checkpoints";
        args[3] = checkpoints.toUri().toString();
        args[4] = "--job";
        args[5] = JOB;
        System.arraycopy(extra, 0, args, 6, extra.length);
        return Gc.run(Map.of(), args);
    }

    @Test
    void keepsYoungFilesDeletesOldOnesAndSkipsAJobWithAFreshLease() throws Exception {
        changelog = dir.resolve("changelog");
        checkpoints = Files.createDirectories(dir.resolve("checkpoints"));
        Instant now = Instant.now();
        Path old = file(changelog.resolve(JOB + "/dstl/old"), now.minus(2, ChronoUnit.HOURS));
        Path young = file(changelog.resolve(JOB + "/dstl/young"), now.minus(10, ChronoUnit.MINUTES));
        Path other = file(changelog.resolve("ffffffffffffffffffffffffffffffff/dstl/other"), now.minus(2, ChronoUnit.HOURS));

        Gc dry = gc();
        if (dry.exit != 0 || !dry.report().contains("orphan " + old.toUri().toString().replace("file:///", "file:/"))
                || !Files.exists(old)) {
            throw new AssertionError("without --delete the old file is listed and kept\n" + dry);
        }
        Gc deleting = gc("--delete");
        if (deleting.exit != 0 || Files.exists(old) || !Files.exists(young) || !Files.exists(other)) {
            throw new AssertionError("--delete removes the old file only (young within the 1 h grace; another job"
                    + " untouched)\n" + deleting);
        }

        file(changelog.resolve(JOB + "/leases/holder.lease"), now.minus(1, ChronoUnit.MINUTES));
        Gc leased = gc("--delete", "--grace", "0s");
        if (leased.exit != 0 || !Files.exists(young) || !leased.report().contains("skipped")) {
            throw new AssertionError("a job whose storage holds a fresh lease is skipped\n" + leased);
        }
        Scenarios.note("(v) orphan collection, local", deleting.report().strip().replace('\n', ';'));
    }

    @Test
    void refusesBadUsageByNameAndStopsAtMetadataItCannotRead() throws Exception {
        changelog = dir.resolve("changelog");
        checkpoints = dir.resolve("checkpoints");
        Path orphan = file(changelog.resolve(JOB + "/dstl/orphan"), Instant.now().minus(2, ChronoUnit.HOURS));
        file(checkpoints.resolve(JOB + "/chk-7/_metadata"), Instant.now());

        Gc corrupt = gc("--delete", "--grace", "0s");
        if (corrupt.exit != 1 || !corrupt.output.contains("chk-7/_metadata") || !Files.exists(orphan)) {
            throw new AssertionError("metadata that does not parse stops the collection, named, deleting nothing\n"
                    + corrupt);
        }
        Map<List<String>, String> bad = Map.of(
                List.of("--frobnicate"), "--frobnicate",
                List.of("--grace", "soon"), "--grace soon",
                List.of("--job", "not-a-job"), "--job not-a-job");
        for (Map.Entry<List<String>, String> b : bad.entrySet()) {
            Gc refused = gc(b.getKey().toArray(String[]::new));
            if (refused.exit != 2 || !refused.output.contains(b.getValue())) {
                throw new AssertionError("a bad argument is refused naming it (" + b.getValue() + ")\n" + refused);
            }
        }
        Gc missing = Gc.run(Map.of(), "--changelog", changelog.toString(), "--job", JOB);
        if (missing.exit != 2 || !missing.output.contains("--checkpoints")) {
            throw new AssertionError("--checkpoints is required\n" + missing);
        }
    }
}
