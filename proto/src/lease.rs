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
/// How long a holder may go without a successful refresh before it must treat its lease
/// as lapsed: the expiry less the clock skew gc is allowed, so a lease the holder still
/// trusts has not expired by gc's clock either. After a lapse, gc may have collected the
/// job's files; a lease without fencing cannot tell, so the holder must not acknowledge a
/// checkpoint that names a file written before it (the host fails such persists).
pub const LAPSES_AFTER: Duration = EXPIRES_AFTER.saturating_sub(CLOCK_SKEW);

/// What a lease file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRecord {
    /// When the storage opened, in milliseconds since the Unix epoch (its clock).
    pub opened_ms: u64,
    /// How long the lease protects after its last refresh, in milliseconds.
    pub expires_after_ms: u64,
    /// The holder's process id, for people reading the file (and with [`LeaseOwner`],
    /// for gc to tell that the holder died).
    pub pid: u32,
    /// Who holds the lease, precisely enough for gc on the same machine to tell that the
    /// holder is gone; absent from leases of hosts that cannot say (they are judged by
    /// time alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<LeaseOwner>,
}

/// The holding process, as a machine knows it: a process id means nothing elsewhere, and
/// is reused, so it comes with the machine's boot, the pid namespace it is counted in and
/// the process's start time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseOwner {
    /// The machine's boot (Linux: `/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// The pid namespace the pid is counted in (Linux: the target of `/proc/self/ns/pid`),
    /// so containers sharing a kernel never judge each other's processes.
    pub pid_namespace: String,
    /// When the process started, in clock ticks since boot (Linux: field 22 of
    /// `/proc/<pid>/stat`), so a pid reused by a later process is not taken for the holder.
    pub start_ticks: u64,
}

impl LeaseRecord {
    /// The record of a storage opened at `opened_ms` (its clock) by process `pid`.
    pub fn new(opened_ms: u64, pid: u32) -> Self {
        Self {
            opened_ms,
            expires_after_ms: EXPIRES_AFTER.as_millis() as u64,
            pid,
            owner: None,
        }
    }

    /// The record with who holds it.
    pub fn with_owner(mut self, owner: LeaseOwner) -> Self {
        self.owner = Some(owner);
        self
    }

    /// Whether the lease still protects its job: its file was last refreshed `age` ago,
    /// within the expiry, and its holder is not known to be gone (see
    /// [`LeaseRecord::holder_gone`]). A lease that no longer protects is an orphan itself.
    pub fn protects(&self, age: Duration, holder_gone: bool) -> bool {
        !holder_gone && age < self.expires_after()
    }

    /// Whether the holder is known to be gone, so the lease protects nothing even before
    /// it expires: it ran on this machine since its last boot, in this pid namespace
    /// (`here`), and the process with its pid is gone or started at another time
    /// (`start_ticks_of(pid)`: the start time of the process with that pid now, if one
    /// runs). A lease from another machine, namespace or boot, or one without an owner,
    /// is never judged gone: its expiry decides.
    pub fn holder_gone(
        &self,
        here: Option<(&str, &str)>,
        start_ticks_of: impl FnOnce(u32) -> Option<u64>,
    ) -> bool {
        match (&self.owner, here) {
            (Some(owner), Some((boot_id, pid_namespace)))
                if owner.boot_id == boot_id && owner.pid_namespace == pid_namespace =>
            {
                start_ticks_of(self.pid) != Some(owner.start_ticks)
            }
            _ => false,
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
    fn a_record_with_its_owner_reads_back_and_older_records_still_parse() {
        let owner = LeaseOwner {
            boot_id: "b".into(),
            pid_namespace: "pid:[1]".into(),
            start_ticks: 77,
        };
        let record = LeaseRecord::new(5, 42).with_owner(owner.clone());
        assert_eq!(
            record.to_json(),
            r#"{"opened_ms":5,"expires_after_ms":600000,"pid":42,"owner":{"boot_id":"b","pid_namespace":"pid:[1]","start_ticks":77}}"#
        );
        assert_eq!(LeaseRecord::parse(record.to_json().as_bytes()), record);
        let old = LeaseRecord::parse(br#"{"opened_ms":5,"expires_after_ms":600000,"pid":42}"#);
        assert_eq!(old, LeaseRecord::new(5, 42));
    }

    #[test]
    fn only_a_holder_of_this_machine_and_namespace_is_judged_gone() {
        let owner = LeaseOwner {
            boot_id: "boot".into(),
            pid_namespace: "ns".into(),
            start_ticks: 10,
        };
        let record = LeaseRecord::new(0, 7).with_owner(owner);
        let here = Some(("boot", "ns"));
        // The holder runs: its pid started when it says.
        assert!(!record.holder_gone(here, |pid| (pid == 7).then_some(10)));
        // No process with its pid, or one started later (the pid was reused).
        assert!(record.holder_gone(here, |_| None));
        assert!(record.holder_gone(here, |_| Some(11)));
        // Another boot, another namespace, a host that cannot tell: time decides.
        assert!(!record.holder_gone(Some(("other", "ns")), |_| None));
        assert!(!record.holder_gone(Some(("boot", "other")), |_| None));
        assert!(!record.holder_gone(None, |_| None));
        assert!(!LeaseRecord::new(0, 7).holder_gone(here, |_| None));
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
