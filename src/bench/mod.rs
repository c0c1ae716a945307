//! `shardlog bench`: a load generator that speaks the Kafka protocol, so it
//! measures shardlog and any other Kafka-compatible broker the same way.
//!
//! ```text
//!  main thread                         bench core 0 .. N-1 (glommio executors)
//!  ───────────                         ──────────────────────────────────────
//!  parse flags, spawn the broker       producers: make, batch, send to leaders
//!  prepare: versions, topic, offsets   consumers: fetch from leaders, check
//!  start cores ───── RunShared ──────▶ every second: Tick (histograms, counts)
//!  merge ticks, print progress ◀───────┘ at the end: CoreResult (verify data)
//!  table, JSON, .hgrm, SVG, exit code
//! ```
//!
//! Thread-per-core like the broker: each core runs its own producer and
//! consumer clients with their own pipelined connections (`client::pipelined`);
//! nothing is shared between cores but read-only run data and a few atomic
//! counts. Latency goes into HDR histograms per core, merged on the main
//! thread. In fixed-rate mode latency counts from each message's intended
//! send time (`rate`), so stalls are not hidden (no coordinated omission).

pub mod args;
pub mod consumer;
pub mod core;
pub mod histogram;
pub mod history;
pub mod payload;
pub mod plot;
pub mod producer;
pub mod rate;
pub mod report;
pub mod spawn;
pub mod verify;

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glommio::{LocalExecutorBuilder, Placement};

use self::args::{BenchArgs, Limit, Mode, StartFrom, Workload};
use self::core::{
    Clock, ConsumeUntil, ConsumerSpec, CoreMessage, CoreResult, CoreSpec, PartitionRead, ProducerSpec, RunShared, Tick,
};
use self::histogram::Latencies;
use self::rate::Schedule;
use self::report::{BrokerReport, GeneratorReport, Machine, Report, TargetReport, Throughput, WorkloadReport};
use self::spawn::{process_cpu, CpuTimes, SpawnOptions, SpawnedBroker};
use crate::client::pipelined::{Cluster, ConnectionOptions, Topology, Versions};
use crate::constants::IO_MEMORY_BYTES_DEFAULT;
use crate::protocol::list_offsets::{EARLIEST_TIMESTAMP, LATEST_TIMESTAMP};
use crate::protocol::ErrorCode;

/// How long the topic may take to appear with a leader for every partition.
const TOPIC_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The progress line trails the cores' ticks by this much.
const PRINT_LAG: Duration = Duration::from_millis(100);
/// Filler bytes each run cuts values from.
const FILLER_BYTES_MIN: usize = 1024 * 1024;

