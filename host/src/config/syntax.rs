//! Flink's value syntax (`5mb`, `10 ms`) and TOML files flattened into `key=value` pairs.

use std::time::Duration;

/// A TOML value that is not a setting: an array, a date, a float.
#[derive(Debug, thiserror::Error)]
#[error("`{key}` has a {kind} value; use a string, a number or a boolean")]
pub(super) struct NotASetting {
    key: String,
    kind: &'static str,
}

/// Appends every setting of `value` (a table, nested or dotted) to `out` as `key=value`.
pub(super) fn flatten(
    prefix: &str,
    value: &toml::Value,
    out: &mut Vec<(String, String)>,
) -> Result<(), NotASetting> {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out)?;
            }
        }
        toml::Value::String(s) => out.push((prefix.to_string(), s.clone())),
        toml::Value::Integer(i) => out.push((prefix.to_string(), i.to_string())),
        toml::Value::Boolean(b) => out.push((prefix.to_string(), b.to_string())),
        other => {
            return Err(NotASetting {
                key: prefix.to_string(),
                kind: other.type_str(),
            });
        }
    }
    Ok(())
}

fn split_number(value: &str) -> Option<(u64, String)> {
    let digits = value.bytes().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 {
        return None;
    }
    let number = value[..digits].parse().ok()?;
    Some((number, value[digits..].trim().to_ascii_lowercase()))
}

/// Parses Flink's `MemorySize` syntax (units are powers of 1024).
pub fn parse_memory(value: &str) -> Option<u64> {
    let (n, unit) = split_number(value.trim())?;
    let shift = match unit.as_str() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" | "kibibytes" => 10,
        "m" | "mb" | "mib" | "mebibytes" => 20,
        "g" | "gb" | "gib" | "gibibytes" => 30,
        "t" | "tb" | "tib" | "tebibytes" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// Parses Flink's duration syntax; a bare number is milliseconds.
pub fn parse_duration(value: &str) -> Option<Duration> {
    let (n, unit) = split_number(value.trim())?;
    Some(match unit.as_str() {
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => Duration::from_millis(n),
        "ns" | "nano" | "nanos" | "nanosecond" | "nanoseconds" => Duration::from_nanos(n),
        "us" | "µs" | "micro" | "micros" | "microsecond" | "microseconds" => {
            Duration::from_micros(n)
        }
        "s" | "sec" | "secs" | "second" | "seconds" => Duration::from_secs(n),
        "m" | "min" | "mins" | "minute" | "minutes" => Duration::from_secs(n.checked_mul(60)?),
        "h" | "hour" | "hours" => Duration::from_secs(n.checked_mul(3600)?),
        "d" | "day" | "days" => Duration::from_secs(n.checked_mul(86400)?),
        _ => return None,
    })
}
