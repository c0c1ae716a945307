//! Membership by SWIM gossip (issue 29), through the `foca` crate: each
//! machine runs one thread with a UDP socket on `--gossip-port`, and spreads
//! who it is (`Peer`: machine id, Kafka address and core count, rack, its
//! controller address when it votes) and who is alive. A new machine needs
//! one seed (`--seeds`); without `--controller-voters` it learns the voters
//! from gossip and follows the metadata log as an observer.
//!
//! Gossip is a fast hint, never the authority: the controller fences a
//! machine on its own lease (`service::MACHINE_LEASE`), and when gossip
//! declares a machine down the controller fences it at once unless it heard
//! from it just now (`ControllerHandle::suspect`). A false suspicion heals by
//! itself: the machine's next heartbeat unfences it.
//!
//! foca is sans-IO: this thread feeds it datagrams and due timers and
//! carries out what it asks (`AccumulatingRuntime`). The seeds are announced
//! to at start and again every `REANNOUNCE_EVERY` (a machine that saw every
//! other as down would otherwise never recover: foca#15), and at once while
//! no member is known.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{SocketAddr, ToSocketAddrs, UdpSocket};
use std::num::{NonZeroU32, NonZeroUsize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use foca::{AccumulatingRuntime, Config, Foca, Identity, OwnedNotification, PostcardCodec, Timer};
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

use super::ids::MachineId;

/// Seeds are announced to this often, whatever gossip says.
const REANNOUNCE_EVERY: Duration = Duration::from_secs(5);
/// While no member is known, this often.
const REANNOUNCE_ALONE_EVERY: Duration = Duration::from_millis(500);
/// How long the thread waits for a datagram before looking at its timers.
const POLL: Duration = Duration::from_millis(50);
/// foca keeps packets at most this large.
const PACKET_BYTES_MAX: usize = 1400;

/// What a machine tells the others about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Peer {
    pub machine: u64,
    /// Where its gossip listens.
    pub gossip: SocketAddr,
    /// Its start time in ns: a restarted machine is a new identity that
    /// wins over the one it replaces.
    pub generation: u64,
    /// Kafka host and core 0's port; core i is port + i.
    pub kafka_host: String,
    pub kafka_port: u16,
    pub cores: u16,
    pub rack: Option<String>,
    /// `host:port` of its controller, when it votes.
    pub controller: Option<String>,
}

/// Identified by its gossip address, so an announce to a seed, whose
/// machine id is not known yet, reaches it.
impl Identity for Peer {
    type Addr = SocketAddr;

    fn renew(&self) -> Option<Self> {
        Some(Self { generation: self.generation + 1, ..self.clone() })
    }

    fn addr(&self) -> SocketAddr {
        self.gossip
    }

    fn win_addr_conflict(&self, adversary: &Self) -> bool {
        self.generation > adversary.generation
    }
}

/// Who gossip says is up, and who went down.
#[derive(Debug, Clone, Default)]
pub struct Members {
    pub up: BTreeMap<u64, Peer>,
    pub down: BTreeSet<u64>,
}

pub struct GossipConfig {
    pub me: Peer,
    /// Where the socket binds (the advertised `me.gossip` may differ).
    pub bind: SocketAddr,
    /// `host:port` of machines to announce to.
    pub seeds: Vec<String>,
}

/// The running gossip thread; it stops when dropped.
pub struct Gossip {
    members: Arc<Mutex<Members>>,
    downs: flume::Receiver<MachineId>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    bound: SocketAddr,
}

impl Gossip {
    pub fn start(config: GossipConfig) -> std::io::Result<Gossip> {
        let socket = UdpSocket::bind(config.bind)?;
        let bound = socket.local_addr()?;
        socket.set_read_timeout(Some(POLL))?;
        let members = Arc::new(Mutex::new(Members::default()));
        let (downs_tx, downs) = flume::bounded(1024);
        let stopping = Arc::new(AtomicBool::new(false));
        let state = (members.clone(), stopping.clone());
        let thread = std::thread::Builder::new()
            .name("shardlog-gossip".into())
            .spawn(move || run(config, socket, &state.0, &downs_tx, &state.1))?;
        Ok(Gossip { members, downs, stopping, thread: Some(thread), bound })
    }

    /// Who is up and who went down, as this machine's gossip sees it.
    pub fn members(&self) -> Members {
        self.members.lock().expect("not poisoned").clone()
    }

    /// Machines gossip declared down, as it happens.
    pub fn downs(&self) -> flume::Receiver<MachineId> {
        self.downs.clone()
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.bound
    }
}

