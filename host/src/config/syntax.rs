//! TOML files flattened into `key=value` pairs (the value syntax is
//! `dstl_proto::settings`').

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