/// Runs the benchmark; `Ok(false)` when it ran but failed (errors, or
/// `--verify` found lost, duplicated or reordered records).
pub fn run(args: BenchArgs) -> Result<bool, String> {
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    let spawn = args.brokers.is_none();
    let broker_cores = args.broker_cores.unwrap_or((online / 2).max(1));
    let cores = args.cores.unwrap_or(if spawn { online.saturating_sub(broker_cores).max(1) } else { online.max(1) });
    let mut workload = args.workload(cores).map_err(|e| e.to_string())?;
    if !spawn && (args.broker_cores.is_some() || args.flush.is_some() || args.listener.is_some()) {
        return Err("--broker-cores, --flush and --listener configure a spawned broker; with --brokers, configure that broker instead".into());
    }
    if workload.mode == Mode::Consume && workload.from == StartFrom::Tail {
        if spawn {
            return Err("consume --from tail reads what others write, and a spawned broker has no other writers: use e2e, or --from beginning".into());
        }
        if matches!(workload.limit, Limit::Messages(_)) {
            return Err("consume --from tail runs for a --duration".into());
        }
    }
    let interrupted = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register_conditional_shutdown(signal_hook::consts::SIGINT, 130, interrupted.clone());
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, interrupted.clone());

    let broker = match spawn {
        true => Some(SpawnedBroker::start(&SpawnOptions {
            cores: broker_cores,
            flush: args.flush.clone(),
            listener: args.listener,
            partitions: args.partitions as usize,
        })?),
        false => None,
    };
    let bootstrap = broker.as_ref().map_or_else(|| args.brokers.clone().unwrap_or_default(), SpawnedBroker::bootstrap);
    let prepared = on_executor({
        let (bootstrap, topic, partitions) = (bootstrap.clone(), workload.topic.clone(), workload.partitions);
        move || prepare(bootstrap, topic, partitions)
    })??;
    if prepared.topology.leaders.len() as i32 != workload.partitions {
        eprintln!(
            "note: topic {} already exists with {} partitions; using them (not --partitions {})",
            workload.topic,
            prepared.topology.leaders.len(),
            workload.partitions
        );
        workload.partitions = prepared.topology.leaders.len() as i32;
    }
    let placement_base = if spawn && broker_cores + cores <= online { Some(broker_cores) } else { None };
    let runner = Runner {
        workload: workload.clone(),
        topology: prepared.topology.clone(),
        versions: prepared.versions,
        run_id: payload::run_id(),
        filler: Arc::new(payload::filler(FILLER_BYTES_MIN.max(workload.message_bytes.max as usize * 2), 0x5eed)),
        broker: broker.as_ref(),
        placement_base,
        interrupted: interrupted.clone(),
    };

    let (fill, phase) = match workload.mode {
        Mode::Produce => (None, runner.run_phase(&Phase::produce(&workload))?),
        Mode::E2e => (None, runner.run_phase(&Phase::e2e(&workload, &prepared.latest))?),
        Mode::Consume => runner.consume(&bootstrap, &prepared, spawn)?,
    };

    let produce = (workload.mode != Mode::Consume).then(|| phase.produce_throughput());
    let consume = (workload.mode != Mode::Produce).then(|| phase.consume_throughput());
    let broker_cpu = phase.broker_cpu;
    let mut latencies = phase.totals.latencies.clone();
    let mut result = phase.result;
    let mut verify_sent = result.sent.clone();
    if let Some(fill) = &fill {
        verify_sent = fill.result.sent.clone();
        latencies.produce.add(&fill.totals.latencies.produce);
        result.refusals.extend(fill.result.refusals.clone());
        result.errors.extend(fill.result.errors.clone());
    }
    let verify = workload.verify.then(|| match workload.mode {
        Mode::Produce => verify::VerifyCounts { streams: verify_sent.len() as u64, ..Default::default() },
        _ => verify::verdict(&verify_sent, &result.seen),
    });
    if workload.verify && workload.mode != Mode::Produce && verify_sent.is_empty() {
        eprintln!("note: --verify found no records of this run to check (the topic was read as it was)");
    }
    if workload.verify && workload.mode == Mode::Produce {
        eprintln!("note: --verify checks what consumers read; produce mode has none (use e2e)");
    }
    let broker_report = broker.as_ref().and_then(|b| {
        let cpu = broker_cpu?;
        let moved = produce.map_or(0, |t| t.bytes) + consume.map_or(0, |t| t.bytes);
        Some(BrokerReport {
            pid: b.pid()?,
            cpu_user_s: cpu.user_s,
            cpu_system_s: cpu.system_s,
            cpu_s: cpu.total_s(),
            bytes_per_cpu_s: (cpu.total_s() > 0.0).then(|| moved as f64 / cpu.total_s()),
            rss_bytes: b.rss_bytes(),
            huge_pages: b.huge_pages(),
        })
    });
    let mut report = Report {
        shardlog_version: env!("CARGO_PKG_VERSION"),
        unix_time_s: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        command: std::env::args().collect(),
        workload: workload_report(&workload, &args),
        target: TargetReport {
            spawned: spawn,
            bootstrap: bootstrap.clone(),
            nodes: prepared.topology.nodes.len(),
            broker_cores: spawn.then_some(broker_cores),
            flush: args.flush.clone(),
            listener: args
                .listener
                .and_then(|l| clap::ValueEnum::to_possible_value(&l))
                .map(|v| v.get_name().to_string()),
        },
        machine: Machine::describe(),
        fill: fill.as_ref().map(PhaseResult::produce_throughput),
        produce,
        consume,
        latency_us: latencies.named().into_iter().map(|(name, h)| (name.to_string(), h.summary())).collect(),
        verify,
        broker: broker_report,
        generator: phase.generator_cpu.map(|g| g.report()),
        refused: result.refusals.into_iter().collect(),
        errors: result.errors,
        files: BTreeMap::new(),
    };
    if interrupted.load(Ordering::Relaxed) {
        report.errors.push("interrupted".into());
    }
    drop(broker);
    write_outputs(&args, &mut report, &latencies)?;
    print!("{}", report.table(&latencies));
    Ok(report.ok())
}

