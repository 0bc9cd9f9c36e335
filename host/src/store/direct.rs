//! Durable writes that bypass the page cache (`O_DIRECT`), for the local store's fsync'd
//! creates of large files.
//!
//! A buffered write copies every byte into the page cache (the kernel's
//! `copy_folio_from_iter_atomic`: most of the CPU time of large durable uploads), and the
//! fsync that follows writes those pages back. With `O_DIRECT` the device reads the
//! bytes straight from user memory, so the file is copied once in user space, into an
//! aligned buffer recycled across files, and the fsync only has to flush the device's
//! cache and the file's size.
//!
//! `O_DIRECT` wants the memory address, the file offset and the length of every write
//! aligned to the device's logical block size; [`ALIGN`] (4 KiB) covers every common
//! one. The last write is padded up to it and the file cut back to its real length, all
//! before the fsync, so the syscall order that makes a create durable is unchanged: data,
//! size, fsync of the file, rename, fsync of the directory.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::sync::LockExt;

/// Alignment of addresses, offsets and lengths of direct writes.
pub(crate) const ALIGN: usize = 4096;

/// Bytes one direct write carries at most (the buffer's size): large enough that a
/// write's fixed cost is small against its transfer, small enough to recycle.
pub(crate) const CHUNK: usize = 4 << 20;

/// Files smaller than this are written through the page cache: one small write costs no
/// more there, and the padding of a direct write would be a large share of it.
pub(crate) const MIN_DIRECT_FILE: u64 = 256 << 10;

/// A heap buffer of [`CHUNK`] bytes aligned to [`ALIGN`].
pub(crate) struct AlignedBuffer {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively, like a `Vec<u8>`.
unsafe impl Send for AlignedBuffer {}

impl AlignedBuffer {
    fn layout() -> Layout {
        Layout::from_size_align(CHUNK, ALIGN).expect("CHUNK and ALIGN make a valid layout")
    }

    fn new() -> Self {
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(Self::layout()) };
        let ptr =
            NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(Self::layout()));
        Self { ptr, len: 0 }
    }

    fn spare(&self) -> usize {
        CHUNK - self.len
    }

    /// Appends as much of `bytes` as fits; returns how much did.
    fn fill(&mut self, bytes: &[u8]) -> usize {
        let n = bytes.len().min(self.spare());
        // SAFETY: `len + n <= CHUNK`, inside the allocation; `bytes` cannot overlap it.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(self.len), n)
        };
        self.len += n;
        n
    }

    /// The first `len` bytes (`len <= CHUNK`), including any zeroed padding after the
    /// filled part.
    fn bytes(&self, len: usize) -> &[u8] {
        assert!(len <= CHUNK);
        // SAFETY: inside the allocation, which is initialized (zeroed, then written).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), len) }
    }

    /// Zeroes `len..up_to`, the padding of a last write.
    fn zero_tail(&mut self, up_to: usize) {
        assert!(self.len <= up_to && up_to <= CHUNK);
        // SAFETY: inside the allocation.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(self.len), 0, up_to - self.len) };
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout()) };
    }
}

/// Recycled aligned buffers: one per create running at once, kept between files.
#[derive(Default)]
pub(crate) struct BufferPool {
    spare: Mutex<Vec<AlignedBuffer>>,
}

/// Buffers kept between creates (the upload threads of a storage rarely exceed this).
const KEPT: usize = 8;

impl BufferPool {
    fn take(&self) -> AlignedBuffer {
        self.spare.locked().pop().unwrap_or_else(AlignedBuffer::new)
    }

    fn put(&self, mut buffer: AlignedBuffer) {
        buffer.len = 0;
        let mut spare = self.spare.locked();
        if spare.len() < KEPT {
            spare.push(buffer);
        }
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("spare", &self.spare.lock().map(|s| s.len()).unwrap_or(0))
            .finish()
    }
}