impl Drop for Gossip {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// SWIM settings for machines in one data centre: a probe every 300 ms
/// answered within 150 ms, a suspect is down after 600 ms, so a dead
/// machine is declared down in about a second, well inside the
/// controller's 2 s lease (memberlist's LAN defaults, 1 s and about 4 s,
/// would never beat the lease).
fn foca_config() -> Config {
    let mut config = Config::new_lan(NonZeroU32::new(16).expect("not zero"));
    config.probe_period = Duration::from_millis(300);
    config.probe_rtt = Duration::from_millis(150);
    config.suspect_to_down_after = Duration::from_millis(600);
    config.max_packet_size = NonZeroUsize::new(PACKET_BYTES_MAX).expect("not zero");
    config
}

fn run(
    config: GossipConfig,
    socket: UdpSocket,
    members: &Mutex<Members>,
    downs: &flume::Sender<MachineId>,
    stopping: &AtomicBool,
) {
    let me = config.me.clone();
    let rng = rand::rngs::StdRng::seed_from_u64(me.generation ^ me.machine.rotate_left(32));
    let mut foca = Foca::new(me.clone(), foca_config(), rng, PostcardCodec);
    let mut runtime = AccumulatingRuntime::new();
    let mut timers: BTreeMap<(Instant, u64), Timer<Peer>> = BTreeMap::new();
    let mut sequence = 0u64;
    let mut last_announce: Option<Instant> = None;
    let mut buf = vec![0u8; PACKET_BYTES_MAX * 2];
    while !stopping.load(Ordering::SeqCst) {
        let now = Instant::now();
        let alone = members.lock().expect("not poisoned").up.is_empty();
        let every = if alone { REANNOUNCE_ALONE_EVERY } else { REANNOUNCE_EVERY };
        if last_announce.is_none_or(|at| now.duration_since(at) >= every) {
            last_announce = Some(now);
            for seed in
                seed_addresses(&config.seeds).into_iter().filter(|a| *a != me.gossip && *a != socket_addr(&socket))
            {
                // The seed's identity is not known yet: a placeholder with
                // its address (the address is what foca matches) carries the announce.
                let placeholder = Peer { machine: 0, gossip: seed, generation: 0, ..me.clone() };
                if let Err(err) = foca.announce(placeholder, &mut runtime) {
                    tracing::debug!(error = %err, %seed, "gossip announce failed");
                }
            }
        }
        match socket.recv_from(&mut buf) {
            Ok((len, _)) => {
                if let Err(err) = foca.handle_data(&buf[..len], &mut runtime) {
                    tracing::debug!(error = %err, "gossip: a datagram foca refused");
                }
            }
            Err(err) if matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(err) => tracing::debug!(error = %err, "gossip: receive failed"),
        }
        let now = Instant::now();
        while let Some(entry) = timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let timer = entry.remove();
            if let Err(err) = foca.handle_timer(timer, &mut runtime) {
                tracing::debug!(error = %err, "gossip: a timer foca refused");
            }
        }
        drain(&mut runtime, &socket, &mut timers, &mut sequence, members, downs);
    }
    let _ = foca.leave_cluster(&mut runtime);
    drain(&mut runtime, &socket, &mut timers, &mut sequence, members, downs);
}

fn socket_addr(socket: &UdpSocket) -> SocketAddr {
    socket.local_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}

fn seed_addresses(seeds: &[String]) -> Vec<SocketAddr> {
    seeds.iter().filter_map(|s| s.to_socket_addrs().ok()?.next()).collect()
}

/// Carries out what foca asked: datagrams, timers and membership changes.
fn drain(
    runtime: &mut AccumulatingRuntime<Peer>,
    socket: &UdpSocket,
    timers: &mut BTreeMap<(Instant, u64), Timer<Peer>>,
    sequence: &mut u64,
    members: &Mutex<Members>,
    downs: &flume::Sender<MachineId>,
) {
    while let Some((to, data)) = runtime.to_send() {
        let _ = socket.send_to(&data, to.gossip);
    }
    while let Some((after, timer)) = runtime.to_schedule() {
        *sequence += 1;
        timers.insert((Instant::now() + after, *sequence), timer);
    }
    while let Some(notification) = runtime.to_notify() {
        let mut members = members.lock().expect("not poisoned");
        match notification {
            OwnedNotification::MemberUp(peer) => {
                tracing::info!(machine = peer.machine, gossip = %peer.gossip, "gossip: machine up");
                members.down.remove(&peer.machine);
                members.up.insert(peer.machine, peer);
            }
            OwnedNotification::MemberDown(peer) => {
                // An older generation going down is the restart of one that
                // is up again.
                if members.up.get(&peer.machine).is_some_and(|up| up.generation > peer.generation) {
                    continue;
                }
                tracing::info!(machine = peer.machine, "gossip: machine down");
                members.up.remove(&peer.machine);
                members.down.insert(peer.machine);
                if let Some(machine) = MachineId::new(peer.machine) {
                    let _ = downs.try_send(machine);
                }
            }
            OwnedNotification::Rename(old, new) => {
                members.up.remove(&old.machine);
                members.up.insert(new.machine, new);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(machine: u64, gossip: SocketAddr, controller: Option<&str>) -> Peer {
        Peer {
            machine,
            gossip,
            generation: machine * 1000,
            kafka_host: "127.0.0.1".into(),
            kafka_port: 9092,
            cores: 2,
            rack: None,
            controller: controller.map(Into::into),
        }
    }

    fn start(machine: u64, seeds: Vec<String>) -> Gossip {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = socket.local_addr().unwrap();
        drop(socket);
        let me = peer(machine, addr, (machine == 1).then_some("127.0.0.1:9300"));
        Gossip::start(GossipConfig { me, bind: addr, seeds }).unwrap()
    }

    fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "{what} within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn machines_that_know_one_seed_find_each_other_and_a_stopped_one_is_declared_down() {
        let first = start(1, Vec::new());
        let seed = vec![first.local_addr().to_string()];
        let second = start(2, seed.clone());
        let third = start(3, seed);
        until("everyone sees everyone", || [&first, &second, &third].iter().all(|g| g.members().up.len() == 2));
        // What a machine says of itself reaches the others.
        assert_eq!(third.members().up[&1].controller.as_deref(), Some("127.0.0.1:9300"));
        assert_eq!(second.members().up[&3].cores, 2);
        let downs = first.downs();
        drop(third);
        until("machine 3 declared down", || first.members().down.contains(&3));
        assert_eq!(downs.try_recv().ok(), MachineId::new(3));
        until("machine 2 agrees", || second.members().down.contains(&3) && !second.members().up.contains_key(&3));
    }
}
