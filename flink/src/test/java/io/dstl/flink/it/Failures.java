package io.dstl.flink.it;

import java.util.ArrayList;
import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.List;
import java.util.Set;

/** Formatting and inspection of exception cause chains. */
final class Failures {

    private Failures() {}

    /** Every throwable of the cause chain (and suppressed ones), outermost first. */
    static List<Throwable> all(Throwable t) {
        List<Throwable> out = new ArrayList<>();
        Set<Throwable> seen = Collections.newSetFromMap(new IdentityHashMap<>());
        collect(t, out, seen);
        return out;
    }

    private static void collect(Throwable t, List<Throwable> out, Set<Throwable> seen) {
        if (t == null || !seen.add(t)) {
            return;
        }
        out.add(t);
        for (Throwable s : t.getSuppressed()) {
            collect(s, out, seen);
        }
        collect(t.getCause(), out, seen);
    }

    /** One line per throwable of the chain: class and message. */
    static String chain(Throwable t) {
        StringBuilder sb = new StringBuilder();
        for (Throwable c : all(t)) {
            sb.append("    ").append(c.getClass().getName()).append(": ").append(c.getMessage()).append('\n');
        }
        return sb.toString();
    }

    /** Whether the chain holds a throwable whose class name or message contains {@code text}. */
    static boolean mentions(Throwable t, String text) {
        for (Throwable c : all(t)) {
            String s = c.getClass().getName() + ": " + c.getMessage();
            if (s.toLowerCase().contains(text.toLowerCase())) {
                return true;
            }
        }
        return false;
    }

    /** Whether the chain contains the failure {@link ChangelogTestJob} injects on purpose. */
    static boolean isInjected(Throwable t) {
        for (Throwable c : all(t)) {
            // Deserialized on the test side the class may be a SerializedThrowable wrapper that
            // keeps the original class name in its toString.
            if (c instanceof ChangelogTestJob.InjectedFailure
                    || String.valueOf(c).contains(ChangelogTestJob.InjectedFailure.class.getName())) {
                return true;
            }
        }
        return false;
    }
}
