//! `shardlog mirror`: copies topics from one Kafka-compatible cluster to
//! another, as MirrorMaker 2 does, in this binary: no Connect, no JVM.
//!
//! ```text
//!  source cluster                 shardlog mirror                    target cluster
//!  topic t, p0..pn  --Fetch-->  worker k: fetcher -> producer  --Produce (idempotent)-->  <alias>.t, p0..pn
//!  groups' offsets  --OffsetFetch-->  control thread  --> mm2-offset-syncs.<alias>.internal
//!                                                      --> <alias>.checkpoints.internal, heartbeats
//!                                                      --> translated group offsets (OffsetCommit)
//! ```
//!
//! Modules: `policy` (names, filters, cycles), `formats` (MirrorMaker 2's
//! records), `batches` (what is copied and how batches are rebuilt),
//! `mapping` (source offset -> target offset, translation), `resume`
//! (where to go on, from the target's data), `link` (a blocking Kafka
//! client of one cluster), `copy` (the worker threads), `control` (the
//! control thread), `metrics` (`--metrics-port`).
//!
//! Delivery: every source record of a mirrored partition reaches the
//! target once, in order, with its partition number, key, value, headers
//! and timestamp. Within a run that is the idempotent producer's doing;
//! across a kill -9 and restart it is `resume`'s (the progress lives in the
//! target). It is not exactly-once in Kafka's transactional sense: a
//! consumer of the target may see a record before the mirror's offset
//! sync for it, and a mirror that loses its group membership stops writing
//! on a lease (half the session timeout) rather than being fenced by the
//! target (`membership`).

pub mod batches;
pub mod control;
pub mod copy;
pub mod formats;
pub mod link;
pub mod mapping;
pub mod membership;
pub mod metrics;
pub mod policy;
pub mod resume;

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;

use self::copy::Shared;
use self::link::Link;
use self::policy::{Policy, Rename};

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// The source cluster: host:port[,host:port...].
    #[arg(long)]
    pub source: String,
    /// The target cluster: host:port[,host:port...].
    #[arg(long)]
    pub target: String,
    /// Source topics to copy: a regular expression that must match the whole name. Internal topics
    /// (`__*`, `*.internal`, `mm2-*`) never travel; heartbeats topics always do.
    #[arg(long, default_value = ".*")]
    pub topics: String,
    /// Consumer groups whose committed offsets are translated (checkpoints, and commits on the target).
    #[arg(long, default_value = ".*")]
    pub groups: String,
    /// Target topic names: `prefix` = `<source-alias>.<topic>` (MirrorMaker 2's default, loop-safe for
    /// two-way mirroring), `identity` = the source's name (one-way only).
    #[arg(long, value_enum, default_value_t = Rename::Prefix)]
    pub rename: Rename,
    /// The source cluster's name on the target (topic prefix, internal topic names).
    #[arg(long, default_value = "source")]
    pub source_alias: String,
    /// The target cluster's name (heartbeats; a source topic named `<target-alias>.*` came from the target
    /// and is not sent back).
    #[arg(long, default_value = "target")]
    pub target_alias: String,
    /// This mirror's name [default: shardlog-mirror-<source-alias>-<target-alias>]: its Kafka client id,
    /// and its group on the target: mirrors of one name share the partitions, and take over a dead one's
    /// share (after its 6 s session).
    #[arg(long)]
    pub name: Option<String>,
    /// This process's static identity in the mirror group (Kafka's group.instance.id, KIP-345): a mirror
    /// restarted with the same one takes its share back at once instead of after the dead one's session.
    #[arg(long)]
    pub instance_id: Option<String>,
    /// Worker threads (each a fetcher and a producer); partitions are spread over them.
    #[arg(long, default_value_t = 1)]
    pub cores: usize,
    /// How often to look for new topics, partitions and config changes, in ms.
    #[arg(long, default_value_t = 5000)]
    pub refresh_ms: u64,
    /// How often to translate consumer groups' offsets, in ms.
    #[arg(long, default_value_t = 1000)]
    pub checkpoint_interval_ms: u64,
    /// Commit translated offsets on the target for groups with no active member there.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub sync_group_offsets: bool,
    /// Serve Prometheus metrics (`/metrics`) and per-partition progress (`/v1/status`) on this port
    /// (0: any free port, printed at start) [default: off].
    #[arg(long)]
    pub metrics_port: Option<u16>,
    /// Seconds between progress lines.
    #[arg(long, default_value_t = 5)]
    pub report_s: u64,
}

impl RunArgs {
    pub fn name(&self) -> String {
        self.name.clone().unwrap_or_else(|| format!("shardlog-mirror-{}-{}", self.source_alias, self.target_alias))
    }
}

