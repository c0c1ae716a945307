//! The mirror's metrics, exposed like the broker's: Prometheus text on
//! `GET /metrics` (records and bytes copied, lag per partition, replication
//! latency as a histogram) and `GET /v1/status` (JSON, per partition), on
//! `--metrics-port`. A small blocking HTTP/1.1 server on its own thread:
//! one request per connection, scrapes are rare.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::copy::Shared;
use crate::metrics::{counter, gauge, histogram, Labels};

/// Serves until the mirror stops; returns the bound port.
pub fn serve(port: u16, shared: Arc<Shared>) -> std::io::Result<u16> {
    let listener = TcpListener::bind(("0.0.0.0", port))?;
    let bound = listener.local_addr()?.port();
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("mirror-metrics".into()).spawn(move || {
        while !shared.stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((stream, _)) => {
                    let _ = answer(stream, &shared);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    })?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = [0u8; 2048];
    let n = stream.read(&mut request)?;
    let line = String::from_utf8_lossy(&request[..n]);
    let path = line.split_whitespace().nth(1).unwrap_or("/");
    let (status, content_type, body) = match path {
        "/metrics" => ("200 OK", crate::metrics::CONTENT_TYPE, encode(shared)),
        "/v1/status" => ("200 OK", "application/json", status_json(shared)),
        _ => ("404 Not Found", "text/plain", "not found\n".to_string()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[derive(Serialize)]
struct PartitionStatus {
    topic: String,
    partition: i32,
    target_topic: String,
    /// Next source offset to copy.
    next_offset: i64,
    source_end: i64,
    lag: i64,
    records: u64,
    bytes: u64,
    error: Option<String>,
}

fn status_json(shared: &Shared) -> String {
    let progress = shared.progress.lock().expect("progress");
    let mut rows: Vec<PartitionStatus> = progress
        .iter()
        .map(|((topic, partition), p)| PartitionStatus {
            topic: topic.clone(),
            partition: *partition,
            target_topic: p.target_topic.clone(),
            next_offset: p.mapping.frontier().map_or(-1, |(next, _)| next),
            source_end: p.source_end,
            lag: p.lag(),
            records: p.records,
            bytes: p.bytes,
            error: p.error.clone(),
        })
        .collect();
    rows.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
    serde_json::json!({ "partitions": rows }).to_string()
}

/// The Prometheus text of the mirror's state now.
pub fn encode(shared: &Shared) -> String {
    let mut registry = Registry::default();
    let mut rows: Vec<(String, i32, String, i64, u64, u64)> = shared
        .progress
        .lock()
        .expect("progress")
        .iter()
        .map(|((t, p), progress)| {
            (t.clone(), *p, progress.target_topic.clone(), progress.lag(), progress.records, progress.bytes)
        })
        .collect();
    rows.sort();
    let latency = shared.latency_buckets.lock().expect("latency").clone();
    registry.register_collector(Box::new(Exposition {
        records: shared.records.load(Ordering::Relaxed),
        bytes: shared.bytes.load(Ordering::Relaxed),
        rows,
        latency,
    }));
    let mut text = String::new();
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut text, &registry);
    text
}

#[derive(Debug)]
struct Exposition {
    records: u64,
    bytes: u64,
    rows: Vec<(String, i32, String, i64, u64, u64)>,
    latency: crate::metrics::Histogram,
}

impl Collector for Exposition {
    fn encode(&self, mut out: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        counter(&mut out, "shardlog_mirror_records", "Records copied to the target", [(Labels::new(), self.records)])?;
        counter(
            &mut out,
            "shardlog_mirror_bytes",
            "Source batch bytes copied to the target",
            [(Labels::new(), self.bytes)],
        )?;
        let labels = |(t, p, target, ..): &(String, i32, String, i64, u64, u64)| -> Labels {
            vec![("topic", t.clone()), ("partition", p.to_string()), ("target_topic", target.clone())]
        };
        gauge(
            &mut out,
            "shardlog_mirror_lag_records",
            "Records of the source partition not yet on the target (-1: not known yet)",
            self.rows.iter().map(|row| (labels(row), row.3)),
        )?;
        counter(
            &mut out,
            "shardlog_mirror_partition_records",
            "Records copied, per source partition",
            self.rows.iter().map(|row| (labels(row), row.4)),
        )?;
        histogram(
            &mut out,
            "shardlog_mirror_replication_latency_seconds",
            "Source record time (the batch's newest) to the target's acknowledgement",
            [(Labels::new(), &self.latency)],
        )
    }
}