/// What the setup learned about the cluster and the topic.
struct Prepared {
    versions: Versions,
    topology: Topology,
    earliest: BTreeMap<i32, i64>,
    latest: BTreeMap<i32, i64>,
}

/// Versions, the topic (created when missing), its leaders and offsets.
async fn prepare(bootstrap: String, topic: String, partitions: i32) -> Result<Prepared, String> {
    let fail = |e: crate::client::ClientError| format!("{bootstrap}: {e}");
    let cluster = Cluster::connect(&bootstrap, ConnectionOptions::default()).await.map_err(fail)?;
    let mut topology = cluster.topology(&topic).await.map_err(fail)?;
    if topology.is_none() {
        let created = cluster.create_topic(&topic, partitions, &BTreeMap::new()).await.map_err(fail)?;
        if !created.error.is_ok() && created.error != ErrorCode::TopicAlreadyExists {
            return Err(format!(
                "cannot create topic {topic}: {:?} {}",
                created.error,
                created.error_message.unwrap_or_default()
            ));
        }
        let deadline = Instant::now() + TOPIC_READY_TIMEOUT;
        while topology.is_none() {
            if Instant::now() > deadline {
                return Err(format!("topic {topic} has no leader for every partition after {TOPIC_READY_TIMEOUT:?}"));
            }
            glommio::timer::sleep(Duration::from_millis(50)).await;
            topology = cluster.topology(&topic).await.map_err(fail)?;
        }
    }
    let topology = topology.expect("loop ends with a topology");
    let all: Vec<i32> = (0..topology.leaders.len() as i32).collect();
    let earliest = cluster.list_offsets(&topic, &topology, &all, EARLIEST_TIMESTAMP).await.map_err(fail)?;
    let latest = cluster.list_offsets(&topic, &topology, &all, LATEST_TIMESTAMP).await.map_err(fail)?;
    Ok(Prepared { versions: cluster.versions(), topology, earliest, latest })
}

/// Runs a future on a short-lived executor of its own and returns its output.
fn on_executor<G, F, T>(make: G) -> Result<T, String>
where
    G: FnOnce() -> F + Send + 'static,
    F: std::future::Future<Output = T> + 'static,
    T: Send + 'static,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .name("bench-setup")
        .io_memory(IO_MEMORY_BYTES_DEFAULT)
        .spawn(make)
        .map_err(|e| format!("cannot start an executor: {e}"))?
        .join()
        .map_err(|e| format!("executor failed: {e}"))
}

/// One phase of a run: who runs, where consumers start, when they stop.
struct Phase {
    label: &'static str,
    producers: bool,
    consumers: Option<Vec<PartitionRead>>,
    consume_until: ConsumeUntil,
    time_e2e: bool,
    only_this_run: bool,
    warmup: Duration,
    limit: Limit,
}

impl Phase {
    fn produce(workload: &Workload) -> Self {
        Phase {
            label: "produce",
            producers: true,
            consumers: None,
            consume_until: ConsumeUntil::EndOffsets,
            time_e2e: false,
            only_this_run: true,
            warmup: workload.warmup,
            limit: workload.limit,
        }
    }

    fn e2e(workload: &Workload, latest: &BTreeMap<i32, i64>) -> Self {
        Phase {
            label: "e2e",
            consumers: Some(reads(latest, None)),
            consume_until: ConsumeUntil::ProducersDone { drain: consumer::DRAIN },
            time_e2e: true,
            ..Phase::produce(workload)
        }
    }
}

fn reads(from: &BTreeMap<i32, i64>, until: Option<&BTreeMap<i32, i64>>) -> Vec<PartitionRead> {
    from.iter()
        .map(|(&index, &offset)| PartitionRead {
            index,
            offset,
            until: until.map(|u| u.get(&index).copied().unwrap_or(offset)),
        })
        .collect()
}

/// What one phase measured.
struct PhaseResult {
    totals: Tick,
    result: CoreResult,
    clock: Clock,
    broker_cpu: Option<CpuTimes>,
    generator_cpu: Option<GeneratorCpu>,
}

