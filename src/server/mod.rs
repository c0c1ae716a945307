//! The broker process: the data directory's lock, one glommio executor per
//! core, each with its shard, inbox, maintenance task and listener; signal
//! handling and clean shutdown.

pub mod connection;
pub mod data_lock;
pub mod handlers;
pub mod http;
pub mod limits;
pub mod listener;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};

use crate::cluster::metadata::{self, MetadataImage, NodeId, NodeInfo, PersistedMetadata, ShardId};
use crate::config::{ListenerMode, ServeConfig};
use crate::constants;
use crate::shard::{Shard, ShardMessage};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("{0}")]
    Metadata(#[from] metadata::MetadataError),
    #[error("data directory {path}: {source}")]
    DataDir { path: String, source: std::io::Error },
    #[error("{0}")]
    DataDirLock(#[from] data_lock::DataDirLockError),
    #[error("core {core}: {message}")]
    Core { core: usize, message: String },
}

/// The image a node starts from: its cores as nodes, plus what was persisted.
pub fn initial_image(config: &ServeConfig, durable: PersistedMetadata) -> MetadataImage {
    let cores = config.core_count();
    let host = config.advertised_host();
    let nodes = (0..cores)
        .map(|core| NodeInfo {
            node_id: NodeId(config.node_id_base + core as i32),
            host: host.clone(),
            port: i32::from(config.port) + if config.listener == ListenerMode::PerCore { core as i32 } else { 0 },
            shard: ShardId(core as u32),
        })
        .collect();
    MetadataImage { version: 1, nodes, controller: NodeId(config.node_id_base), durable }
}

/// Runs the broker until SIGTERM or SIGINT, then shuts down cleanly.
pub fn serve(config: ServeConfig) -> Result<(), ServeError> {
    config.validate()?;
    raise_open_files_limit();
    std::fs::create_dir_all(&config.data)
        .map_err(|source| ServeError::DataDir { path: config.data.display().to_string(), source })?;
    // Held until this function returns, after every core has stopped.
    let _data_lock = data_lock::DataDirLock::acquire(&config.data)?;
    let mut durable = metadata::load(&config.data)?.unwrap_or_default();
    if durable.cluster_id.is_empty() {
        durable.cluster_id = format!("shardlog-{:016x}", crate::log::now_ms() ^ u64::from(std::process::id()));
        metadata::store(&config.data, &durable)?;
    }
    let image = Arc::new(initial_image(&config, durable));
    let config = Arc::new(config);
    let cores = config.core_count();
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..cores).map(|_| flume::bounded::<ShardMessage>(constants::INBOX_DEPTH)).unzip();
    let (ready_tx, ready_rx) = flume::unbounded::<Result<usize, String>>();
    let limits = limits::ConnectionLimits::new(config.connections_max, config.connections_per_ip_max);
    let health = http::Health::new();
    let mut handles = Vec::with_capacity(cores);
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (core, inbox) in receivers.into_iter().enumerate() {
        let placement = if config.pin && cores <= online { Placement::Fixed(core) } else { Placement::Unbound };
        let (config, image, senders, ready, limits, health) =
            (config.clone(), image.clone(), senders.clone(), ready_tx.clone(), limits.clone(), health.clone());
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("shardlog-core-{core}"))
            .io_memory(config.io_memory_bytes)
            .spin_before_park(Duration::from_micros(0))
            .spawn(move || run_core(CoreStart { core, config, image, senders, inbox, ready, limits, health }))
            .map_err(|e| ServeError::Core { core, message: e.to_string() })?;
        handles.push(handle);
    }
    drop(ready_tx);
    for _ in 0..cores {
        match ready_rx.recv() {
            Ok(Ok(_)) => {}
            Ok(Err(message)) => return Err(ServeError::Core { core: 0, message }),
            Err(_) => return Err(ServeError::Core { core: 0, message: "a core exited during start".into() }),
        }
    }
    health.set_started();
    tracing::info!(cores, port = config.port, listener = ?config.listener, data = %config.data.display(), "shardlog serving");
    wait_for_signal();
    health.set_stopping();
    tracing::info!("shutting down");
    let mut waits = Vec::new();
    for sender in &senders {
        let (done, wait) = flume::bounded(1);
        if sender.send(ShardMessage::Shutdown { done }).is_ok() {
            waits.push(wait);
        }
    }
    for wait in waits {
        let _ = wait.recv_timeout(Duration::from_secs(30));
    }
    for handle in handles {
        let _ = handle.join();
    }
    tracing::info!("stopped");
    Ok(())
}

/// Every segment is an open file: lift the soft descriptor limit to the hard
/// one so thousands of partitions fit.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain syscalls on a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
    tracing::debug!(open_files_max = limit.rlim_cur, "open file limit");
}

fn wait_for_signal() {
    use signal_hook::consts::{SIGINT, SIGTERM};
    match signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
        Ok(mut signals) => {
            let _ = signals.forever().next();
        }
        Err(err) => {
            tracing::error!(error = %err, "cannot install signal handlers; running until killed");
            loop {
                std::thread::park();
            }
        }
    }
}

/// After a kill -9 the previous process's listening socket can outlive it
/// for a moment (io_uring tears down asynchronously); retry a busy port for
/// a few seconds before giving up.
async fn bind_with_retry(address: SocketAddr, mode: ListenerMode) -> std::io::Result<glommio::net::TcpListener> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match listener::bind(address, mode) {
            Err(err) if err.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }
            other => return other,
        }
    }
}

/// What a core needs to start.
struct CoreStart {
    core: usize,
    config: Arc<ServeConfig>,
    image: Arc<MetadataImage>,
    senders: Vec<flume::Sender<ShardMessage>>,
    inbox: flume::Receiver<ShardMessage>,
    ready: flume::Sender<Result<usize, String>>,
    limits: Arc<limits::ConnectionLimits>,
    health: Arc<http::Health>,
}

async fn run_core(start: CoreStart) {
    let CoreStart { core, config, image, senders, inbox, ready, limits, health } = start;
    crate::log::set_core_cache_bytes_max(config.cache_bytes_max);
    let shard = Shard::new(ShardId(core as u32), config.clone(), image.clone(), senders);
    // Core 0 serves /metrics and /v1/ready from before recovery until it stops.
    let http = if core == 0 { http::start(&shard, &config, health).await } else { Ok(None) };
    let _http = match http {
        Ok(task) => task,
        Err(message) => {
            let _ = ready.send(Err(message));
            return;
        }
    };
    if let Err(err) = shard.apply_image(image).await {
        let _ = ready.send(Err(format!("core {core}: opening partitions failed: {err}")));
        return;
    }
    if let Err(err) = shard.open_groups().await {
        let _ = ready.send(Err(format!("core {core}: opening the group offsets log failed: {err}")));
        return;
    }
    let port = config.port + if config.listener == ListenerMode::PerCore { core as u16 } else { 0 };
    let listener = match bind_with_retry(SocketAddr::new(config.host, port), config.listener).await {
        Ok(listener) => listener,
        Err(err) => {
            let _ = ready.send(Err(format!("core {core}: cannot listen on {}:{port}: {err}", config.host)));
            return;
        }
    };
    glommio::spawn_local(shard.clone().run_maintenance()).detach();
    glommio::spawn_local(crate::metrics::run_task_delay_probe(shard.clone())).detach();
    let inbox_task = glommio::spawn_local(shard.clone().run_inbox(inbox));
    let _ = ready.send(Ok(core));
    listener::run(shard.clone(), listener, limits).await;
    inbox_task.await;
}