/// A source and a target cluster, and the source's alias (what `mirror
/// status` and `group translate-offsets` read).
#[derive(Args, Debug, Clone)]
pub struct Pair {
    /// The source cluster, host:port[,host:port...].
    #[arg(long)]
    pub source: String,
    /// The target cluster, host:port[,host:port...].
    #[arg(long)]
    pub target: String,
    /// The mirror's --source-alias.
    #[arg(long, default_value = "source")]
    pub source_alias: String,
}

/// Runs the mirror until SIGINT or SIGTERM.
pub fn run(args: RunArgs) -> Result<(), String> {
    let policy = Policy::new(args.rename, &args.source_alias, &args.target_alias, &args.topics, &args.groups)
        .map_err(|e| format!("--topics/--groups: {e}"))?;
    if args.cores == 0 {
        return Err("--cores must be at least 1".into());
    }
    let shared = Arc::new(Shared::new());
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        signal_hook::flag::register(signal, flag.clone()).map_err(|e| e.to_string())?;
        let shared = shared.clone();
        std::thread::spawn(move || loop {
            if flag.load(Ordering::Relaxed) {
                shared.stop.store(true, Ordering::Relaxed);
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        });
    }
    if let Some(port) = args.metrics_port {
        let bound = metrics::serve(port, shared.clone()).map_err(|e| format!("--metrics-port {port}: {e}"))?;
        println!("mirror metrics on port {bound}: /metrics, /v1/status");
    }
    let (to_control, from_workers) = flume::unbounded();
    let mut workers = Vec::new();
    let mut threads = Vec::new();
    for worker in 0..args.cores {
        let (assign, assignments) = flume::unbounded();
        let (chunk_out, chunk_in) = flume::bounded(16);
        let client_id = args.name();
        let source = Link::new(&args.source, &client_id);
        let target = Link::new(&args.target, &client_id);
        let (control, state) = (to_control.clone(), shared.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("mirror-fetch-{worker}"))
                .spawn(move || copy::fetcher(source, assignments, chunk_out, control, state))
                .map_err(|e| e.to_string())?,
        );
        let (control, state) = (to_control.clone(), shared.clone());
        threads.push(
            std::thread::Builder::new()
                .name(format!("mirror-produce-{worker}"))
                .spawn(move || copy::producer(target, chunk_in, control, state))
                .map_err(|e| e.to_string())?,
        );
        workers.push(assign);
    }
    println!(
        "mirror {}: {} -> {} topics /{}/ as {:?}, {} worker(s)",
        args.name(),
        args.source,
        args.target,
        args.topics,
        args.rename,
        args.cores
    );
    {
        let (group, bootstrap, client_id, state) = (args.name(), args.target.clone(), args.name(), shared.clone());
        let instance_id = args.instance_id.clone();
        threads.push(
            std::thread::Builder::new()
                .name("mirror-heartbeat".into())
                .spawn(move || membership::heartbeats(group, bootstrap, client_id, instance_id, state))
                .map_err(|e| e.to_string())?,
        );
    }
    let control = control::Control::new(args, policy, shared.clone(), workers, from_workers);
    let result = control.run();
    shared.stop.store(true, Ordering::Relaxed);
    for thread in threads {
        let _ = thread.join();
    }
    let latency = shared.latency.lock().expect("latency");
    println!(
        "mirror stopped: {} records, {} bytes copied; replication latency p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
        shared.records.load(Ordering::Relaxed),
        shared.bytes.load(Ordering::Relaxed),
        latency.value_at_quantile(0.5) as f64 / 1000.0,
        latency.value_at_quantile(0.99) as f64 / 1000.0,
        latency.max() as f64 / 1000.0
    );
    result
}

