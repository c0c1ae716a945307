//! The broker process: the data directory's lock, one glommio executor per
//! core, each with its shard, inbox, maintenance task and listener; signal
//! handling and clean shutdown. A core that cannot start ends the process.

pub mod connection;
pub mod data_lock;
pub mod handlers;
pub mod http;
pub mod legacy_groups;
pub mod limits;
pub mod listener;
pub mod machine_id;

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};

use crate::cluster::bridge;
use crate::cluster::gossip::{Gossip, GossipConfig, Peer};
use crate::cluster::metadata::{self, MetadataImage, ShardId};
use crate::cluster::service::{ControllerHandle, ControllerService, ServiceConfig};
use crate::cluster::MachineId;
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
    #[error("core {core}: {source}")]
    Core { core: usize, source: Box<CoreStartError> },
    #[error("core {core}: cannot start its executor: {source}")]
    Spawn { core: usize, source: glommio::GlommioError<()> },
    #[error("{0}")]
    LegacyGroups(#[from] legacy_groups::LegacyGroupsError),
    #[error("{0}")]
    MachineId(#[from] machine_id::MachineIdError),
    #[error("{0}")]
    Controller(#[from] crate::cluster::service::ServiceError),
    #[error("gossip port {addr}: {source}")]
    Gossip { addr: SocketAddr, source: std::io::Error },
    #[error("controller voter {address}: {reason}")]
    Voter { address: String, reason: String },
    #[error("starting the cluster metadata: {0}")]
    Bootstrap(crate::cluster::service::SubmitError),
}

/// The address clients reach each core at (its node's endpoint).
pub fn core_endpoints(config: &ServeConfig) -> Vec<(String, i32)> {
    let host = config.advertised_host();
    (0..config.core_count())
        .map(|core| {
            let port = i32::from(config.port) + if config.listener == ListenerMode::PerCore { core as i32 } else { 0 };
            (host.clone(), port)
        })
        .collect()
}

/// The controller quorum as this machine runs it: the voters' resolved
/// addresses and, on a voter, where its controller port listens. Without
/// `--controller-voters`, this machine alone, with no port.
fn quorum_config(
    config: &ServeConfig,
    machine: MachineId,
    gossip: Option<&Gossip>,
) -> Result<ServiceConfig, ServeError> {
    use std::net::ToSocketAddrs;
    let mut voters = config.voters()?;
    if let Some(gossip) = gossip.filter(|_| voters.is_empty() && !config.seed_list().is_empty()) {
        voters = voters_from_gossip(gossip);
    }
    let mut service = ServiceConfig {
        machine,
        voters: vec![(machine, SocketAddr::from(([127, 0, 0, 1], 0)))],
        learners: Vec::new(),
        listen: None,
        dir: config.data.join("__cluster"),
        snapshot_entries: crate::cluster::service::SNAPSHOT_ENTRIES_DEFAULT,
    };
    if voters.is_empty() {
        return Ok(service);
    }
    service.voters.clear();
    for (id, address) in voters {
        let resolved = address.to_socket_addrs().ok().and_then(|mut all| all.next());
        let Some(resolved) = resolved else {
            return Err(ServeError::Voter { address, reason: "does not resolve".into() });
        };
        let id = MachineId::new(id).expect("validated: not 0");
        if id == machine {
            service.listen = Some(SocketAddr::new(config.host, config.controller_port.unwrap_or(resolved.port())));
        }
        service.voters.push((id, resolved));
    }
    Ok(service)
}

/// The voters as gossip names them (each voter says where its controller
/// listens); waits until it names one, saying so every few seconds.
fn voters_from_gossip(gossip: &Gossip) -> Vec<(u64, String)> {
    let started = std::time::Instant::now();
    let mut said = started;
    loop {
        let members = gossip.members();
        let voters: Vec<(u64, String)> =
            members.up.values().filter_map(|p| Some((p.machine, p.controller.clone()?))).collect();
        if !voters.is_empty() {
            tracing::info!(?voters, "controller voters learned from gossip");
            return voters;
        }
        if said.elapsed() >= Duration::from_secs(5) {
            said = std::time::Instant::now();
            tracing::info!(waited_s = started.elapsed().as_secs(), "waiting for gossip to name a controller voter");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts this machine's gossip when it has a gossip port: it tells the
/// others its Kafka address, cores, rack and (on a voter) controller
/// address.
fn start_gossip(config: &ServeConfig, machine: MachineId) -> Result<Option<Gossip>, ServeError> {
    use std::net::ToSocketAddrs;
    let Some(port) = config.gossip_port else { return Ok(None) };
    let bind = SocketAddr::new(config.host, port);
    let advertised = if config.host.is_unspecified() {
        (config.advertised_host(), port).to_socket_addrs().ok().and_then(|mut all| all.next()).unwrap_or(bind)
    } else {
        bind
    };
    let voters = config.voters()?;
    let controller = voters.iter().find(|(id, _)| *id == machine.get()).map(|(_, address)| {
        let port = config.controller_port.or_else(|| address.rsplit_once(':')?.1.parse().ok()).unwrap_or(0);
        format!("{}:{port}", config.advertised_host())
    });
    let generation =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let me = Peer {
        machine: machine.get(),
        gossip: advertised,
        generation,
        kafka_host: config.advertised_host(),
        kafka_port: config.port,
        cores: config.core_count() as u16,
        rack: config.rack.clone(),
        controller,
    };
    let gossip = Gossip::start(GossipConfig { me, bind, seeds: config.seed_list() })
        .map_err(|source| ServeError::Gossip { addr: bind, source })?;
    tracing::info!(address = %gossip.local_addr(), seeds = ?config.seed_list(), "gossip listening");
    Ok(Some(gossip))
}

/// Hands gossip's "machine down" to the controller service, which fences
/// it at once when it leads and has not heard the machine just now.
fn forward_suspicions(gossip: &Gossip, handle: ControllerHandle) {
    let downs = gossip.downs();
    let _ = std::thread::Builder::new().name("shardlog-gossip-suspect".into()).spawn(move || {
        while let Ok(machine) = downs.recv() {
            handle.suspect(machine);
        }
    });
}

/// Starts this machine's controller service on `data/__cluster` (a voter,
/// or an observer of the voters), migrates a `metadata.rkyv` from an older
/// shardlog on first start, registers the machine, and returns the cores'
/// first image.
fn start_metadata(
    config: &ServeConfig,
    machine: MachineId,
    gossip: Option<&Gossip>,
) -> Result<(ControllerService, MetadataImage), ServeError> {
    let service_config = quorum_config(config, machine, gossip)?;
    let alone = service_config.voters.len() == 1 && service_config.voters[0].0 == machine;
    let legacy = metadata::load(&config.data)?;
    if legacy.is_some() && !alone {
        return Err(ServeError::Voter {
            address: config.data.join("metadata.rkyv").display().to_string(),
            reason: "metadata from an older shardlog is migrated by a machine that is its own quorum: \
                     start it once without --controller-voters, then join it to the cluster"
                .into(),
        });
    }
    if service_config.listen.is_some() || !service_config.is_member() {
        let role = if service_config.is_member() { "voter" } else { "observer" };
        tracing::info!(machine = %machine, role, voters = ?config.voters()?, "joining the controller quorum");
    }
    let service = ControllerService::start(service_config, Some(bridge::decider(Arc::new(config.clone()))))?;
    let handle = service.handle();
    if let Some(gossip) = gossip {
        forward_suspicions(gossip, handle.clone());
    }
    let registration = bridge::Registration {
        machine,
        endpoints: core_endpoints(config),
        first_node_id: config.node_id_base,
        rack: config.rack.clone(),
        bootstrap_user: config.bootstrap_user(),
    };
    bridge::bootstrap(&handle, registration, legacy.clone()).map_err(ServeError::Bootstrap)?;
    if legacy.is_some() {
        metadata::retire(&config.data)?;
    }
    let image = bridge::local_image(&handle.image(), machine);
    let nodes: Vec<i32> = image.nodes.iter().map(|n| n.node_id.0).collect();
    tracing::debug!(machine = %machine, cluster_id = %image.durable.cluster_id, ?nodes, "metadata ready");
    Ok((service, image))
}

/// Runs the broker until SIGTERM or SIGINT, then shuts down cleanly; takes a
/// config from `ServeConfig::resolve` (a relative path is refused). A core
/// that cannot start (a port in use, a log it cannot open) ends the
/// process: the cores that did start are shut down cleanly and the error,
/// naming that core, is returned.
pub fn serve(config: ServeConfig) -> Result<(), ServeError> {
    config.validate()?;
    raise_open_files_limit();
    std::fs::create_dir_all(&config.data)
        .map_err(|source| ServeError::DataDir { path: config.data.display().to_string(), source })?;
    // Held until this function returns, after every core has stopped.
    let _data_lock = data_lock::DataDirLock::acquire(&config.data)?;
    let legacy_offsets = legacy_groups::read(&config.data)?;
    let machine = machine_id::load_or_create(&config.data, config.machine_id)?;
    let gossip = start_gossip(&config, machine)?;
    let (controller, image) = start_metadata(&config, machine, gossip.as_ref())?;
    let image = Arc::new(image);
    let config = Arc::new(config);
    let cores = config.core_count();
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..cores).map(|_| flume::bounded::<ShardMessage>(constants::INBOX_DEPTH)).unzip();
    // Each core reports once (see `StartReport`): a bound of one per core.
    let (ready_tx, ready_rx) = flume::bounded::<StartOutcome>(cores);
    let limits = limits::ConnectionLimits::new(config.connections_max, config.connections_per_ip_max)
        .with_login_failures_max(config.sasl_login_failures_max);
    let health = http::Health::new();
    let mut handles = Vec::with_capacity(cores);
    let mut spawn_failure = None;
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (core, inbox) in receivers.into_iter().enumerate() {
        let placement = if config.pin && cores <= online { Placement::Fixed(core) } else { Placement::Unbound };
        let start = CoreStart {
            core,
            config: config.clone(),
            image: image.clone(),
            controller: (controller.handle(), machine),
            senders: senders.clone(),
            inbox,
            report: StartReport { core, sender: Some(ready_tx.clone()) },
            limits: limits.clone(),
            health: health.clone(),
        };
        let spawned = LocalExecutorBuilder::new(placement)
            .name(&format!("shardlog-core-{core}"))
            .io_memory(config.io_memory_bytes)
            .spin_before_park(Duration::from_micros(0))
            .spawn(move || run_core(start));
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(source) => {
                spawn_failure = Some(ServeError::Spawn { core, source });
                break;
            }
        }
    }
    drop(ready_tx);
    let started = match spawn_failure {
        Some(err) => Err(err),
        None => wait_until_started(&ready_rx, cores),
    };
    if let Err(err) = started {
        stop_after_failed_start(&senders, handles);
        return Err(err);
    }
    health.set_started();
    tracing::info!(cores, port = config.port, listener = ?config.listener, data = %config.data.display(), "shardlog serving");
    if let Some(groups) = legacy_offsets {
        let host = if config.host.is_unspecified() { "127.0.0.1".to_string() } else { config.host.to_string() };
        let bootstrap =
            if host.contains(':') { format!("[{host}]:{}", config.port) } else { format!("{host}:{}", config.port) };
        legacy_groups::spawn_import(config.data.clone(), bootstrap, groups);
    }
    wait_for_signal();
    health.set_stopping();
    tracing::info!("shutting down");
    let wait = Duration::from_millis(constants::CONTROLLED_SHUTDOWN_WAIT_MS);
    bridge::controlled_shutdown(&controller.handle(), machine, wait);
    await_cores_applied(&senders, &controller.handle());
    stop_cores(&senders);
    for handle in handles {
        let _ = handle.join();
    }
    drop(controller);
    drop(gossip);
    tracing::info!("stopped");
    Ok(())
}

/// Why a core could not start. `ServeError::Core` names the core, so these
/// messages do not.
#[derive(Debug, thiserror::Error)]
pub enum CoreStartError {
    #[error("cannot listen for metrics on {address}: {source} (set --metrics-port, 0 disables)")]
    MetricsListen { address: SocketAddr, source: std::io::Error },
    #[error("opening partitions failed: {0}")]
    Partitions(crate::shard::ShardError),
    #[error("opening the group offsets log failed: {0}")]
    Groups(crate::shard::groups::GroupServiceError),
    #[error("cannot listen on {address}: {source}")]
    Listen { address: SocketAddr, source: std::io::Error },
    #[error("its executor ended before the core started")]
    Exited,
}

/// One core's report on its start.
struct StartOutcome {
    core: usize,
    result: Result<(), CoreStartError>,
}

/// A core's one report to `serve`. A core that ends without reporting (its
/// executor failed to build, or it panicked) reports `Exited` when this is
/// dropped: `serve` waits for every core's report, and the cores that serve
/// keep their reports' senders alive for as long as they serve, so a core
/// that vanished silently would leave `serve` waiting for ever.
struct StartReport {
    core: usize,
    sender: Option<flume::Sender<StartOutcome>>,
}

impl StartReport {
    fn send(mut self, result: Result<(), CoreStartError>) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(StartOutcome { core: self.core, result });
        }
    }
}

impl Drop for StartReport {
    fn drop(&mut self) {
        if let Some(sender) = self.sender.take() {
            let _ = sender.send(StartOutcome { core: self.core, result: Err(CoreStartError::Exited) });
        }
    }
}

/// Waits for every core's report; the first failure ends the wait.
fn wait_until_started(ready: &flume::Receiver<StartOutcome>, cores: usize) -> Result<(), ServeError> {
    for _ in 0..cores {
        let outcome = ready.recv().expect("each core reports once, before its report's sender goes");
        if let Err(source) = outcome.result {
            return Err(ServeError::Core { core: outcome.core, source: Box::new(source) });
        }
    }
    Ok(())
}

/// Waits (bounded) until every core holds the last committed image, so
/// that they answer NOT_LEADER_OR_FOLLOWER for the partitions a controlled
/// shutdown moved away before they stop.
fn await_cores_applied(senders: &[flume::Sender<ShardMessage>], handle: &ControllerHandle) {
    let committed = handle.image().provenance.offset;
    let deadline = std::time::Instant::now() + Duration::from_millis(constants::CONTROLLED_SHUTDOWN_WAIT_MS);
    for sender in senders {
        loop {
            let (reply, answer) = flume::bounded(1);
            if sender.send(ShardMessage::ImageVersion { reply }).is_err() {
                break;
            }
            match answer.recv_timeout(Duration::from_millis(500)) {
                Ok(version) if version >= committed => break,
                Ok(_) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
                _ => break,
            }
        }
    }
}

/// Asks every core to shut down and waits for each to close its logs (bounded).
fn stop_cores(senders: &[flume::Sender<ShardMessage>]) {
    let mut waits = Vec::new();
    for sender in senders {
        let (done, wait) = flume::bounded(1);
        if sender.send(ShardMessage::Shutdown { done }).is_ok() {
            waits.push(wait);
        }
    }
    for wait in waits {
        let _ = wait.recv_timeout(Duration::from_millis(constants::SHUTDOWN_CORE_WAIT_MS));
    }
}

/// After a core failed to start: asks every core to shut down and waits for
/// every core's thread to end. A core that failed has ended or is ending; one
/// that serves shuts down; one still starting finds the request once it
/// serves, or fails too. It joins the threads rather than wait for each
/// core's `done`: a request queued to a core that then ends is never
/// answered, and `senders` keeps it, and its `done`, alive.
fn stop_after_failed_start(senders: &[flume::Sender<ShardMessage>], handles: Vec<glommio::ExecutorJoinHandle<()>>) {
    for sender in senders {
        let (done, _) = flume::bounded(1);
        let _ = sender.send(ShardMessage::Shutdown { done });
    }
    for handle in handles {
        let _ = handle.join();
    }
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
/// `BIND_RETRY_MS` before giving up, saying so once.
async fn bind_with_retry(address: SocketAddr, mode: ListenerMode) -> std::io::Result<glommio::net::TcpListener> {
    let deadline = std::time::Instant::now() + Duration::from_millis(constants::BIND_RETRY_MS);
    let mut said = false;
    loop {
        match listener::bind(address, mode) {
            Err(err) if err.kind() == std::io::ErrorKind::AddrInUse && std::time::Instant::now() < deadline => {
                if !said {
                    tracing::warn!(%address, retry_ms = constants::BIND_RETRY_MS, "address in use; retrying");
                    said = true;
                }
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
    /// The controller service (core 0 hosts the broker's side of it).
    controller: (ControllerHandle, MachineId),
    senders: Vec<flume::Sender<ShardMessage>>,
    inbox: flume::Receiver<ShardMessage>,
    report: StartReport,
    limits: Arc<limits::ConnectionLimits>,
    health: Arc<http::Health>,
}

async fn run_core(start: CoreStart) {
    let CoreStart { core, config, image, controller, senders, inbox, report, limits, health } = start;
    crate::log::set_core_cache_bytes_max(config.cache_bytes_max);
    let shard = Shard::new(ShardId(core as u32), config.clone(), image.clone(), senders, Some(controller));
    // Core 0 serves /metrics and /v1/ready from before recovery until it stops.
    let http = if core == 0 { http::start(&shard, &config, health).await } else { Ok(None) };
    let _http = match http {
        Ok(task) => task,
        Err(err) => return report.send(Err(err)),
    };
    let listener = match open_and_bind(&shard, image, core).await {
        Ok(listener) => listener,
        Err(err) => {
            // Whatever it opened closes cleanly: the next start needs no recovery.
            shard.shutdown().await;
            return report.send(Err(err));
        }
    };
    glommio::spawn_local(shard.clone().run_maintenance()).detach();
    glommio::spawn_local(shard.clone().follow_controller()).detach();
    glommio::spawn_local(shard.clone().run_isr_ticks()).detach();
    {
        let probing = shard.clone();
        glommio::spawn_local(crate::metrics::run_task_delay_probe(move || probing.shutting_down.get())).detach();
    }
    let inbox_task = glommio::spawn_local(shard.clone().run_inbox(inbox));
    report.send(Ok(()));
    listener::run(shard.clone(), listener, limits).await;
    inbox_task.await;
}

/// Starts the core's group service, recovers its partitions (loading the
/// groups of those of `__consumer_offsets` it leads), then binds its port.
async fn open_and_bind(
    shard: &Rc<Shard>,
    image: Arc<MetadataImage>,
    core: usize,
) -> Result<glommio::net::TcpListener, CoreStartError> {
    // The group service first: applying the image tells it which
    // partitions of __consumer_offsets this core leads.
    shard.open_groups().map_err(CoreStartError::Groups)?;
    shard.apply_image(image).await.map_err(CoreStartError::Partitions)?;
    if let Some(groups) = shard.group_service() {
        groups.await_loaded(Duration::from_secs(30)).await;
    }
    let config = &shard.config;
    let port = config.port + if config.listener == ListenerMode::PerCore { core as u16 } else { 0 };
    let address = SocketAddr::new(config.host, port);
    bind_with_retry(address, config.listener).await.map_err(|source| CoreStartError::Listen { address, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_that_ends_without_reporting_fails_the_start_instead_of_hanging_it() {
        let (sender, ready) = flume::bounded(2);
        // A core that serves keeps its sender for as long as it serves.
        let _serving = sender.clone();
        StartReport { core: 0, sender: Some(sender.clone()) }.send(Ok(()));
        drop(StartReport { core: 1, sender: Some(sender) });
        match wait_until_started(&ready, 2) {
            Err(ServeError::Core { core: 1, source }) if matches!(*source, CoreStartError::Exited) => {}
            other => panic!("{other:?}"),
        }
    }
}