/// The generator's own CPU use over a phase's measured window.
#[derive(Debug, Clone, Copy)]
struct GeneratorCpu {
    cores: usize,
    cpu: CpuTimes,
    window: Duration,
}

impl GeneratorCpu {
    fn report(&self) -> GeneratorReport {
        let capacity = self.cores as f64 * self.window.as_secs_f64();
        GeneratorReport {
            cores: self.cores,
            window_s: self.window.as_secs_f64(),
            cpu_user_s: self.cpu.user_s,
            cpu_system_s: self.cpu.system_s,
            cpu_s: self.cpu.total_s(),
            busy: (capacity > 0.0).then(|| self.cpu.total_s() / capacity),
        }
    }
}

impl PhaseResult {
    fn produce_throughput(&self) -> Throughput {
        let end = self.result.last_ack.unwrap_or(self.clock.measure_from);
        Throughput::new(self.totals.produced_measured, end.saturating_duration_since(self.clock.measure_from))
    }

    fn consume_throughput(&self) -> Throughput {
        let end = self.result.last_receipt.unwrap_or(self.clock.measure_from);
        Throughput::new(self.totals.consumed_measured, end.saturating_duration_since(self.clock.measure_from))
    }
}

/// Starts phases on the load-generator cores.
struct Runner<'a> {
    workload: Workload,
    topology: Topology,
    versions: Versions,
    run_id: u32,
    filler: Arc<Vec<u8>>,
    broker: Option<&'a SpawnedBroker>,
    /// First CPU to pin bench cores to (after the spawned broker's).
    placement_base: Option<usize>,
    interrupted: Arc<AtomicBool>,
}

