//! `dstl read`: every change of a snapshot, or its digest.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use dstl::manifest::Manifest;

use super::{ConfArgs, DEFAULT_DIR, hex};

pub(super) fn read(path: &Path, digest: bool, local: bool, conf: &ConfArgs) -> anyhow::Result<()> {
    let config = conf.build(DEFAULT_DIR)?;
    let manifest = Manifest::load(path)?;
    let handle = if local {
        manifest
            .local_handle()
            .with_context(|| format!("manifest {} has no local handle", path.display()))?
    } else {
        manifest.remote_handle()
    };
    let files = dstl::FileSource::new(Some(config.s3.clone()));
    let changes = dstl::reader::read_handle(&handle, &files)?;
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if digest {
        writeln!(
            out,
            "changes={} sha256={}",
            changes.len(),
            dstl::reader::digest(&changes)
        )?;
    } else {
        for change in &changes {
            writeln!(out, "{}\t{}", change.key_group, hex(&change.value))?;
        }
    }
    out.flush()?;
    Ok(())
}
