//! The operations endpoint: a tiny HTTP/1.1 responder on core 0, on
//! `--host` and `--metrics-port`. GET only, one request per connection (the
//! connection closes after the response), request heads up to
//! `HTTP_REQUEST_BYTES_MAX`, at most `HTTP_CONNECTIONS_MAX` at once.
//!
//! | path         | answer                                                          |
//! |--------------|-----------------------------------------------------------------|
//! | `/metrics`   | Prometheus text format: every core's counters, merged (`metrics`) |
//! | `/v1/health` | 200 while the process serves (liveness)                         |
//! | `/v1/ready`  | 503 until every core has recovered its partitions and listens, 200 then, 503 again once shutdown begins |
//! | `/v1/status` | JSON: readiness, disk space, per core its node, partitions and log bytes (`shardlog cluster status`) |
//!
//! It starts before the cores recover their partitions, so that `/v1/ready`
//! answers 503 during recovery, and stops when core 0 has shut down. A scrape
//! asks every other core for its snapshot over that core's inbox; until all
//! cores are ready it reports core 0 alone, so that no requests pile up in
//! the inboxes of cores still recovering.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::{TcpListener, TcpStream};

use crate::config::{ListenerMode, ServeConfig};
use crate::constants::{HTTP_CONNECTIONS_MAX, HTTP_READ_TIMEOUT_MS, HTTP_REQUEST_BYTES_MAX, METRICS_CORE_WAIT_MS};
use crate::metrics::{self, CoreSnapshot, DiskSpace, ScrapeContext};
use crate::server::CoreStartError;
use crate::shard::{Shard, ShardId, ShardMessage};

/// Readiness of the whole process, shared by `serve` (which sets it) and
/// the endpoint on core 0 (which reads it). Touched only at start, at
/// shutdown and per health request: atomics are fine.
#[derive(Debug, Default)]
pub struct Health {
    /// Every core has recovered its partitions and listens.
    started: AtomicBool,
    /// Shutdown has begun.
    stopping: AtomicBool,
}

impl Health {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn set_started(&self) {
        self.started.store(true, Ordering::Release);
    }

