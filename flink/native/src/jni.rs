//! The few raw JNI calls the entry points need, on `jni-sys`. The hot path (an append)
//! touches no JNI function at all; a batch takes one call back into the Java writer, which
//! writes its values into a direct buffer over the sandbox's memory (`call_with_buffer`).

use std::ffi::CString;

use jni_sys::{
    JNIEnv, jbyteArray, jclass, jlong, jlongArray, jmethodID, jobject, jsize, jthrowable, jvalue,
};

/// The calling thread's JNI environment, valid for one native call.
#[derive(Clone, Copy)]
pub struct Env(pub *mut JNIEnv);

impl Env {
    fn table(&self) -> &jni_sys::JNINativeInterface__1_6 {
        // SAFETY: the JVM hands every native method a valid environment pointer, and a
        // Java 17 VM implements at least the 1.6 function table.
        unsafe { &(**self.0).v1_6 }
    }

    /// Throws a new `class` (a JNI class name such as `java/io/IOException`) with
    /// `message`, unless an exception is already pending.
    pub fn throw(&self, class: &str, message: &str) {
        let t = self.table();
        // SAFETY: valid env; the strings live across the calls.
        unsafe {
            if (t.ExceptionCheck)(self.0) {
                return;
            }
            let class = CString::new(class).expect("class names hold no NUL");
            let message = CString::new(message.replace('\0', "\\0")).expect("NULs escaped");
            let cls = (t.FindClass)(self.0, class.as_ptr());
            if cls.is_null() {
                return; // FindClass left a NoClassDefFoundError pending.
            }
            (t.ThrowNew)(self.0, cls, message.as_ptr());
            (t.DeleteLocalRef)(self.0, cls);
        }
    }

    /// Whether the calling Java thread was interrupted, by `Native.interrupted()` (a static
    /// method of `class`, the class of the running native method); true if it cannot be
    /// asked (the exception that said so is cleared), so a wait never outlives a broken
    /// VM call.
    pub fn thread_interrupted(&self, class: jclass) -> bool {
        let t = self.table();
        // SAFETY: valid env of the calling thread; `class` is the live class reference the
        // native method was called with; the name and signature are NUL-terminated.
        unsafe {
            let method =
                (t.GetStaticMethodID)(self.0, class, c"interrupted".as_ptr(), c"()Z".as_ptr());
            if method.is_null() || (t.ExceptionCheck)(self.0) {
                (t.ExceptionClear)(self.0);
                return true;
            }
            let interrupted = (t.CallStaticBooleanMethodA)(self.0, class, method, std::ptr::null());
            if (t.ExceptionCheck)(self.0) {
                (t.ExceptionClear)(self.0);
                return true;
            }
            interrupted
        }
    }

    /// The bytes of a Java `byte[]` (copied).
    pub fn bytes(&self, array: jbyteArray) -> Vec<u8> {
        if array.is_null() {
            return Vec::new();
        }
        let t = self.table();
        // SAFETY: `array` is a live byte[] reference of this call; the region copied is
        // exactly its length.
        unsafe {
            let len = (t.GetArrayLength)(self.0, array).max(0) as usize;
            let mut out = vec![0u8; len];
            (t.GetByteArrayRegion)(self.0, array, 0, len as jsize, out.as_mut_ptr().cast());
            out
        }
    }

    /// Runs `f` on the elements of a Java `byte[]` without copying them when the VM
    /// allows (the array is released without write-back).
    pub fn with_bytes<R>(&self, array: jbyteArray, f: impl FnOnce(&[u8]) -> R) -> R {
        if array.is_null() {
            return f(&[]);
        }
        let t = self.table();
        // SAFETY: as in `bytes`; `JNI_ABORT` releases without copying back.
        unsafe {
            let len = (t.GetArrayLength)(self.0, array).max(0) as usize;
            let ptr = (t.GetByteArrayElements)(self.0, array, std::ptr::null_mut());
            if ptr.is_null() {
                return f(&[]);
            }
            let slice = std::slice::from_raw_parts(ptr.cast::<u8>(), len);
            let result = f(slice);
            (t.ReleaseByteArrayElements)(self.0, array, ptr, jni_sys::JNI_ABORT);
            result
        }
    }

