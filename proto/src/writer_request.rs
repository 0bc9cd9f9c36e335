//! What a host checks before it creates a writer: its name, its key groups and its
//! sandbox's limits, against the storage's settings. Both hosts ask here (the Node host
//! through the rules component, WIT `settings.check-writer`), so a writer is refused
//! alike, in the same words, on every host.

use std::time::Duration;

use crate::types::KeyGroupRange;

/// Longest writer name, in bytes.
pub const MAX_NAME_LEN: usize = 256;
/// Least memory a writer's sandbox starts with: the component's initial memory and
/// stack, and room for a first change set.
pub const MIN_MEMORY_LIMIT: u64 = 2 << 20;
/// Shortest per-call deadline: below it, scheduling noise alone would trap writers.
pub const MIN_CALL_TIMEOUT: Duration = Duration::from_millis(1);

/// A writer a host is asked to create, with its effective limits (the writer's own or
/// the storage's defaults).
#[derive(Debug, Clone, Copy)]
pub struct WriterRequest<'a> {
    /// The operator's name.
    pub name: &'a str,
    /// The key groups it writes.
    pub key_group_range: KeyGroupRange,
    /// Its sandbox's memory cap, in bytes.
    pub memory_limit: u64,
    /// Its per-call deadline.
    pub call_timeout: Duration,
}

/// Why a writer is not created; the message names the value and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidWriter {
    /// Empty, too long, or with control characters (names go into logs and file names).
    #[error(
        "invalid writer name {0:?}: need 1 to {MAX_NAME_LEN} characters and no control characters"
    )]
    Name(String),
    /// Not `0 <= start <= end`.
    #[error("invalid key-group range [{start}, {end}] for writer {name}: need 0 <= start <= end")]
    KeyGroupRange {
        /// The writer.
        name: String,
        /// First key group asked for.
        start: i32,
        /// Last key group asked for.
        end: i32,
    },
    /// Above the storage's `dstl.writer.memory-limit`.
    #[error(
        "memory limit {limit} of writer {name} exceeds the storage's dstl.writer.memory-limit {storage}"
    )]
    MemoryAboveStorage {
        /// The writer.
        name: String,
        /// Its limit.
        limit: u64,
        /// The storage's.
        storage: u64,
    },
    /// Below [`MIN_MEMORY_LIMIT`].
    #[error(
        "memory limit {limit} of writer {name} is below {} MiB ({MIN_MEMORY_LIMIT} bytes), the least a writer starts with",
        MIN_MEMORY_LIMIT >> 20
    )]
    MemoryBelowStart {
        /// The writer.
        name: String,
        /// Its limit.
        limit: u64,
    },
    /// Below [`MIN_CALL_TIMEOUT`].
    #[error(
        "call timeout {timeout:?} of writer {name} is below {} ms",
        MIN_CALL_TIMEOUT.as_millis()
    )]
    CallTimeout {
        /// The writer.
        name: String,
        /// Its deadline.
        timeout: Duration,
    },
}

/// The key-group range rule alone (the writer checks its own configuration with it).
pub fn check_key_group_range(name: &str, range: KeyGroupRange) -> Result<(), InvalidWriter> {
    if range.start < 0 || range.start > range.end {
        return Err(InvalidWriter::KeyGroupRange {
            name: name.to_string(),
            start: range.start,
            end: range.end,
        });
    }
    Ok(())
}

impl WriterRequest<'_> {
    /// Checks the request against the storage's `dstl.writer.memory-limit`, in the order
    /// the errors are listed.
    pub fn check(&self, storage_memory_limit: u64) -> Result<(), InvalidWriter> {
        let name = self.name;
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(InvalidWriter::Name(name.to_string()));
        }
        check_key_group_range(name, self.key_group_range)?;
        if self.memory_limit > storage_memory_limit {
            return Err(InvalidWriter::MemoryAboveStorage {
                name: name.to_string(),
                limit: self.memory_limit,
                storage: storage_memory_limit,
            });
        }
        if self.memory_limit < MIN_MEMORY_LIMIT {
            return Err(InvalidWriter::MemoryBelowStart {
                name: name.to_string(),
                limit: self.memory_limit,
            });
        }
        if self.call_timeout < MIN_CALL_TIMEOUT {
            return Err(InvalidWriter::CallTimeout {
                name: name.to_string(),
                timeout: self.call_timeout,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(name: &str) -> WriterRequest<'_> {
        WriterRequest {
            name,
            key_group_range: KeyGroupRange { start: 0, end: 7 },
            memory_limit: 64 << 20,
            call_timeout: Duration::from_secs(10),
        }
    }

    #[test]
    fn a_good_request_passes() {
        assert_eq!(request("op-1").check(256 << 20), Ok(()));
        let long = "x".repeat(MAX_NAME_LEN);
        assert_eq!(request(&long).check(256 << 20), Ok(()));
    }

    #[test]
    fn each_rule_names_the_value() {
        let cases: Vec<(WriterRequest, &str)> = vec![
            (
                request(""),
                "invalid writer name \"\": need 1 to 256 characters",
            ),
            (request("a\nb"), "invalid writer name \"a\\nb\""),
            (
                WriterRequest {
                    key_group_range: KeyGroupRange { start: 5, end: 4 },
                    ..request("op")
                },
                "invalid key-group range [5, 4] for writer op: need 0 <= start <= end",
            ),
            (
                WriterRequest {
                    memory_limit: 512 << 20,
                    ..request("op")
                },
                "memory limit 536870912 of writer op exceeds the storage's dstl.writer.memory-limit 268435456",
            ),
            (
                WriterRequest {
                    memory_limit: 1 << 20,
                    ..request("op")
                },
                "memory limit 1048576 of writer op is below 2 MiB",
            ),
            (
                WriterRequest {
                    call_timeout: Duration::from_micros(500),
                    ..request("op")
                },
                "call timeout 500µs of writer op is below 1 ms",
            ),
        ];
        for (request, expected) in cases {
            let message = request.check(256 << 20).unwrap_err().to_string();
            assert!(message.starts_with(expected), "{message}");
        }
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            request(&long).check(256 << 20),
            Err(InvalidWriter::Name(_))
        ));
    }
}
