//! Recovering a writer's state from a manifest after the process died.
//!
//! A checkpoint's snapshot is a handle: the `(file, offset, size)` of every change set
//! since the state was last materialized. The operator stores it with its checkpoint (here
//! as dstl's manifest JSON, as `dstl run --manifests` writes it); after a failure a new
//! process loads it, reads the changes back with [`dstl::Recovery`] and replays them into
//! its state. The new writer then starts again at sequence number 0: until the operator
//! materializes its state again, its checkpoints are the restored handle plus the new
//! writer's changes, and reading both gives the whole state.
//!
//! ```sh
//! cargo run --release -p dstl --example recover [-- DIR]          # both lives
//! cargo run --release -p dstl --example recover -- --manifest M   # read one manifest
//! ```
//!
//! With `--manifest M` (e.g. one that `dstl run --manifests DIR` wrote) it only reads that
//! snapshot back and prints its changes per key group.

use std::collections::BTreeMap;
use std::error::Error;
use std::path::{Path, PathBuf};

use dstl::manifest::{Manifest, ManifestFile};
use dstl::{ChangelogStorage, Config, KeyGroupRange, Recovery};

const RANGE: KeyGroupRange = KeyGroupRange { start: 0, end: 31 };

/// The operator's state: the latest value per key; each change is `key=value`.
type State = BTreeMap<String, String>;

fn apply(state: &mut State, change: &[u8]) -> Result<(), Box<dyn Error>> {
    let text = std::str::from_utf8(change)?;
    let (key, value) = text.split_once('=').ok_or("a change is key=value")?;
    state.insert(key.to_string(), value.to_string());
    Ok(())
}

fn key_group(key: &str) -> i32 {
    key.bytes().map(i32::from).sum::<i32>() % (RANGE.end + 1)
}

/// Appends `count` updates, numbered from `first`, and applies them to `state`.
fn update(
    writer: &dstl::Writer,
    state: &mut State,
    first: u32,
    count: u32,
) -> Result<(), Box<dyn Error>> {
    for n in first..first + count {
        let key = format!("sensor-{}", n % 40);
        let change = format!("{key}={n}");
        writer.append(key_group(&key), change.as_bytes())?;
        apply(state, change.as_bytes())?;
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, manifest] = args.as_slice()
        && flag == "--manifest"
    {
        return read_manifest(Path::new(manifest));
    }
    // The files go to DIR, else to a temporary directory (made either way, removed at the end).
    let tmp = tempfile::tempdir()?;
    let dir = args
        .first()
        .map_or_else(|| tmp.path().to_path_buf(), PathBuf::from);
    let mut config = Config::default();
    config.set(
        "dstl.dfs.base-path",
        &dir.join("changelog").to_string_lossy(),
    )?;
    let manifest_path = dir.join("sensors.json");

    // First life: updates, one checkpoint whose manifest is stored, more updates that no
    // checkpoint covers, then the process "dies" (the storage is dropped without close).
    let mut state_at_checkpoint = State::new();
    {
        let storage = ChangelogStorage::open(config.clone())?;
        let writer = storage.create_writer("sensors", RANGE)?;
        update(&writer, &mut state_at_checkpoint, 0, 500)?;
        let to = writer.next_sequence_number()?;
        let snapshot = writer.persist(0, 1)?.wait()?;
        let mut manifest = Manifest::from_snapshot(&snapshot);
        manifest.writer = Some("sensors".into());
        manifest.checkpoint_id = Some(1);
        manifest.sequence_from = Some(0);
        manifest.sequence_to = Some(to);
        manifest.store(&manifest_path)?;
        // The coordinator completed checkpoint 1: the files belong to it now.
        writer.confirm(0, to, 1)?;
        let mut lost = state_at_checkpoint.clone();
        update(&writer, &mut lost, 500, 100)?;
        println!(
            "first life: checkpoint 1 stored in {}, then 100 updates no checkpoint covers",
            manifest_path.display()
        );
    }

    // Second life: restore from the manifest.
    let manifest = Manifest::load(&manifest_path)?;
    let restored_handle = manifest.remote_handle();
    let recovery = Recovery::new(&config);
    let mut state = State::new();
    for change in recovery.read(&restored_handle)? {
        apply(&mut state, &change.value)?;
    }
    if state != state_at_checkpoint {
        return Err("the restored state differs from the state at checkpoint 1".into());
    }
    println!(
        "second life: restored {} keys from checkpoint {} ({} bytes of changes)",
        state.len(),
        manifest.checkpoint_id.unwrap_or_default(),
        manifest.state_size
    );

    // Carry on with a new writer; checkpoint 2 is the restored handle plus its changes.
    let storage = ChangelogStorage::open(config.clone())?;
    let writer = storage.create_writer("sensors", RANGE)?;
    update(&writer, &mut state, 500, 300)?;
    let to = writer.next_sequence_number()?;
    let snapshot = writer.persist(0, 2)?.wait()?;
    writer.confirm(0, to, 2)?;
    let mut check = State::new();
    let mut read = Vec::new();
    for handle in [&restored_handle, &snapshot.remote] {
        let changes = recovery.read(handle)?;
        read.push(changes.len());
        for change in changes {
            apply(&mut check, &change.value)?;
        }
    }
    if check != state {
        return Err("checkpoint 2 does not read back as the live state".into());
    }
    println!(
        "checkpoint 2 (the restored {} changes + {} new ones) reads back as the live state: {} keys",
        read[0],
        read[1],
        check.len()
    );
    writer.close()?;
    storage.close();
    Ok(())
}

/// Reads the snapshot of one manifest and prints its changes per key group.
fn read_manifest(path: &Path) -> Result<(), Box<dyn Error>> {
    let manifest = Manifest::load(path)?;
    let changes = Recovery::new(&Config::default()).read(&manifest.remote_handle())?;
    let mut per_group: BTreeMap<i32, (usize, usize)> = BTreeMap::new();
    for change in &changes {
        let entry = per_group.entry(change.key_group).or_default();
        entry.0 += 1;
        entry.1 += change.value.len();
    }
    println!(
        "{}: writer {}, checkpoint {}, {} changes in {} key groups",
        path.display(),
        manifest.writer.as_deref().unwrap_or("?"),
        manifest
            .checkpoint_id
            .map_or_else(|| "?".to_string(), |c| c.to_string()),
        changes.len(),
        per_group.len()
    );
    for (group, (count, bytes)) in per_group {
        println!("  key group {group}: {count} changes, {bytes} bytes");
    }
    Ok(())
}