    /// A new Java `byte[]` holding `data`; null (with an `OutOfMemoryError` pending) if
    /// the VM cannot allocate it.
    pub fn new_bytes(&self, data: &[u8]) -> jbyteArray {
        let t = self.table();
        // SAFETY: valid env; the region written is the new array's whole length.
        unsafe {
            let array = (t.NewByteArray)(self.0, data.len() as jsize);
            if !array.is_null() {
                (t.SetByteArrayRegion)(self.0, array, 0, data.len() as jsize, data.as_ptr().cast());
            }
            array
        }
    }

    /// A new Java `long[]` holding `data`.
    pub fn new_longs(&self, data: &[i64]) -> jlongArray {
        let t = self.table();
        // SAFETY: as in `new_bytes`.
        unsafe {
            let array = (t.NewLongArray)(self.0, data.len() as jsize);
            if !array.is_null() {
                (t.SetLongArrayRegion)(
                    self.0,
                    array,
                    0,
                    data.len() as jsize,
                    data.as_ptr() as *const jlong,
                );
            }
            array
        }
    }

    /// The address and capacity of a direct `ByteBuffer`; `None` for a heap buffer.
    pub fn direct_buffer(&self, buffer: jobject) -> Option<(*mut u8, usize)> {
        if buffer.is_null() {
            return None;
        }
        let t = self.table();
        // SAFETY: valid env and a live reference of this call.
        unsafe {
            let address = (t.GetDirectBufferAddress)(self.0, buffer);
            let capacity = (t.GetDirectBufferCapacity)(self.0, buffer);
            (!address.is_null() && capacity >= 0).then_some((address.cast(), capacity as usize))
        }
    }

    /// The id of the instance method `name` with `signature` of `object`'s class; `None`
    /// (the `NoSuchMethodError` cleared) if it has none.
    pub fn method(
        &self,
        object: jobject,
        name: &std::ffi::CStr,
        signature: &std::ffi::CStr,
    ) -> Option<jmethodID> {
        let t = self.table();
        // SAFETY: valid env, a live reference of this call, NUL-terminated strings.
        unsafe {
            let class = (t.GetObjectClass)(self.0, object);
            if class.is_null() {
                return None;
            }
            let method = (t.GetMethodID)(self.0, class, name.as_ptr(), signature.as_ptr());
            (t.DeleteLocalRef)(self.0, class);
            if method.is_null() || (t.ExceptionCheck)(self.0) {
                (t.ExceptionClear)(self.0);
                return None;
            }
            Some(method)
        }
    }

    /// Calls the `void (ByteBuffer)` method `method` of `object` with a direct buffer over
    /// `bytes`, for the length of the call. An exception it throws is taken out of the
    /// pending state and returned (a local reference), so the native call goes on
    /// without one pending and rethrows it at the end ([`Env::rethrow`]); `Err(None)` if
    /// the VM made no direct buffer and threw nothing (the method was not called).
    pub fn call_with_buffer(
        &self,
        object: jobject,
        method: jmethodID,
        bytes: &mut [u8],
    ) -> Result<(), Option<jthrowable>> {
        let t = self.table();
        // SAFETY: valid env; `object` and `method` are a live reference of this call and a
        // method of its class taking a ByteBuffer; the buffer covers exactly `bytes`,
        // which stay valid and unaliased for the call (the Java side keeps no reference
        // to the buffer past it).
        unsafe {
            let buffer =
                (t.NewDirectByteBuffer)(self.0, bytes.as_mut_ptr().cast(), bytes.len() as jlong);
            if !buffer.is_null() {
                let args = [jvalue { l: buffer }];
                (t.CallVoidMethodA)(self.0, object, method, args.as_ptr());
                (t.DeleteLocalRef)(self.0, buffer);
            }
            let thrown = (t.ExceptionOccurred)(self.0);
            if !thrown.is_null() {
                (t.ExceptionClear)(self.0);
                return Err(Some(thrown));
            }
            match buffer.is_null() {
                true => Err(None),
                false => Ok(()),
            }
        }
    }

    /// Makes `thrown` (from [`Env::call_with_buffer`]) pending again.
    pub fn rethrow(&self, thrown: jthrowable) {
        let t = self.table();
        // SAFETY: valid env and a live local reference of this call.
        unsafe {
            (t.Throw)(self.0, thrown);
        }
    }
}
