//! File ownership: the task registry reference-counts uploaded files that no confirmed
//! checkpoint owns yet ([`TaskRegistry`]), the local registry owns local copies per
//! writer and checkpoint ([`LocalRegistry`]), and a bounded pool deletes what nobody owns
//! any more ([`Discarder`]).

mod discard;
mod local;
mod task;

use dstl_proto::types::UploadResult;

pub(crate) use discard::Discarder;
pub use local::LocalRegistry;
pub use task::TaskRegistry;

/// Identifies one writer of a storage (in the local registry, where ownership is per
/// writer).
pub use dstl_proto::ownership::WriterId;

/// Both registries: where a writer's release of a file goes.
#[derive(Clone)]
pub(crate) struct Registries {
    pub task: TaskRegistry,
    pub local: LocalRegistry,
}

impl Registries {
    /// Writer `writer` no longer needs one change set in `path`: a store file's count is
    /// in the task registry, a local copy's claim in the local registry.
    pub fn release(&self, writer: WriterId, path: &str, local: bool) {
        if local {
            self.local.release(writer, path);
        } else {
            self.task.release(path);
        }
    }

    /// Releases every file reference `results` of `writer` hold (it cannot take them).
    pub fn release_results(&self, writer: WriterId, results: &[UploadResult]) {
        for result in results {
            self.release(writer, &result.remote.path, false);
            if let Some(local) = &result.local {
                self.release(writer, &local.handle.path, true);
            }
        }
    }
}
