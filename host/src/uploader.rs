//! Uploads: turns upload tasks into changelog files (spec §5.1) and reports each task's
//! outcome to its writer's mailbox. Uploads run on the storage's blocking pool, never on
//! a writer's call path.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use dstl_guest::codec::FileWriter;
use dstl_guest::types::{LocalCopy, StreamHandle, UploadResult, UploadTask};

use crate::background::Outstanding;
use crate::metrics::Metrics;
use crate::registry::TaskRegistry;
use crate::store::LocalStore;
use crate::writer::{Letter, WriterShared};

/// Writes files for upload tasks.
#[derive(Clone)]
pub(crate) struct Uploader {
    pub store: LocalStore,
    pub local: Option<LocalStore>,
    pub compression: bool,
    pub registry: TaskRegistry,
    pub runtime: tokio::runtime::Handle,
    pub outstanding: Outstanding,
    pub metrics: Arc<Metrics>,
    pub closed: Arc<AtomicBool>,
}

impl Uploader {
    /// Accepts a task of `writer` and uploads it in the background.
    pub fn submit(&self, writer: Weak<WriterShared>, task: UploadTask) -> Result<(), String> {
        if self.closed.load(Ordering::Acquire) {
            return Err("the changelog storage is closed".into());
        }
        let job = self.outstanding.start();
        let this = self.clone();
        self.runtime.spawn_blocking(move || {
            let _job = job;
            let letter = match this.upload(std::slice::from_ref(&task)) {
                Ok(mut per_task) => Letter::Succeeded {
                    task: task.id,
                    results: per_task.pop().unwrap_or_default(),
                },
                Err(e) => Letter::Failed {
                    task: task.id,
                    cause: e,
                },
            };
            match writer.upgrade() {
                Some(writer) => writer.post(letter),
                None => {
                    if let Letter::Succeeded { results, .. } = letter {
                        release_results(&this.registry, &results);
                    }
                }
            }
        });
        Ok(())
    }

    /// Writes one file holding every change set of `tasks`, in task order, and returns
    /// the results per task. Registers the file (and its local copy) with a reference
    /// per change set.
    pub fn upload(&self, tasks: &[UploadTask]) -> Result<Vec<Vec<UploadResult>>, String> {
        self.metrics.request();
        let started = Instant::now();
        let outcome = self.write_file(tasks);
        match &outcome {
            Ok((_, logical, written)) => {
                self.metrics
                    .success(*logical, *written, started.elapsed().as_nanos() as u64)
            }
            Err(_) => self.metrics.failure(),
        }
        outcome.map(|(results, _, _)| results)
    }

    fn write_file(
        &self,
        tasks: &[UploadTask],
    ) -> Result<(Vec<Vec<UploadResult>>, u64, u64), String> {
        let payload: usize = tasks
            .iter()
            .flat_map(|t| &t.change_sets)
            .map(|c| c.block.len())
            .sum();
        let mut file = FileWriter::new(Vec::with_capacity(payload + 1), self.compression)
            .map_err(|e| e.to_string())?;
        let mut offsets = Vec::with_capacity(tasks.len());
        for task in tasks {
            let mut task_offsets = Vec::with_capacity(task.change_sets.len());
            for change_set in &task.change_sets {
                task_offsets.push(
                    file.write_block(&change_set.block)
                        .map_err(|e| e.to_string())?,
                );
            }
            offsets.push(task_offsets);
        }
        let logical = file.position();
        let bytes = file.finish().map_err(|e| e.to_string())?;
        let name = uuid::Uuid::new_v4().to_string();
        let path = self.store.create(&name, &bytes).map_err(|e| {
            format!(
                "could not write changelog file {}: {e}",
                self.store.dir().join(&name).display()
            )
        })?;
        let count: u64 = tasks.iter().map(|t| t.change_sets.len() as u64).sum();
        let remote = StreamHandle {
            path: path.to_string_lossy().into_owned(),
            file_size: logical,
        };
        self.registry.start_tracking(&remote.path, count);
        // A local copy that cannot be written degrades to a remote-only result instead of
        // failing an upload that succeeded (Flink fails it, spec §12.4).
        let local = self.local.as_ref().and_then(|local| match local.create(&name, &bytes) {
            Ok(path) => {
                let handle = StreamHandle {
                    path: path.to_string_lossy().into_owned(),
                    file_size: logical,
                };
                self.registry.start_tracking(&handle.path, count);
                Some(handle)
            }
            Err(e) => {
                tracing::warn!(file = %name, error = %e, "could not write the local copy; the result is remote only");
                None
            }
        });
        let results = tasks
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
        Ok((results, logical, bytes.len() as u64))
    }
}

/// Releases every file reference held by `results` (their writer is gone).
pub(crate) fn release_results(registry: &TaskRegistry, results: &[UploadResult]) {
    for result in results {
        registry.release(&result.remote.path);
        if let Some(local) = &result.local {
            registry.release(&local.handle.path);
        }
    }
}
