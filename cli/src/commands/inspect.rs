//! `dstl inspect`: a human-readable dump of one changelog file.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use dstl::codec::{self, ChangeSetReader};

use super::hex;

pub(super) fn inspect(path: &Path, values: bool) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let logical = codec::logical_bytes(&bytes)
        .with_context(|| format!("{} is not a changelog file", path.display()))?;
    // Built whole before printing, so a corrupt file prints nothing but the error.
    let mut out = Vec::new();
    writeln!(out, "file            {}", path.display())?;
    writeln!(
        out,
        "compression     {}",
        if bytes[0] == codec::FLAG_SNAPPY {
            "snappy (framed)"
        } else {
            "none"
        }
    )?;
    writeln!(out, "bytes on disk   {}", bytes.len())?;
    writeln!(out, "logical bytes   {}", logical.len())?;
    let mut offset = 0u64;
    let mut index = 0;
    while offset < logical.len() as u64 {
        let corrupt = || {
            format!(
                "{}: corrupt change set at logical offset {offset}",
                path.display()
            )
        };
        let mut reader = ChangeSetReader::new(&logical, offset).with_context(corrupt)?;
        let mut groups: Vec<(i32, usize, u64)> = Vec::new();
        let mut lines = Vec::new();
        while let Some(change) = reader.next_change().with_context(corrupt)? {
            match groups.last_mut() {
                Some(g) if g.0 == change.key_group => {
                    g.1 += 1;
                    g.2 += change.value.len() as u64;
                }
                _ => groups.push((change.key_group, 1, change.value.len() as u64)),
            }
            if values {
                lines.push(format!(
                    "      {}\t{}",
                    change.key_group,
                    hex(&change.value)
                ));
            }
        }
        let changes: usize = groups.iter().map(|g| g.1).sum();
        let payload: u64 = groups.iter().map(|g| g.2).sum();
        writeln!(
            out,
            "change set #{index} at offset {offset}: {} bytes, {} groups, {changes} changes, {payload} payload bytes",
            reader.position() - offset,
            groups.len()
        )?;
        for (key_group, count, size) in &groups {
            let label = if *key_group == codec::META_KEY_GROUP {
                "meta".to_string()
            } else {
                format!("kg {key_group}")
            };
            writeln!(out, "    {label:>8}: {count} changes, {size} bytes")?;
        }
        for line in lines {
            writeln!(out, "{line}")?;
        }
        offset = reader.position();
        index += 1;
    }
    std::io::stdout().lock().write_all(&out)?;
    Ok(())
}
