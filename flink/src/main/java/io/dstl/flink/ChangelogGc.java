package io.dstl.flink;

import java.io.DataInputStream;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintStream;
import java.net.URI;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.regex.Pattern;

import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.GlobalConfiguration;
import org.apache.flink.core.fs.FileStatus;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.fs.Path;
import org.apache.flink.runtime.checkpoint.Checkpoints;
import org.apache.flink.runtime.checkpoint.OperatorState;
import org.apache.flink.runtime.checkpoint.OperatorSubtaskState;
import org.apache.flink.runtime.checkpoint.metadata.CheckpointMetadata;
import org.apache.flink.runtime.state.KeyedStateHandle;
import org.apache.flink.runtime.state.StreamStateHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateBackendHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandle;
import org.apache.flink.runtime.state.changelog.ChangelogStateHandleStreamImpl;
import org.apache.flink.runtime.state.filesystem.FileStateHandle;

/**
 * Orphan collection for Flink jobs: the changelog files no checkpoint names. A TaskManager that
 * dies between an upload and the checkpoint that would name it leaves such a file, with dstl
 * and with Flink's own storage alike: no checkpoint names it, so the JobManager never deletes
 * it. Run it after a job ended (or while it runs: a job whose storage holds a fresh lease is
 * skipped):
 *
 * <pre>
 * java -cp "dstl-flink.jar:$FLINK_HOME/lib/*" io.dstl.flink.ChangelogGc \
 *     --changelog dstl-s3://bucket/changelog --checkpoints dstl-s3://bucket/checkpoints \
 *     --job JOB_ID [--job ...] [--retained PATH ...] [--grace 1h] [--delete] \
 *     [--flink-conf DIR] [-D key=value ...]
 * </pre>
 *
 * <p>For each job it lists {@code <changelog>/<job>/dstl/} and keeps every file that a
 * checkpoint under {@code --checkpoints} (any job's {@code <job>/chk-N/_metadata}: a job
 * restored from another one names the other's files) or a {@code --retained} checkpoint or
 * savepoint names, and every file younger than {@code --grace}. The rest is listed, and with
 * {@code --delete} deleted, with the job's expired leases. A metadata file that does not parse
 * stops the collection before anything is deleted. Paths are Flink paths: {@code dstl-s3://}
 * (the plugin's own file system; {@code s3://} means the same objects), {@code file://}, or any
 * file system on the classpath; the credentials come from {@code --flink-conf} (the cluster's
 * {@code config.yaml}) or {@code -D}, as for the cluster.
 *
 * <p>Exit status: 0 done, 1 refused or failed (nothing deleted after the refusal), 2 bad usage.
 */
public final class ChangelogGc {
    /** A lease refreshed within this long is held by a running storage (dstl-proto's lease). */
    static final Duration LEASE_EXPIRY = Duration.ofMinutes(10);

    private static final Pattern JOB_ID = Pattern.compile("[0-9a-f]{32}");
    private static final Pattern CHECKPOINT_DIR = Pattern.compile("chk-[0-9]+");

    private ChangelogGc() {}

    /** A bad command line, reported with the usage. */
    static final class UsageException extends Exception {
        UsageException(String message) {
            super(message);
        }
    }

    /** What the command line asks for. */
    static final class Options {
        String changelog;
        String checkpoints;
        final Set<String> jobs = new LinkedHashSet<>();
        final List<String> retained = new ArrayList<>();
        Duration grace = Duration.ofHours(1);
        boolean delete;
        String flinkConf;
        final Map<String, String> settings = new TreeMap<>();

