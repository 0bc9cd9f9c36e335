//! `dstl bench` in its quick smoke mode: every standard workload and the density
//! benchmark still run and report what BENCHMARKS.md relies on. Measures nothing.

use std::process::Command;

fn bench(workload: &str) -> serde_json::Value {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_dstl"))
        .args(["bench", "--workload", workload, "--quick", "--json"])
        .arg("--tmp")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dstl bench --workload {workload} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = serde_json::from_slice(&out.stdout).unwrap();
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the benchmark removes its directory");
    json
}

#[test]
fn standard_workloads_run_in_quick_mode() {
    for workload in ["small", "fanout", "large", "small-z"] {
        let report = bench(workload);
        assert_eq!(report["workload"], workload);
        assert_eq!(report["verified"], true, "{workload}");
        for key in [
            "appends_per_s",
            "payload_mb_per_s",
            "persist_p50_ms",
            "persist_p99_ms",
            "peak_rss_mb",
            "baseline_disk_mb_per_s",
            "disk_ratio",
        ] {
            assert!(
                report[key].as_f64().is_some_and(|v| v > 0.0),
                "{workload}: {key} = {}",
                report[key]
            );
        }
        assert!(report["files"].as_u64().unwrap() > 0);
    }
}

#[test]
fn density_runs_in_quick_mode() {
    let report = bench("density");
    assert_eq!(report["writers"], 100);
    assert!(report["us_per_writer"].as_f64().unwrap() > 0.0);
}

#[test]
fn unknown_workload_is_rejected_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_dstl"))
        .args(["bench", "--workload", "huge"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown workload `huge`"));
}
