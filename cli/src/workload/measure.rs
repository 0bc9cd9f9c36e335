//! Measurements around a run: memory of the process and the disk's own speed.

use std::time::Instant;

use anyhow::Context;

/// Peak resident set size of this process in MB.
pub fn peak_rss_mb() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    usage.ru_maxrss as f64 / 1024.0
}

/// Resident set size of this process now, in MB (Linux; 0 elsewhere).
pub fn current_rss_mb() -> f64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: f64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
    pages * page / 1e6
}

/// Sequential write speed of the disk under `dir`: `bytes` written with plain 1 MiB
/// writes, then one fsync if `fsync`, in MB/s. The baselines the benchmarks compare
/// against: buffered (the page cache) for `dstl.dfs.local.fsync=false`, fsync'd for the
/// durable default.
pub fn disk_baseline_mb_per_s(
    dir: &std::path::Path,
    bytes: u64,
    fsync: bool,
) -> anyhow::Result<f64> {
    use std::io::Write;
    let path = dir.join(format!("baseline-{}", uuid::Uuid::new_v4()));
    let chunk = vec![0x5au8; 1 << 20];
    let started = Instant::now();
    {
        let mut file = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            file.write_all(&chunk[..n])?;
            left -= n as u64;
        }
        if fsync {
            file.sync_all()?;
        }
    }
    let elapsed = started.elapsed();
    std::fs::remove_file(&path)?;
    Ok(bytes as f64 / 1e6 / elapsed.as_secs_f64())
}

/// Sequential write speed of the disk under `dir` past the page cache: `bytes` written
/// with `O_DIRECT` in aligned 4 MiB writes, then one `fdatasync`, in MB/s (what a durable
/// writer that skips the page cache can reach). `None` where the file system refuses
/// `O_DIRECT`.
pub fn direct_baseline_mb_per_s(dir: &std::path::Path, bytes: u64) -> anyhow::Result<Option<f64>> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const CHUNK: usize = 4 << 20;
    const ALIGN: usize = 4096;
    let path = dir.join(format!("baseline-direct-{}", uuid::Uuid::new_v4()));
    // O_DIRECT wants an aligned address: the aligned CHUNK bytes inside a larger buffer.
    let backing = vec![0x5au8; CHUNK + ALIGN];
    let start = backing.as_ptr().align_offset(ALIGN);
    let chunk = &backing[start..start + CHUNK];
    let result = (|| {
        let file = match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", path.display())),
        };
        let total = bytes.div_ceil(ALIGN as u64) * ALIGN as u64;
        let started = Instant::now();
        let mut offset = 0u64;
        while offset < total {
            let n = (total - offset).min(CHUNK as u64) as usize;
            file.write_all_at(&chunk[..n], offset)?;
            offset += n as u64;
        }
        file.sync_data()?;
        let elapsed = started.elapsed();
        Ok(Some(bytes as f64 / 1e6 / elapsed.as_secs_f64()))
    })();
    let _ = std::fs::remove_file(&path);
    result
}
