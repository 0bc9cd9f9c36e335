package io.dstl.flink.bench;

import java.util.SplittableRandom;

import org.apache.flink.api.connector.source.SourceReaderContext;
import org.apache.flink.api.java.tuple.Tuple2;
import org.apache.flink.connector.datagen.source.GeneratorFunction;

/**
 * Turns the source's sequence numbers into (key, value) records.
 *
 * <p>Keys are the sequence number scrambled by a 64-bit multiplicative hash, so consecutive
 * records hit unrelated keys and key groups (as real traffic does) while every key recurs about
 * every {@code keys} records per the whole job. Values are random bytes: the changelog then
 * carries incompressible payloads, so a storage that compresses by default gains nothing it would
 * not gain on real data of the same entropy.
 */
final class EventGenerator implements GeneratorFunction<Long, Tuple2<Long, byte[]>> {
    private static final long serialVersionUID = 1L;

    private final long keys;
    private final int valueBytes;
    private transient SplittableRandom random;

    EventGenerator(long keys, int valueBytes) {
        this.keys = keys;
        this.valueBytes = valueBytes;
    }

    @Override
    public void open(SourceReaderContext readerContext) {
        random = new SplittableRandom(0x5eed + readerContext.getIndexOfSubtask());
    }

    @Override
    public Tuple2<Long, byte[]> map(Long sequence) {
        long h = sequence * 0x9E3779B97F4A7C15L;
        long key = Long.remainderUnsigned(h ^ (h >>> 29), keys);
        byte[] value = new byte[valueBytes];
        for (int i = 0; i < valueBytes; i += 8) {
            long r = random.nextLong();
            for (int j = i; j < Math.min(i + 8, valueBytes); j++) {
                value[j] = (byte) r;
                r >>>= 8;
            }
        }
        return Tuple2.of(key, value);
    }
}