impl Runner<'_> {
    /// Consume mode: fill the topic first when it is empty or the broker
    /// is ours, then read it all from the beginning (or tail it).
    fn consume(
        &self,
        bootstrap: &str,
        prepared: &Prepared,
        spawn: bool,
    ) -> Result<(Option<PhaseResult>, PhaseResult), String> {
        let workload = &self.workload;
        if workload.from == StartFrom::Tail {
            let phase = Phase {
                label: "consume",
                producers: false,
                consumers: Some(reads(&prepared.latest, None)),
                consume_until: ConsumeUntil::Deadline(Instant::now()),
                time_e2e: true,
                only_this_run: false,
                ..Phase::produce(workload)
            };
            return Ok((None, self.run_phase(&phase)?));
        }
        let empty = prepared.latest.iter().all(|(p, &end)| prepared.earliest.get(p).is_some_and(|&start| start >= end));
        let fill = if spawn || empty {
            eprintln!("filling topic {} before reading it back", workload.topic);
            Some(self.run_phase(&Phase { label: "fill", warmup: Duration::ZERO, ..Phase::produce(workload) })?)
        } else {
            None
        };
        let latest = on_executor({
            let (bootstrap, topic, topology) = (bootstrap.to_string(), workload.topic.clone(), self.topology.clone());
            move || async move {
                let cluster =
                    Cluster::connect(&bootstrap, ConnectionOptions::default()).await.map_err(|e| e.to_string())?;
                cluster.metadata(Some(vec![topic.clone()])).await.map_err(|e| e.to_string())?;
                let all: Vec<i32> = (0..topology.leaders.len() as i32).collect();
                cluster.list_offsets(&topic, &topology, &all, LATEST_TIMESTAMP).await.map_err(|e| e.to_string())
            }
        })??;
        let phase = Phase {
            label: "consume",
            producers: false,
            consumers: Some(reads(&prepared.earliest, Some(&latest))),
            consume_until: ConsumeUntil::EndOffsets,
            time_e2e: false,
            only_this_run: false,
            warmup: Duration::ZERO,
            limit: workload.limit,
        };
        Ok((fill, self.run_phase(&phase)?))
    }

    fn run_phase(&self, phase: &Phase) -> Result<PhaseResult, String> {
        let workload = &self.workload;
        let measure = match phase.limit {
            Limit::Duration(duration) => Some(duration),
            Limit::Messages(_) => None,
        };
        let clock = Clock::new(phase.warmup, measure);
        let consume_until = match phase.consume_until {
            ConsumeUntil::Deadline(_) => ConsumeUntil::Deadline(clock.deadline.unwrap_or(clock.measure_from)),
            other => other,
        };
        let specs = self.plan(phase, &clock);
        let producers = specs.iter().map(|s| s.producers.len()).sum::<usize>();
        let shared = Arc::new(RunShared {
            workload: workload.clone(),
            topology: self.topology.clone(),
            versions: self.versions,
            clock,
            control: core::Control { producers_running: producers.into(), ..Default::default() },
            run_id: self.run_id,
            filler: self.filler.as_ref().clone(),
            consume_until,
            time_e2e: phase.time_e2e,
            only_this_run: phase.only_this_run,
        });
        if producers == 0 {
            shared.control.producers_done_ms.store(1, Ordering::Release);
        }
        // Bounded in effect: a core sends one tick a second and one result.
        let (sender, receiver) = flume::unbounded::<CoreMessage>();
        let mut handles = Vec::with_capacity(specs.len());
        for spec in specs {
            let placement = self.placement_base.map_or(Placement::Unbound, |base| Placement::Fixed(base + spec.core));
            let (shared, sender) = (shared.clone(), sender.clone());
            let handle = LocalExecutorBuilder::new(placement)
                .name(&format!("bench-core-{}", spec.core))
                .io_memory(IO_MEMORY_BYTES_DEFAULT)
                .spawn(move || core::run(spec, shared, sender))
                .map_err(|e| format!("cannot start a bench core: {e}"))?;
            handles.push(handle);
        }
        drop(sender);
        let cores = handles.len();
        let mut totals = Tick::default();
        let mut result = CoreResult::default();
        let mut interval = Tick::default();
        let mut done = 0;
        let mut cpu_start = None;
        // This process's own CPU over the measured window: how busy the
        // generator's cores were (is the generator the limit?).
        let mut own_start: Option<(CpuTimes, Instant)> = None;
        let mut window_started = false;
        // Print just after the cores' ticks for the same second came in.
        let mut last_print = Instant::now() + PRINT_LAG;
        let terminal = std::io::stderr().is_terminal();
        while done < cores {
            let now = Instant::now();
            if !window_started && now >= clock.measure_from {
                window_started = true;
                cpu_start = self.broker.and_then(SpawnedBroker::cpu);
                own_start = process_cpu("self").map(|cpu| (cpu, now));
            }
            let next_print = last_print + core::TICK_INTERVAL;
            let wake = if !window_started { next_print.min(clock.measure_from.max(now)) } else { next_print };
            match receiver.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(CoreMessage::Tick(tick)) => {
                    totals.merge(&tick);
                    interval.merge(&tick);
                }
                Ok(CoreMessage::Done(core_result)) => {
                    result.merge(*core_result);
                    done += 1;
                }
                Err(flume::RecvTimeoutError::Timeout) => {}
                Err(flume::RecvTimeoutError::Disconnected) => break,
            }
            if self.interrupted.load(Ordering::Relaxed) {
                shared.control.abort.store(true, Ordering::Relaxed);
            }
            let now = Instant::now();
            if now >= next_print {
                let line = report::progress_line(
                    now - clock.start,
                    now < clock.measure_from,
                    &interval,
                    (now - last_print).as_secs_f64(),
                    &totals,
                );
                let label = if phase.label == "fill" { " fill" } else { "" };
                if terminal {
                    eprint!("\r\x1b[2K{line}{label}");
                } else {
                    eprintln!("{line}{label}");
                }
                let _ = std::io::stderr().flush();
                interval = Tick::default();
                last_print = now;
            }
        }
        if terminal {
            eprintln!();
        }
        let broker_cpu = match (cpu_start, self.broker.and_then(SpawnedBroker::cpu)) {
            (Some(start), Some(end)) => Some(end.since(&start)),
            _ => None,
        };
        let generator_cpu = own_start.and_then(|(start, at)| {
            let end = process_cpu("self")?;
            Some(GeneratorCpu { cores, cpu: end.since(&start), window: at.elapsed() })
        });
        for handle in handles {
            if let Err(e) = handle.join() {
                result.errors.push(format!("a bench core failed: {e}"));
            }
        }
        Ok(PhaseResult { totals, result, clock, broker_cpu, generator_cpu })
    }

    /// Spreads producers and consumers over cores and partitions.
    fn plan(&self, phase: &Phase, clock: &Clock) -> Vec<CoreSpec> {
        let workload = &self.workload;
        let clients = workload.clients();
        let partitions = workload.partitions;
        let mut specs: Vec<CoreSpec> =
            (0..workload.cores).map(|core| CoreSpec { core, ..Default::default() }).collect();
        for client in 0..clients {
            let core = client % workload.cores;
            if phase.producers {
                let own: Vec<i32> = if partitions as usize >= clients {
                    (0..partitions).filter(|p| *p as usize % clients == client).collect()
                } else {
                    vec![(client % partitions as usize) as i32]
                };
                let quota = match phase.limit {
                    Limit::Messages(total) => {
                        Some(total / clients as u64 + u64::from((client as u64) < total % clients as u64))
                    }
                    Limit::Duration(_) => None,
                };
                let schedule =
                    workload.rate_messages_per_s.map(|rate| Schedule::share(clock.start, rate, client, clients));
                specs[core].producers.push(ProducerSpec { id: client as u32, partitions: own, quota, schedule });
            }
            if let Some(reads) = &phase.consumers {
                let mine: Vec<PartitionRead> =
                    reads.iter().filter(|r| r.index as usize % clients == client).copied().collect();
                if !mine.is_empty() {
                    specs[core].consumers.push(ConsumerSpec { partitions: mine });
                }
            }
        }
        specs
    }
}