        static Options parse(List<String> args) throws UsageException {
            Options o = new Options();
            for (int i = 0; i < args.size(); i++) {
                String arg = args.get(i);
                if (arg.equals("--delete")) {
                    o.delete = true;
                    continue;
                }
                if (!List.of("--changelog", "--checkpoints", "--job", "--retained", "--grace", "--flink-conf", "-D")
                        .contains(arg)) {
                    throw new UsageException("unknown argument " + arg);
                }
                if (i + 1 >= args.size()) {
                    throw new UsageException(arg + " needs a value");
                }
                String value = args.get(++i);
                switch (arg) {
                    case "--changelog" -> o.changelog = value;
                    case "--checkpoints" -> o.checkpoints = value;
                    case "--job" -> {
                        if (!JOB_ID.matcher(value).matches()) {
                            throw new UsageException("--job " + value + " is not a Flink job id (32 hex digits)");
                        }
                        o.jobs.add(value);
                    }
                    case "--retained" -> o.retained.add(value);
                    case "--grace" -> o.grace = grace(value);
                    case "--flink-conf" -> o.flinkConf = value;
                    default -> {
                        int eq = value.indexOf('=');
                        if (eq <= 0) {
                            throw new UsageException("-D " + value + " is not key=value");
                        }
                        o.settings.put(value.substring(0, eq), value.substring(eq + 1));
                    }
                }
            }
            if (o.changelog == null) {
                throw new UsageException("--changelog (the changelog base path) is required");
            }
            if (o.checkpoints == null) {
                throw new UsageException("--checkpoints (the checkpoint directory, whose checkpoints stay"
                        + " restorable) is required");
            }
            if (o.jobs.isEmpty()) {
                throw new UsageException("name the jobs to collect with --job");
            }
            return o;
        }

        private static Duration grace(String value) throws UsageException {
            try {
                Duration d = org.apache.flink.util.TimeUtils.parseDuration(value);
                if (d.isNegative()) {
                    throw new IllegalArgumentException("negative");
                }
                return d;
            } catch (RuntimeException e) {
                throw new UsageException("--grace " + value + " is not a duration (e.g. 1h, 10min, 0s)");
            }
        }
    }

    /** What a collection found and did. */
    static final class Report {
        int listed;
        int named;
        int young;
        final List<String> orphans = new ArrayList<>();
        final List<String> skippedJobs = new ArrayList<>();
        int deleted;
    }

    public static void main(String[] args) {
        System.exit(run(List.of(args), System.out, System.err));
    }

    /** Runs a collection; returns the exit status. */
    static int run(List<String> args, PrintStream out, PrintStream err) {
        Options options;
        try {
            options = Options.parse(args);
        } catch (UsageException e) {
            err.println("error: " + e.getMessage());
            err.println("usage: ChangelogGc --changelog PATH --checkpoints PATH --job ID [--job ID ...]"
                    + " [--retained PATH ...] [--grace 1h] [--delete] [--flink-conf DIR] [-D key=value ...]");
            return 2;
        }
        try {
            collect(options, out);
            return 0;
        } catch (IOException | RuntimeException e) {
            err.println("error: " + e.getMessage());
            return 1;
        }
    }

    /** Lists (and with {@code --delete} deletes) the orphans of the jobs {@code options} names. */
    static Report collect(Options options, PrintStream out) throws IOException {
        Configuration config = options.flinkConf == null
                ? new Configuration()
                : GlobalConfiguration.loadConfiguration(options.flinkConf);
        options.settings.forEach(config::setString);
        FileSystem.initialize(config, null);

        Set<String> named = new LinkedHashSet<>();
        int checkpoints = 0;
        for (Path metadata : checkpointMetadata(path(options.checkpoints))) {
            named.addAll(changelogFiles(metadata));
            checkpoints++;
        }
        for (String retained : options.retained) {
            Path p = path(retained);
            FileSystem fs = p.getFileSystem();
            Path metadata = fs.getFileStatus(p).isDir() ? new Path(p, "_metadata") : p;
            named.addAll(changelogFiles(metadata));
            checkpoints++;
        }
        out.printf("%d checkpoints read; they name %d changelog files%n", checkpoints, named.size());

        Report report = new Report();
        long now = System.currentTimeMillis();
        List<Path> orphans = new ArrayList<>();
        List<Path> expiredLeases = new ArrayList<>();
        for (String job : options.jobs) {
            Path jobDir = new Path(path(options.changelog), job);
            String live = freshLease(new Path(jobDir, "leases"), now, expiredLeases);
            if (live != null) {
                report.skippedJobs.add(job);
                out.printf("job %s skipped: its storage holds a lease (%s)%n", job, live);
                continue;
            }
            for (FileStatus file : list(new Path(jobDir, "dstl"))) {
                report.listed++;
                if (named.contains(key(file.getPath()))) {
                    report.named++;
                } else if (now - file.getModificationTime() < options.grace.toMillis()) {
                    report.young++;
                } else {
                    orphans.add(file.getPath());
                    report.orphans.add(file.getPath().toString());
                    out.printf("orphan %s (%d bytes)%n", file.getPath(), file.getLen());
                }
            }
        }
        if (options.delete) {
            for (Path p : orphans) {
                p.getFileSystem().delete(p, false);
                report.deleted++;
            }
            for (Path p : expiredLeases) {
                p.getFileSystem().delete(p, false);
            }
        }
        out.printf("%d changelog files listed: %d named by a checkpoint, %d younger than the grace, %d orphans %s%s%n",
                report.listed, report.named, report.young, report.orphans.size(),
                options.delete ? "deleted" : "(pass --delete to delete them)",
                report.skippedJobs.isEmpty() ? "" : "; jobs skipped while running: " + report.skippedJobs);
        return report;
    }