/// Creates the new, empty file `path` for direct writes. Fails with `EINVAL` where the
/// file system refuses `O_DIRECT`.
pub(crate) fn create_new(path: &std::path::Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

/// A direct write that wrote less than asked, ending off the alignment: the rest cannot
/// follow directly (its offset would be misaligned, which the kernel refuses with the
/// same `EINVAL` as a file system without `O_DIRECT`). The caller writes this file
/// through the page cache instead; direct writes stay on for the next.
#[derive(Debug, thiserror::Error)]
#[error(
    "a direct write of {asked} bytes at offset {offset} wrote {written}, off the {ALIGN}-byte alignment"
)]
pub(crate) struct ShortWrite {
    offset: u64,
    asked: usize,
    written: usize,
}

impl ShortWrite {
    /// Whether `error` is one.
    pub(crate) fn is(error: &std::io::Error) -> bool {
        error
            .get_ref()
            .is_some_and(|inner| inner.downcast_ref::<ShortWrite>().is_some())
    }
}

/// Writes all of `bytes` (aligned: address, `offset` and length) at `offset`. A short
/// write that ends on the alignment goes on from there; one that does not fails with
/// [`ShortWrite`].
fn write_aligned(file: &File, mut bytes: &[u8], mut offset: u64) -> std::io::Result<()> {
    while !bytes.is_empty() {
        match file.write_at(bytes, offset) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) if n == bytes.len() => return Ok(()),
            Ok(n) if n.is_multiple_of(ALIGN) => {
                bytes = &bytes[n..];
                offset += n as u64;
            }
            Ok(n) => {
                return Err(std::io::Error::other(ShortWrite {
                    offset,
                    asked: bytes.len(),
                    written: n,
                }));
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes `parts` one after the other into `file`, opened with `O_DIRECT` and empty,
/// and leaves it exactly their length long. Not synced: the caller fsyncs.
pub(crate) fn write_parts(file: &File, parts: &[&[u8]], pool: &BufferPool) -> std::io::Result<u64> {
    let mut buffer = pool.take();
    let result = (|| {
        let mut offset = 0u64;
        for part in parts {
            let mut rest = *part;
            while !rest.is_empty() {
                let n = buffer.fill(rest);
                rest = &rest[n..];
                if buffer.spare() == 0 {
                    write_aligned(file, buffer.bytes(CHUNK), offset)?;
                    offset += CHUNK as u64;
                    buffer.len = 0;
                }
            }
        }
        let tail = buffer.len;
        if tail > 0 {
            let padded = tail.div_ceil(ALIGN) * ALIGN;
            buffer.zero_tail(padded);
            write_aligned(file, buffer.bytes(padded), offset)?;
        }
        let length = offset + tail as u64;
        if !tail.is_multiple_of(ALIGN) {
            file.set_len(length)?;
        }
        Ok(length)
    })();
    pool.put(buffer);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_of_every_shape_are_written_exactly() {
        let tmp = tempfile::tempdir().unwrap();
        let pool = BufferPool::default();
        let big: Vec<u8> = (0..(CHUNK * 2 + 12345)).map(|i| (i % 251) as u8).collect();
        let cases: Vec<Vec<&[u8]>> = vec![
            vec![b"x"],
            vec![&big[..ALIGN]],
            vec![&big[..CHUNK]],
            vec![b"\0", &big[..CHUNK - 1], &big[..ALIGN + 1]],
            vec![&big[..7], &big, &big[..3]],
        ];
        for (i, parts) in cases.iter().enumerate() {
            let path = tmp.path().join(format!("f{i}"));
            let file = match create_new(&path) {
                Ok(file) => file,
                // A file system without O_DIRECT (tmpfs): nothing to test here.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return,
                Err(e) => panic!("{e}"),
            };
            let length = write_parts(&file, parts, &pool).unwrap();
            let expected = parts.concat();
            assert_eq!(length, expected.len() as u64);
            assert_eq!(std::fs::read(&path).unwrap(), expected, "case {i}");
        }
        assert!(pool.spare.locked().len() == 1, "one buffer served all");
    }
}
