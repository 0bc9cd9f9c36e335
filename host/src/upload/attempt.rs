//! One upload attempt: writes the change sets of a batch of tasks into one new changelog
//! file, plus a local copy with local recovery on, and computes each change set's result.
//! Retrying, batching and delivery are the scheduler's.

use std::sync::Arc;
use std::time::Instant;

use dstl_proto::codec::{self, FileWriter};
use dstl_proto::types::{LocalCopy, StreamHandle, UploadResult};

use super::buffers::BlockPool;
use super::{AttemptError, Task};
use crate::metrics::Metrics;
use crate::store::{LocalStore, Store};

/// Writes files for batches of upload tasks.
pub(crate) struct Uploader {
    pub store: Arc<dyn Store>,
    /// Buffers for compressed files, shared with the scheduler's blocks.
    pub buffers: Arc<BlockPool>,
    pub local: Option<LocalStore>,
    pub compression: bool,
    pub metrics: Arc<Metrics>,
}

/// The file of a successful attempt, not yet tracked by the registry.
pub(crate) struct UploadedFile {
    /// Results per task, in task order.
    pub per_task: Vec<Vec<UploadResult>>,
    pub remote: String,
    pub local: Option<String>,
    /// Change sets in the file: the initial reference count.
    pub change_sets: u64,
    /// Bytes on disk.
    pub written: u64,
}

impl Uploader {
    /// One attempt. A failed attempt leaves no file behind (the store's create is
    /// atomic), so a retry starts clean.
    pub fn upload(&self, tasks: &[Task]) -> Result<UploadedFile, AttemptError> {
        self.metrics.upload_requests.increment(1);
        let started = Instant::now();
        let outcome = self.write_file(tasks);
        match &outcome {
            Ok(file) => {
                self.metrics.upload_sizes.record(
                    file.per_task
                        .iter()
                        .flatten()
                        .map(|r| r.remote.file_size)
                        .next()
                        .unwrap_or(0) as f64,
                );
                self.metrics.upload_latency.record(started.elapsed());
            }
            Err(_) => self.metrics.upload_failures.increment(1),
        }
        outcome
    }

    fn write_file(&self, tasks: &[Task]) -> Result<UploadedFile, AttemptError> {
        let io = |e: std::io::Error| AttemptError::io("could not encode the changelog file", e);
        let blocks = tasks.iter().flat_map(|t| &t.change_sets).map(|c| &c.block);
        // Plain files are written straight from the blocks' pieces (from where the
        // guests lent them); compressed ones are encoded into one buffer first.
        let mut compressed: Option<Vec<u8>> = None;
        let (parts, flat_offsets, logical) = if self.compression {
            let payload: usize = blocks.clone().map(|b| b.len()).sum();
            // Room for incompressible data (Snappy's worst case plus framing), so the
            // buffer never grows while compressing.
            let out = self.buffers.take(payload + payload / 6 + 1024);
            let mut file = FileWriter::new(out, true).map_err(io)?;
            let offsets = blocks
                .map(|b| file.write_block(b.pieces()))
                .collect::<std::io::Result<Vec<_>>>()
                .map_err(io)?;
            let logical = file.position();
            let file = compressed.insert(file.finish().map_err(io)?);
            (vec![file.as_slice()], offsets, logical)
        } else {
            codec::plain_file(blocks.map(|b| b.pieces()))
        };
        let mut flat_offsets = flat_offsets.into_iter();
        let offsets: Vec<Vec<u64>> = tasks
            .iter()
            .map(|t| flat_offsets.by_ref().take(t.change_sets.len()).collect())
            .collect();
        let written: u64 = parts.iter().map(|p| p.len() as u64).sum();
        let name = uuid::Uuid::new_v4().to_string();
        let path = self.store.create_parts(&name, &parts).map_err(|e| {
            AttemptError::io(
                format!(
                    "could not write changelog file {name} to {}",
                    self.store.describe()
                ),
                e,
            )
        })?;
        let remote = StreamHandle {
            path,
            file_size: logical,
        };
        // A local copy that cannot be written degrades to a remote-only result instead of
        // failing an upload that succeeded (Flink fails it).
        let local = self
            .local
            .as_ref()
            .and_then(|local| match local.create_parts(&name, &parts) {
                Ok(path) => Some(StreamHandle {
                    path,
                    file_size: logical,
                }),
                Err(e) => {
                    tracing::warn!(file = %name, error = %e, "could not write the local copy; the result is remote only");
                    None
                }
            });
        drop(parts);
        if let Some(buffer) = compressed {
            self.buffers.put(buffer);
        }
        let per_task = tasks
            .iter()
            .zip(offsets)
            .map(|(task, task_offsets)| {
                task.change_sets
                    .iter()
                    .zip(task_offsets)
                    .map(|(change_set, offset)| UploadResult {
                        sequence_number: change_set.sequence_number,
                        remote: remote.clone(),
                        offset,
                        local: local.as_ref().map(|handle| LocalCopy {
                            handle: handle.clone(),
                            offset,
                        }),
                        size: change_set.size,
                    })
                    .collect()
            })
            .collect();
        Ok(UploadedFile {
            per_task,
            remote: remote.path,
            local: local.map(|l| l.path),
            change_sets: tasks.iter().map(|t| t.change_sets.len() as u64).sum(),
            written,
        })
    }

    /// Deletes the files of an attempt that lost (its local copy too, unlike Flink).
    pub fn discard(&self, file: UploadedFile) {
        let remote = std::iter::once((&*self.store, &file.remote));
        let local = (self.local.as_ref())
            .zip(file.local.as_ref())
            .map(|(store, path)| (store as &dyn Store, path));
        for (store, path) in remote.chain(local) {
            if let Err(e) = store.delete(path) {
                tracing::warn!(%path, error = %e, "could not delete the file of a losing upload attempt");
            }
        }
    }
}
