//! Exports `dstl_proto::manifest` and `dstl_proto::lease` through the WIT interface
//! `records`: the JSON of a snapshot's manifest and of a storage's lease, for hosts that
//! cannot link dstl-proto (the Node host). Conversions only.

use dstl_proto::lease::{LEASE_DIR, LEASE_SUFFIX, LeaseRecord, REFRESH};
use dstl_proto::manifest::Manifest;

use crate::component::Component;
use crate::component::exports::dstl::changelog::records as wit;
use crate::component::{from_wit_snapshot, to_wit_handle};

impl wit::Guest for Component {
    fn manifest_json(snapshot: wit::SnapshotResult, extra: wit::ManifestExtra) -> String {
        let mut manifest = Manifest::from_snapshot(&from_wit_snapshot(snapshot));
        manifest.writer = extra.writer;
        manifest.checkpoint_id = extra.checkpoint_id;
        manifest.sequence_from = extra.sequence_from;
        manifest.sequence_to = extra.sequence_to;
        manifest.changes = extra.changes.map(|(first, end)| [first, end]);
        manifest.to_json()
    }

    fn parse_manifest(text: String) -> Result<wit::Manifest, String> {
        let manifest = Manifest::parse(&text).map_err(|e| e.to_string())?;
        Ok(wit::Manifest {
            remote: to_wit_handle(manifest.remote_handle()),
            local: manifest.local_handle().map(to_wit_handle),
            extra: wit::ManifestExtra {
                writer: manifest.writer,
                checkpoint_id: manifest.checkpoint_id,
                sequence_from: manifest.sequence_from,
                sequence_to: manifest.sequence_to,
                changes: manifest.changes.map(|[first, end]| (first, end)),
            },
        })
    }

    fn new_lease(opened_ms: u64, pid: u32) -> wit::Lease {
        wit::Lease {
            json: LeaseRecord::new(opened_ms, pid).to_json(),
            dir: LEASE_DIR.to_string(),
            suffix: LEASE_SUFFIX.to_string(),
            refresh_ms: REFRESH.as_millis() as u64,
        }
    }
}