/// `shardlog mirror status`: per mirrored partition, the source's end, the
/// newest offset sync, the target's end and the lag, from the two clusters
/// (so it sees any mirror process, running or not); throughput over a
/// second; the newest checkpoint.
pub fn status(source: &str, target: &str, source_alias: &str) -> Result<String, String> {
    use std::fmt::Write;
    let fail = |e: link::LinkError| e.to_string();
    let policy = Policy::new(Rename::Prefix, source_alias, "", ".*", ".*").map_err(|e| e.to_string())?;
    let mut source = Link::new(source, "shardlog-mirror-status");
    let mut target = Link::new(target, "shardlog-mirror-status");
    let mut syncs: BTreeMap<(String, i32), (i64, i64)> = BTreeMap::new();
    for (_, key, value) in target.read_all(&policy.offset_syncs_topic(), 0, 0).map_err(fail)? {
        if let Ok(sync) = formats::OffsetSync::decode(&key, &value) {
            syncs.insert((sync.topic, sync.partition), (sync.upstream, sync.downstream));
        }
    }
    let target_topics: BTreeMap<String, i32> =
        target.metadata(None).map_err(fail)?.topics.into_iter().map(|t| (t.name, t.partitions.len() as i32)).collect();
    let ends = |target: &mut Link| -> BTreeMap<(String, i32), i64> {
        let mut out = BTreeMap::new();
        for (topic, partition) in syncs.keys() {
            for candidate in [format!("{source_alias}.{topic}"), topic.clone()] {
                if target_topics.contains_key(&candidate) {
                    if let Ok(end) = target.list_offset(&candidate, *partition, -1) {
                        out.insert((topic.clone(), *partition), end);
                    }
                    break;
                }
            }
        }
        out
    };
    let first = ends(&mut target);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let second = ends(&mut target);
    let seconds = started.elapsed().as_secs_f64();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<32} {:>9} {:>12} {:>12} {:>12} {:>10}",
        "SOURCE TOPIC", "PARTITION", "SOURCE END", "SYNCED", "TARGET END", "LAG"
    );
    let mut total_rate = 0.0;
    for ((topic, partition), (upstream, downstream)) in &syncs {
        let source_end = source.list_offset(topic, *partition, -1).unwrap_or(-1);
        let target_end = second.get(&(topic.clone(), *partition)).copied().unwrap_or(-1);
        // Records the source has after the sync, less those the target has.
        let lag = if source_end >= 0 && target_end >= 0 {
            ((source_end - 1 - upstream) - (target_end - 1 - downstream)).max(0).to_string()
        } else {
            "-".into()
        };
        if let (Some(a), Some(b)) = (first.get(&(topic.clone(), *partition)), second.get(&(topic.clone(), *partition)))
        {
            total_rate += (b - a) as f64 / seconds;
        }
        let _ = writeln!(out, "{topic:<32} {partition:>9} {source_end:>12} {upstream:>12} {target_end:>12} {lag:>10}");
    }
    let _ = writeln!(out, "throughput: {total_rate:.0} records/s into the target");
    let checkpoints = target.read_all(&policy.checkpoints_topic(), 0, 0).map_err(fail)?;
    match checkpoints.last().and_then(|(_, key, value)| formats::Checkpoint::decode(key, value).ok()) {
        Some(c) => {
            let _ = writeln!(
                out,
                "last checkpoint: group {} {}-{} source offset {} -> target offset {} ({} checkpoints in all)",
                c.group,
                c.topic,
                c.partition,
                c.upstream,
                c.downstream,
                checkpoints.len()
            );
        }
        None => {
            let _ = writeln!(out, "last checkpoint: none");
        }
    }
    Ok(out)
}

/// `shardlog group translate-offsets`: the target offsets of a source
/// group's committed offsets, from the offset syncs on the target, counted
/// exactly (never ahead of what was copied); with `apply`, committed to the
/// group on the target (which must have no active member there).
pub fn translate_offsets(
    pair: &Pair,
    rename: Rename,
    group: &str,
    apply: bool,
) -> Result<Vec<(String, i32, i64, i64)>, String> {
    let (source, target) = (pair.source.as_str(), pair.target.as_str());
    let policy = Policy::new(rename, &pair.source_alias, "", ".*", ".*").map_err(|e| e.to_string())?;
    let mut source_link = Link::new(source, "shardlog-translate");
    let mut target_link = Link::new(target, "shardlog-translate");
    let mut syncs: BTreeMap<(String, i32), (i64, i64)> = BTreeMap::new();
    for (_, key, value) in target_link.read_all(&policy.offset_syncs_topic(), 0, 0).map_err(|e| e.to_string())? {
        if let Ok(sync) = formats::OffsetSync::decode(&key, &value) {
            syncs.insert((sync.topic, sync.partition), (sync.upstream, sync.downstream));
        }
    }
    let mut groups = crate::client::groups::GroupAdmin::connect(source).map_err(|e| e.to_string())?;
    let (_, committed) = groups.state_and_offsets(group).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (topic, partition, offset, _) in committed {
        let Some(sync) = syncs.get(&(topic.clone(), partition)).copied() else { continue };
        let target_topic = policy.target_topic(&topic);
        let translated =
            resume::translate(&mut source_link, &mut target_link, (&topic, partition), &target_topic, sync, offset)
                .map_err(|e| e.to_string())?;
        if let Some(downstream) = translated {
            out.push((target_topic, partition, offset, downstream));
        }
    }
    if apply {
        let mut target_groups = crate::client::groups::GroupAdmin::connect(target).map_err(|e| e.to_string())?;
        let commits: Vec<_> = out.iter().map(|(t, p, _, d)| (t.clone(), *p, *d, String::new())).collect();
        target_groups.commit(group, &commits).map_err(|e| e.to_string())?;
    }
    Ok(out)
}
