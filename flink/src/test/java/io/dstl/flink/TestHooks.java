package io.dstl.flink;

import java.lang.reflect.Field;

import org.apache.flink.runtime.state.changelog.StateChangelogStorage;

/**
 * Fault injection for the plugin's tests. The natives exist only in the library flink/test.sh
 * builds with the cargo feature {@code test-hooks} (loaded with {@code -Ddstl.native.library});
 * the plugin's own library has none.
 */
public final class TestHooks {
    private TestHooks() {}

    /** The next upload a writer of the storage schedules panics inside the native host. */
    public static void panicInNextSchedule(StateChangelogStorage<?> storage) throws Exception {
        panicInNextSchedule(handle(storage));
    }

    private static native void panicInNextSchedule(long storage);

    /** The native handle of an opened dstl storage. */
    private static long handle(StateChangelogStorage<?> storage) throws Exception {
        Field nativeField = DstlChangelogStorage.class.getDeclaredField("nativeStorage");
        nativeField.setAccessible(true);
        NativeStorage open = (NativeStorage) nativeField.get(storage);
        if (open == null) {
            throw new IllegalStateException("the storage has no writer yet, so no native storage");
        }
        Field handleField = NativeStorage.class.getDeclaredField("handle");
        handleField.setAccessible(true);
        return handleField.getLong(open);
    }
}