fn workload_report(workload: &Workload, args: &BenchArgs) -> WorkloadReport {
    WorkloadReport {
        mode: format!("{:?}", workload.mode).to_lowercase(),
        topic: workload.topic.clone(),
        partitions: workload.partitions,
        message_bytes: workload.message_bytes,
        keys: workload.keys.to_string(),
        batch_bytes: workload.batch_bytes,
        linger_ms: workload.linger.as_millis() as u64,
        acks: if workload.acks == -1 { "all".into() } else { workload.acks.to_string() },
        compression: args.compression.clone(),
        in_flight: workload.in_flight,
        duration_s: match workload.limit {
            Limit::Duration(d) => Some(d.as_secs_f64()),
            Limit::Messages(_) => None,
        },
        messages: match workload.limit {
            Limit::Messages(n) => Some(n),
            Limit::Duration(_) => None,
        },
        warmup_s: workload.warmup.as_secs_f64(),
        rate_msgs_per_s: workload.rate_messages_per_s,
        from: format!("{:?}", workload.from).to_lowercase(),
        verify: workload.verify,
        fetch_sessions: workload.fetch_sessions,
        cores: workload.cores,
        connections_per_core: workload.connections,
    }
}

/// `--hgrm`, `--plot`, `--json`; records the paths in the report.
fn write_outputs(args: &BenchArgs, report: &mut Report, latencies: &Latencies) -> Result<(), String> {
    let write = |path: &Path, text: &str| std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()));
    if let Some(path) = &args.hgrm {
        for (index, (name, latency)) in latencies.named().into_iter().enumerate() {
            let target = if index == 0 { path.clone() } else { sibling(path, name) };
            write(&target, &latency.hgrm())?;
            report.files.insert(format!("hgrm_{name}"), target.display().to_string());
        }
    }
    if let Some(path) = &args.plot {
        let named = latencies.named();
        let lines: Vec<(&str, &histogram::Latency)> = {
            let main: Vec<_> = named
                .iter()
                .filter(|(name, _)| *name != "fetch")
                .map(|(name, h)| (if *name == "e2e" { "end-to-end" } else { *name }, *h))
                .collect();
            if main.is_empty() {
                named.clone()
            } else {
                main
            }
        };
        let title = format!("shardlog bench {}: latency by percentile", report.workload.mode);
        plot::write_svg(path, &title, &lines)?;
        report.files.insert("plot".into(), path.display().to_string());
    }
    if let Some(path) = &args.json {
        report.files.insert("json".into(), path.display().to_string());
        let text = serde_json::to_string_pretty(report).map_err(|e| format!("json: {e}"))?;
        write(path, &text)?;
    }
    Ok(())
}

/// `run.hgrm` + `e2e` -> `run.e2e.hgrm`.
fn sibling(path: &Path, name: &str) -> PathBuf {
    let stem = path.file_stem().map_or_else(|| "latency".into(), |s| s.to_string_lossy().into_owned());
    let extension = path.extension().map_or_else(|| "hgrm".into(), |e| e.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}.{name}.{extension}"))
}