    pub fn set_stopping(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    pub fn is_ready(&self) -> bool {
        self.started.load(Ordering::Acquire) && !self.stopping.load(Ordering::Acquire)
    }

    fn has_started(&self) -> bool {
        self.started.load(Ordering::Acquire)
    }
}

/// Binds the endpoint and starts serving it on this core (core 0), unless
/// `--metrics-port` is 0. The returned task serves until it is dropped.
pub async fn start(
    shard: &Rc<Shard>,
    config: &ServeConfig,
    health: Arc<Health>,
) -> Result<Option<glommio::Task<()>>, CoreStartError> {
    if config.metrics_port == 0 {
        return Ok(None);
    }
    let address = SocketAddr::new(config.host, config.metrics_port);
    let listener = super::bind_with_retry(address, ListenerMode::PerCore)
        .await
        .map_err(|source| CoreStartError::MetricsListen { address, source })?;
    tracing::info!(%address, "metrics and health endpoint listening");
    Ok(Some(glommio::spawn_local(run(shard.clone(), listener, health))))
}

async fn run(shard: Rc<Shard>, listener: TcpListener, health: Arc<Health>) {
    let open = Rc::new(Cell::new(0usize));
    loop {
        let stream = match listener.accept().await {
            Ok(stream) => stream,
            Err(err) => {
                tracing::warn!(error = %err, "metrics endpoint: accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if open.get() >= HTTP_CONNECTIONS_MAX {
            continue;
        }
        open.set(open.get() + 1);
        let (shard, health, open) = (shard.clone(), health.clone(), open.clone());
        glommio::spawn_local(async move {
            serve_one(&shard, stream, &health).await;
            open.set(open.get() - 1);
        })
        .detach();
    }
}

async fn serve_one(shard: &Rc<Shard>, mut stream: TcpStream, health: &Health) {
    let deadline = Duration::from_millis(HTTP_READ_TIMEOUT_MS);
    let response = match with_timeout(deadline, read_head(&mut stream)).await {
        Some(Ok(head)) => match parse_request_line(&head) {
            Ok(("GET", target)) => route(shard, health, target).await,
            Ok(_) => Response::text(405, "Method Not Allowed", "GET only\n"),
            Err(()) => Response::text(400, "Bad Request", "bad request line\n"),
        },
        Some(Err(HeadError::TooLarge)) => {
            Response::text(431, "Request Header Fields Too Large", "request head too large\n")
        }
        Some(Err(HeadError::Closed)) | None => return,
    };
    let _ = stream.write_all(&response.into_bytes()).await;
    let _ = stream.close().await;
}

async fn route(shard: &Rc<Shard>, health: &Health, target: &str) -> Response {
    let path = target.split('?').next().unwrap_or(target);
    match path {
        "/metrics" => {
            let (snapshots, context) = scrape(shard, health).await;
            Response {
                status: 200,
                reason: "OK",
                content_type: metrics::CONTENT_TYPE,
                body: metrics::encode(snapshots, context).into_bytes(),
            }
        }
        "/v1/health" => Response::text(200, "OK", "ok\n"),
        "/v1/ready" if health.is_ready() => Response::text(200, "OK", "ready\n"),
        "/v1/ready" => Response::text(503, "Service Unavailable", "not ready\n"),
        "/v1/status" => {
            let (snapshots, context) = scrape(shard, health).await;
            let mut status = metrics::status(&snapshots, &context, &shard.config.data);
            status.machines = machines(&shard.image());
            match serde_json::to_vec_pretty(&status) {
                Ok(body) => Response { status: 200, reason: "OK", content_type: "application/json", body },
                Err(err) => Response::text(500, "Internal Server Error", &format!("{err}\n")),
            }
        }
        _ => Response::text(404, "Not Found", "not found: try /metrics, /v1/health, /v1/ready, /v1/status\n"),
    }
}

/// The cluster's machines as this machine's image has them.
fn machines(image: &crate::cluster::MetadataImage) -> Vec<metrics::MachineStatus> {
    image
        .cluster
        .machines
        .iter()
        .map(|(id, machine)| {
            let mut nodes: Vec<(u32, i32)> = machine
                .nodes
                .iter()
                .map(|n| (image.cluster.nodes.get(&crate::cluster::NodeId(*n)).map_or(u32::MAX, |p| p.core), *n))
                .collect();
            nodes.sort();
            metrics::MachineStatus {
                machine: id.get(),
                rack: machine.rack.clone(),
                fenced: machine.fenced,
                nodes: nodes.into_iter().map(|(_, n)| n).collect(),
                this: *id == image.machine,
            }
        })
        .collect()
}

/// Every core's snapshot that arrives in time, in core order.
async fn scrape(shard: &Rc<Shard>, health: &Health) -> (Vec<CoreSnapshot>, ScrapeContext) {
    let ask_others = health.has_started();
    let wait = Duration::from_millis(METRICS_CORE_WAIT_MS);
    let asks = (0..shard.shard_count() as u32).map(|core| async move {
        if ShardId(core) == shard.id {
            return Some(crate::shard::report::snapshot(shard));
        }
        if !ask_others {
            return None;
        }
        let (reply, answer) = flume::bounded(1);
        let ask = async {
            shard.send(ShardId(core), ShardMessage::Metrics { reply }).await.ok()?;
            answer.recv_async().await.ok()
        };
        with_timeout(wait, ask).await.flatten()
    });
    let snapshots: Vec<CoreSnapshot> = futures::future::join_all(asks).await.into_iter().flatten().collect();
    let context = ScrapeContext {
        cores: shard.shard_count(),
        ready: health.is_ready(),
        per_partition: shard.config.metrics_per_partition,
        disk: DiskSpace::of(&shard.config.data).ok(),
    };
    (snapshots, context)
}

struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    fn text(status: u16, reason: &'static str, body: &str) -> Self {
        Self { status, reason, content_type: "text/plain; charset=utf-8", body: body.as_bytes().to_vec() }
    }

    fn into_bytes(self) -> Vec<u8> {
        let allow = if self.status == 405 { "Allow: GET\r\n" } else { "" };
        let head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{allow}Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            self.status,
            self.reason,
            self.content_type,
            self.body.len()
        );
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

enum HeadError {
    TooLarge,
    Closed,
}

/// Reads until the blank line that ends the request head.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut head = vec![0u8; HTTP_REQUEST_BYTES_MAX];
    let mut filled = 0;
    loop {
        if filled == head.len() {
            return Err(HeadError::TooLarge);
        }
        let read = stream.read(&mut head[filled..]).await.map_err(|_| HeadError::Closed)?;
        if read == 0 {
            return Err(HeadError::Closed);
        }
        filled += read;
        let seen = &head[..filled];
        if seen.windows(4).any(|w| w == b"\r\n\r\n") || seen.windows(2).any(|w| w == b"\n\n") {
            head.truncate(filled);
            return Ok(head);
        }
    }
}

/// The method and target of `GET /path HTTP/1.1`.
fn parse_request_line(head: &[u8]) -> Result<(&str, &str), ()> {
    let line = head.split(|b| *b == b'\n').next().ok_or(())?;
    let line = std::str::from_utf8(line).map_err(|_| ())?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(());
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(());
    }
    Ok((method, target))
}

async fn with_timeout<T>(limit: Duration, work: impl std::future::Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(work.await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_line_gives_method_and_target() {
        assert_eq!(parse_request_line(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"), Ok(("GET", "/metrics")));
        assert_eq!(parse_request_line(b"POST /v1/ready HTTP/1.0\n\n"), Ok(("POST", "/v1/ready")));
        assert_eq!(parse_request_line(b"GET /metrics\r\n\r\n"), Err(()));
        assert_eq!(parse_request_line(b"GET metrics HTTP/1.1\r\n\r\n"), Err(()));
        assert_eq!(parse_request_line(b"\xff\xfe /x HTTP/1.1\r\n\r\n"), Err(()));
    }

    #[test]
    fn readiness_needs_a_started_process_that_is_not_stopping() {
        let health = Health::default();
        assert!(!health.is_ready());
        health.set_started();
        assert!(health.is_ready());
        health.set_stopping();
        assert!(!health.is_ready());
    }
}