    /** A Flink path; {@code s3://} as the plugin's own {@code dstl-s3://}, which serves the same objects. */
    static Path path(String spelled) {
        if (spelled.startsWith("s3://")) {
            return new Path(DstlS3FileSystem.SCHEME + "://" + spelled.substring("s3://".length()));
        }
        return new Path(spelled);
    }

    /**
     * A file's identity however its path is spelled: the scheme aside ({@code s3}, {@code
     * dstl-s3} name the same objects; {@code file:/x} and {@code /x} the same file), its
     * authority and path.
     */
    static String key(Path p) {
        URI u = p.toUri();
        return (u.getAuthority() == null ? "" : u.getAuthority()) + u.getPath();
    }

    /** The {@code _metadata} of every checkpoint {@code <dir>/<job>/chk-N/} of any job. */
    private static List<Path> checkpointMetadata(Path dir) throws IOException {
        List<Path> out = new ArrayList<>();
        for (FileStatus job : list(dir)) {
            if (!job.isDir()) {
                continue;
            }
            for (FileStatus chk : list(job.getPath())) {
                if (chk.isDir() && CHECKPOINT_DIR.matcher(chk.getPath().getName()).matches()) {
                    Path metadata = new Path(chk.getPath(), "_metadata");
                    if (metadata.getFileSystem().exists(metadata)) {
                        out.add(metadata);
                    }
                }
            }
        }
        return out;
    }

    /** The changelog files a checkpoint's metadata names, by {@link #key}. */
    static Set<String> changelogFiles(Path metadata) throws IOException {
        Set<String> out = new LinkedHashSet<>();
        CheckpointMetadata m;
        try (InputStream in = metadata.getFileSystem().open(metadata)) {
            m = Checkpoints.loadCheckpointMetadata(
                    new DataInputStream(in), ChangelogGc.class.getClassLoader(), metadata.getParent().toString());
        } catch (IOException | RuntimeException e) {
            throw new IOException("cannot read the checkpoint metadata " + metadata + " (" + e.getMessage()
                    + "); nothing was deleted", e);
        }
        for (OperatorState op : m.getOperatorStates()) {
            for (OperatorSubtaskState sub : op.getStates()) {
                for (KeyedStateHandle h : sub.getManagedKeyedState()) {
                    if (!(h instanceof ChangelogStateBackendHandle)) {
                        continue;
                    }
                    for (ChangelogStateHandle c : ((ChangelogStateBackendHandle) h).getNonMaterializedStateHandles()) {
                        if (!(c instanceof ChangelogStateHandleStreamImpl)) {
                            continue;
                        }
                        for (Tuple2<StreamStateHandle, Long> t : ((ChangelogStateHandleStreamImpl) c).getHandlesAndOffsets()) {
                            if (t.f0 instanceof FileStateHandle) {
                                out.add(key(((FileStateHandle) t.f0).getFilePath()));
                            }
                        }
                    }
                }
            }
        }
        return out;
    }

    /**
     * The first lease under {@code dir} refreshed within {@link #LEASE_EXPIRY}, described, or null;
     * collects the expired ones into {@code expired}.
     */
    private static String freshLease(Path dir, long now, List<Path> expired) throws IOException {
        String fresh = null;
        for (FileStatus lease : list(dir)) {
            long age = now - lease.getModificationTime();
            if (age < LEASE_EXPIRY.toMillis()) {
                if (fresh == null) {
                    fresh = lease.getPath().getName() + ", refreshed " + Math.max(0, age / 1000) + " s ago";
                }
            } else {
                expired.add(lease.getPath());
            }
        }
        return fresh;
    }

    /** The entries of a directory; none if it does not exist. */
    private static List<FileStatus> list(Path dir) throws IOException {
        FileStatus[] entries;
        try {
            entries = dir.getFileSystem().listStatus(dir);
        } catch (FileNotFoundException missing) {
            return List.of();
        }
        return entries == null ? List.of() : List.of(entries);
    }
}
