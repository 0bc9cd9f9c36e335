//! A storage on the caller's tokio runtime starts no runtime of its own, and closes
//! through a shared reference without blocking a task. Alone in its test binary: it
//! looks at the process's threads.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dstl::ChangelogStorage;
use dstl_tests::harness::{RANGE, config};

/// Names of this process's threads.
fn threads() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_string())
        .collect()
}

#[test]
fn a_storage_runs_on_the_callers_runtime_and_closes_without_blocking_a_task() {
    let tmp = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("caller-rt")
        .enable_all()
        .build()
        .unwrap();
    let storage = Arc::new(
        ChangelogStorage::builder(config(tmp.path(), &[]))
            .runtime(runtime.handle().clone())
            .open()
            .unwrap(),
    );
    let lease_dir = tmp.path().join(storage.config().job_id()).join("leases");
    assert_eq!(std::fs::read_dir(&lease_dir).unwrap().count(), 1);
    let shared = storage.clone();
    runtime.block_on(async move {
        let w = shared.create_writer("op", RANGE).unwrap();
        w.append(3, b"on the caller's runtime").unwrap();
        let to = w.next_sequence_number().unwrap();
        let snapshot = w.persist(0, 1).unwrap().await.unwrap();
        w.confirm(0, to, 1).unwrap();
        assert_eq!(shared.read(&snapshot.remote).unwrap().len(), 1);
        // No runtime of dstl's own: uploads ran on this one.
        let names = threads();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("dstl-io") || n.starts_with("dstl-s3")),
            "{names:?}"
        );
        // Closing through a shared reference, from a task, without blocking it: a
        // timer on the same runtime keeps firing meanwhile.
        let ticker = tokio::spawn(async {
            tokio::time::sleep(Duration::from_millis(1)).await;
        });
        shared.close_async().await;
        ticker.await.unwrap();
    });
    assert!(
        std::fs::read_dir(&lease_dir).map_or(true, |d| d.count() == 0),
        "close released the lease"
    );
    let refused = storage
        .create_writer("late", RANGE)
        .err()
        .expect("a closed storage creates no writer");
    assert!(refused.to_string().contains("closed"), "{refused}");
    // A second close returns at once.
    let started = Instant::now();
    storage.close();
    assert!(started.elapsed() < Duration::from_secs(1));
}
