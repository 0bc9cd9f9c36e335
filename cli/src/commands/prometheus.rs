//! `dstl run --prometheus ADDR`: installs the Prometheus recorder (with the histogram
//! buckets of [`dstl::telemetry::METRICS`]) and serves its text exposition at
//! `http://ADDR/metrics` from a thread of its own while the job runs.
//!
//! The listener is bound here rather than by the exporter's own HTTP server so that a bad
//! or busy address fails before the job starts, with the address in the message, and so
//! that port 0 works: the address actually bound is reported.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use dstl::telemetry::{METRICS, MetricKind};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The content type of the text exposition format.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// A client gets this long to send its request and read the answer.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
/// Requests longer than this are cut off (a scrape request is a few hundred bytes).
const MAX_REQUEST: u64 = 16 << 10;
/// How often the recorder's upkeep runs between scrapes.
const UPKEEP: Duration = Duration::from_secs(5);

/// Parses `--prometheus`: `HOST:PORT` (`127.0.0.1:9464`, `[::1]:9464`, `localhost:9464`;
/// port 0 picks a free port).
pub(super) fn parse_address(value: &str) -> Result<SocketAddr, String> {
    let expected = "expected HOST:PORT, such as 127.0.0.1:9464 (port 0 picks a free port)";
    let mut addresses = value
        .to_socket_addrs()
        .map_err(|e| format!("{expected}: {e}"))?;
    addresses.next().ok_or_else(|| expected.to_string())
}

/// Binds `address`, installs the recorder and starts serving; returns the address bound.
pub(super) fn serve(address: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(address)
        .with_context(|| format!("--prometheus {address}: cannot listen on that address"))?;
    let bound = listener.local_addr()?;
    let mut builder = PrometheusBuilder::new();
    for info in METRICS.iter().filter(|m| m.kind == MetricKind::Histogram) {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(info.name.to_string()), info.buckets)
            .with_context(|| format!("histogram buckets of {}", info.name))?;
    }
    let handle = builder
        .install_recorder()
        .context("cannot install the Prometheus metrics recorder")?;
    let upkeep = handle.clone();
    std::thread::Builder::new()
        .name("dstl-metrics-upkeep".into())
        .spawn(move || {
            loop {
                std::thread::sleep(UPKEEP);
                upkeep.run_upkeep();
            }
        })
        .context("cannot start the metrics upkeep thread")?;
    std::thread::Builder::new()
        .name("dstl-prometheus".into())
        .spawn(move || {
            for stream in listener.incoming() {
                match stream {
                    Ok(stream) => {
                        if let Err(e) = answer(stream, &handle) {
                            tracing::debug!(error = %e, "Prometheus scrape connection failed");
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot accept a Prometheus scrape"),
                }
            }
        })
        .context("cannot start the Prometheus endpoint thread")?;
    Ok(bound)
}

/// Answers one HTTP/1.x request: `GET /metrics` (or `HEAD`) gets the exposition, any
/// other path 404, any other method 405. One request per connection.
fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut request = BufReader::new(stream.try_clone()?).take(MAX_REQUEST);
    let mut request_line = String::new();
    request.read_line(&mut request_line)?;
    // The headers say nothing this endpoint needs; read up to the blank line.
    loop {
        let mut header = String::new();
        if request.read_line(&mut header)? == 0 || header.trim_end().is_empty() {
            break;
        }
    }
    let mut words = request_line.split_whitespace();
    let method = words.next().unwrap_or("");
    let path = words.next().unwrap_or("").split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET" | "HEAD", "/metrics") => ("200 OK", CONTENT_TYPE, handle.render()),
        ("GET" | "HEAD", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD are served\n".to_string(),
        ),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    if method != "HEAD" {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(
            parse_address("127.0.0.1:9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(parse_address("[::1]:0").unwrap().port(), 0);
        for bad in ["nonsense", "127.0.0.1", "127.0.0.1:99999", ":"] {
            let e = parse_address(bad).unwrap_err();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }
}
