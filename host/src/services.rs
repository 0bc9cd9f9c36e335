//! What every writer of a storage shares and its sandbox's imports use: the configuration,
//! the upload scheduler, the registries, the deletion pool and the metrics (with the
//! bounded set of writer labels).

use std::sync::Arc;

use crate::background::Outstanding;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::registry::{Discarder, Registries};
use crate::store::lease::LeaseWatch;
use crate::telemetry::WriterLabels;
use crate::upload::Scheduler;

/// The services of one storage.
pub(crate) struct Services {
    pub config: Config,
    pub scheduler: Arc<Scheduler>,
    pub registries: Registries,
    /// The holder's side of the job's lease: whether a snapshot may be acknowledged.
    pub lease: Arc<LeaseWatch>,
    pub discarder: Discarder,
    /// Uploads and deletions started and not finished.
    pub outstanding: Outstanding,
    pub metrics: Arc<Metrics>,
    /// The `writer` label values of this storage's metrics.
    pub writer_labels: WriterLabels,
}
