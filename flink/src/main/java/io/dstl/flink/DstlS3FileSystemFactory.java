package io.dstl.flink;

import java.io.IOException;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.TreeMap;

import org.apache.flink.configuration.Configuration;
import org.apache.flink.core.fs.FileSystem;
import org.apache.flink.core.fs.FileSystemFactory;

/**
 * Makes the {@code dstl-s3://} file system ({@link DstlS3FileSystem}) available to Flink: found
 * through {@code META-INF/services} in the plugin (and on a MiniCluster's classpath), configured
 * with the cluster's configuration on the JobManager and every TaskManager, from the same
 * {@code state.changelog.dstl.s3.*} keys as the changelog storage: endpoint, region, access key
 * and secret, {@code allow-http}, request timeout (or the environment's {@code AWS_*}, as dstl's
 * storage falls back to).
 */
public final class DstlS3FileSystemFactory implements FileSystemFactory {
    /** The settings of the object-store client, as dstl's configuration keys. */
    private Map<String, String> settings = Map.of();

    @Override
    public String getScheme() {
        return DstlS3FileSystem.SCHEME;
    }

    @Override
    public void configure(Configuration config) {
        settings = s3Settings(config.toMap());
    }

    /**
     * The object-store keys among {@code configuration}: {@code state.changelog.dstl.s3.*}, and
     * Flink's older spelling without the {@code state.changelog.} prefix where the full one is
     * not set.
     */
    static Map<String, String> s3Settings(Map<String, String> configuration) {
        Map<String, String> out = new TreeMap<>();
        for (Map.Entry<String, String> e : configuration.entrySet()) {
            String key = e.getKey();
            String shortKey = key.startsWith(DstlChangelogStorage.FLINK_PREFIX)
                    ? key.substring(DstlChangelogStorage.FLINK_PREFIX.length())
                    : key;
            if (shortKey.startsWith("dstl.s3.")) {
                // The prefixed spelling wins over the older one.
                if (key.equals(shortKey)) {
                    out.putIfAbsent(shortKey, e.getValue());
                } else {
                    out.put(shortKey, e.getValue());
                }
            }
        }
        return out;
    }

    @Override
    public FileSystem create(URI uri) throws IOException {
        String bucket = uri.getAuthority();
        if (bucket == null || bucket.isEmpty()) {
            throw new IOException("dstl: " + uri + " names no bucket: write " + DstlS3FileSystem.SCHEME
                    + "://bucket/path");
        }
        Native.load();
        StringBuilder packed = new StringBuilder();
        for (Map.Entry<String, String> e : settings.entrySet()) {
            packed.append(e.getKey()).append('\0').append(e.getValue()).append('\0');
        }
        long store = Native.openObjectStore(
                packed.toString().getBytes(StandardCharsets.UTF_8), bucket.getBytes(StandardCharsets.UTF_8));
        return new DstlS3FileSystem(bucket, store);
    }
}
