//! The lease record: while a storage is open, a small file `<job>/leases/<id>.lease` says
//! so, and `dstl gc` leaves alone every file of the job written since the lease was
//! taken. This module is the only place that knows the record and its terms; both hosts
//! write it (the Node host through the rules component, WIT interface `records`), and
//! writing, refreshing and removing the file is theirs.
//!
//! Why a lease: a writer keeps uploaded change sets for its next snapshot, and a file
//! only gets a manifest once a checkpoint that names it completes. When no checkpoint
//! completes for longer than gc's grace period (declined or aborted checkpoints,
//! pre-emptive uploads, a slow coordinator), the file looks like an orphan by age alone,
//! yet the next acknowledged checkpoint names it. A storage only ever holds files it
//! wrote itself, so everything of the job modified since its lease was opened is what it
//! may hold.
//!
//! The holder refreshes the lease's modification time every [`REFRESH`]; a lease not
//! refreshed for its `expires_after` (a process that died without closing) no longer
//! protects anything, and gc may remove it. Closing the storage removes the lease.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Directory of the leases, beside `dstl/` in a job's directory.
pub const LEASE_DIR: &str = "leases";
/// Suffix of a lease file.
pub const LEASE_SUFFIX: &str = ".lease";
/// How often the holder refreshes its lease.
pub const REFRESH: Duration = Duration::from_secs(30);
/// How long a lease protects the job's files after its last refresh: long enough that a
/// process paused for minutes (a long GC pause, a stopped container) keeps its files.
pub const EXPIRES_AFTER: Duration = Duration::from_secs(600);
/// Clock difference between the lease's writer and the store tolerated by gc: files
/// modified up to this long before the lease was opened are protected too.
pub const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// What a lease file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// When the storage opened, in milliseconds since the Unix epoch (its clock).
    pub opened_ms: u64,
    /// How long the lease protects after its last refresh, in milliseconds.
    pub expires_after_ms: u64,
    /// The holder's process id, for people reading the file.
    pub pid: u32,
}

impl LeaseRecord {
    /// The record of a storage opened at `opened_ms` (its clock) by process `pid`.
    pub fn new(opened_ms: u64, pid: u32) -> Self {
        Self {
            opened_ms,
            expires_after_ms: EXPIRES_AFTER.as_millis() as u64,
            pid,
        }
    }

    /// The lease file's text.
    pub fn to_json(&self) -> String {
        // Three integers always serialize.
        serde_json::to_string(self).expect("a lease record serializes")
    }

    /// Parses a lease file. Unreadable content protects the whole job for the default
    /// expiry (a lease that cannot be understood must not be ignored).
    pub fn parse(bytes: &[u8]) -> Self {
        serde_json::from_slice(bytes).unwrap_or(Self::new(0, 0))
    }

    /// When the holder opened; the epoch for a time out of range (protecting everything
    /// rather than failing on a damaged lease).
    pub fn opened(&self) -> SystemTime {
        UNIX_EPOCH
            .checked_add(Duration::from_millis(self.opened_ms))
            .unwrap_or(UNIX_EPOCH)
    }

    /// How long the lease protects after its last refresh.
    pub fn expires_after(&self) -> Duration {
        Duration::from_millis(self.expires_after_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back() {
        let record = LeaseRecord::new(1_700_000_000_000, 42);
        assert_eq!(
            record.to_json(),
            r#"{"opened_ms":1700000000000,"expires_after_ms":600000,"pid":42}"#
        );
        assert_eq!(LeaseRecord::parse(record.to_json().as_bytes()), record);
    }

    #[test]
    fn a_damaged_lease_protects_everything_instead_of_failing() {
        let garbage = LeaseRecord::parse(b"{\"opened_ms\": ");
        assert_eq!(garbage.opened(), UNIX_EPOCH);
        assert_eq!(garbage.expires_after(), EXPIRES_AFTER);
        let huge = LeaseRecord::parse(
            format!(
                "{{\"opened_ms\": {}, \"expires_after_ms\": 1, \"pid\": 1}}",
                u64::MAX
            )
            .as_bytes(),
        );
        // Far in the future, without overflowing (gc treats that as damaged).
        assert!(huge.opened() > SystemTime::now());
    }
}
