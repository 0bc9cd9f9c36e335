package io.dstl.flink.it;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.fs.FileStatus;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.fs.Path;

import io.dstl.flink.DstlS3FileSystemFactory;

import java.io.FileNotFoundException;
import java.net.URI;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** What a bucket holds, listed through the plugin's own dstl-s3:// file system. */
final class Objects {
    private final FileSystem fs;
    private final String bucket;
    private final Map<String, String> settings;

    Objects(Map<String, String> settings, String bucket) throws Exception {
        this.settings = settings;
        DstlS3FileSystemFactory factory = new DstlS3FileSystemFactory();
        factory.configure(Configuration.fromMap(settings));
        this.fs = factory.create(URI.create("dstl-s3://" + bucket + "/"));
        this.bucket = bucket;
    }

    /** Every object under {@code prefix} (no leading slash), as {@code dstl-s3://} paths. */
    List<String> under(String prefix) throws Exception {
        List<String> out = new ArrayList<>();
        walk(new Path("dstl-s3://" + bucket + "/" + prefix), out);
        return out;
    }

    private void walk(Path path, List<String> out) throws Exception {
        FileStatus[] children;
        try {
            children = fs.listStatus(path);
        } catch (FileNotFoundException nothing) {
            return;
        }
        for (FileStatus s : children) {
            if (s.isDir()) {
                walk(s.getPath(), out);
            } else {
                out.add(s.getPath().toString());
            }
        }
    }

    /** The changelog objects under {@code prefix}, with their sizes and modification times. */
    List<FileStatus> changelogStatus(String prefix) throws Exception {
        List<FileStatus> out = new ArrayList<>();
        for (String o : changelog(prefix)) {
            try {
                out.add(fs.getFileStatus(new Path(o)));
            } catch (FileNotFoundException deletedMeanwhile) {
                // Gone since the listing.
            }
        }
        return out;
    }

    /** The changelog objects ({@code <prefix>/<job>/dstl/*}) under {@code prefix}. */
    List<String> changelog(String prefix) throws Exception {
        List<String> out = new ArrayList<>();
        for (String o : under(prefix)) {
            if (o.contains("/dstl/")) {
                out.add(o);
            }
        }
        return out;
    }

    /** The settings the store is reached with. */
    Map<String, String> settings() {
        return settings;
    }

    FileSystem fileSystem() {
        return fs;
    }
}
