//! The JNI entry points of the plugin's Flink file system (`io.dstl.flink.fs`, scheme
//! `dstl-s3`): the objects dstl writes to an S3-compatible store, read, listed, deleted
//! and written through dstl's own client, so that Flink's reader restores changelog
//! handles and the JobManager deletes subsumed files with no S3 plugin of Flink's
//! installed. One handle per bucket, owned by the Java file system that opened it.

use dstl::{S3Store, StoredFile};
use jni_sys::{jboolean, jbyteArray, jint, jlong, jlongArray};

use crate::jni::Env;
use crate::{Thrown, entry};

/// The store behind a handle from `openObjectStore`.
///
/// # Safety
/// `handle` came from `openObjectStore` and was not closed yet.
unsafe fn store<'a>(handle: jlong) -> &'a S3Store {
    unsafe { &*(handle as *const S3Store) }
}

/// A path of the Java side (`s3://bucket/key`) as UTF-8.
fn path(env: Env, path: jbyteArray) -> Result<String, Thrown> {
    String::from_utf8(env.bytes(path)).map_err(|_| Thrown::argument("dstl: a path is not UTF-8"))
}

fn io(error: std::io::Error) -> Thrown {
    let class = match error.kind() {
        std::io::ErrorKind::NotFound => "java/io/FileNotFoundException",
        std::io::ErrorKind::AlreadyExists => "java/nio/file/FileAlreadyExistsException",
        _ => "java/io/IOException",
    };
    Thrown {
        class,
        message: format!("dstl: {error}"),
    }
}

jni_entry_points! { "Native":
    /// `long openObjectStore(byte[] settings, byte[] bucket)`: a client for `bucket` from the
    /// `key\0value\0` pairs of the `state.changelog.dstl.s3.*` keys (an unknown key fails
    /// naming it); checks the credentials with one request.
    fn openObjectStore(env, _class, settings: jbyteArray, bucket: jbyteArray) -> jlong {
        entry(env, OPERATION, 0, |env| {
            let config = crate::configuration(env, settings)?;
            let bucket = path(env, bucket)?;
            let store = S3Store::open_bucket(&config.s3(), &bucket)
                .map_err(|e| Thrown::io(format!("dstl: {}", dstl::describe(&e))))?;
            Ok(Box::into_raw(Box::new(store)) as jlong)
        })
    }

    /// `void closeObjectStore(long store)`.
    fn closeObjectStore(env, _class, handle: jlong) {
        // From `openObjectStore`; the Java file system closes its handle once.
        crate::free_boxed::<S3Store>(env, OPERATION, handle)
    }

    /// `long[] objectStat(long store, byte[] path)`: `{size, modified ms}` of the object, or
    /// null if there is none.
    fn objectStat(env, _class, handle: jlong, object: jbyteArray) -> jlongArray {
        entry(env, OPERATION, std::ptr::null_mut(), |env| {
            let path = path(env, object)?;
            // SAFETY: live handle.
            Ok(match unsafe { store(handle) }.stat(&path).map_err(io)? {
                Some(file) => env.new_longs(&[file.size as i64, millis(&file)]),
                None => std::ptr::null_mut(),
            })
        })
    }

    /// `byte[] objectRead(long store, byte[] path, long offset, int length)`: up to `length`
    /// bytes from `offset` (fewer at the end of the object; none past it).
    fn objectRead(
        env,
        _class,
        handle: jlong,
        object: jbyteArray,
        offset: jlong,
        length: jint,
    ) -> jbyteArray {
        entry(env, OPERATION, std::ptr::null_mut(), |env| {
            let path = path(env, object)?;
            if offset < 0 || length < 0 {
                return Err(Thrown::argument(format!(
                    "dstl: cannot read {length} bytes at offset {offset} of {path}"
                )));
            }
            // SAFETY: live handle.
            let store = unsafe { store(handle) };
            let start = offset as u64;
            let end = start.saturating_add(length as u64);
            let bytes = dstl::Store::read_range(store, &path, start..end).map_err(io)?;
            Ok(env.new_bytes(&bytes))
        })
    }

    /// `byte[] objectList(long store, byte[] path)`: the objects under `path/`, each as
    /// `int length, UTF-8 path, long size, long modified ms` (big-endian, `DataInput`'s).
    fn objectList(env, _class, handle: jlong, object: jbyteArray) -> jbyteArray {
        entry(env, OPERATION, std::ptr::null_mut(), |env| {
            let path = path(env, object)?;
            // SAFETY: live handle.
            let files = unsafe { store(handle) }.list_under(&path).map_err(io)?;
            let mut out = Vec::new();
            for file in &files {
                out.extend_from_slice(&(file.path.len() as i32).to_be_bytes());
                out.extend_from_slice(file.path.as_bytes());
                out.extend_from_slice(&(file.size as i64).to_be_bytes());
                out.extend_from_slice(&millis(file).to_be_bytes());
            }
            Ok(env.new_bytes(&out))
        })
    }

    /// `void objectDelete(long store, byte[] path)`: a missing object is no error.
    fn objectDelete(env, _class, handle: jlong, object: jbyteArray) {
        entry(env, OPERATION, (), |env| {
            let path = path(env, object)?;
            // SAFETY: live handle.
            dstl::Store::delete(unsafe { store(handle) }, &path).map_err(io)
        })
    }

    /// `void objectPut(long store, byte[] path, byte[] data, int length, boolean overwrite)`:
    /// writes the first `length` bytes of `data` as the object, whole; without `overwrite`, an
    /// existing object fails with `java.nio.file.FileAlreadyExistsException`.
    fn objectPut(
        env,
        _class,
        handle: jlong,
        object: jbyteArray,
        data: jbyteArray,
        length: jint,
        overwrite: jboolean,
    ) {
        entry(env, OPERATION, (), |env| {
            let path = path(env, object)?;
            // SAFETY: live handle.
            let store = unsafe { store(handle) };
            env.with_bytes(data, |bytes| {
                let bytes = &bytes[..(length.max(0) as usize).min(bytes.len())];
                store.put(&path, bytes, overwrite)
            })
            .map_err(io)
        })
    }
}

fn millis(file: &StoredFile) -> i64 {
    file.modified
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
