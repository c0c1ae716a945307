//! `shardlog cluster status`: which nodes (cores) a broker runs and what
//! they hold. Nodes and partition leaders come from the Kafka protocol
//! (Metadata, any node), the controller quorum from DescribeQuorum (the
//! controller machine, the Raft term, the commit index and each voter's
//! log end); cores, log bytes on disk and free space from the broker's
//! operations endpoint (`GET /v1/status` on `--metrics-port`, see
//! `server::http`). Without the endpoint the Kafka part is still shown.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use super::admin::Admin;
use super::ClientError;
use crate::metrics::Status;

/// Largest HTTP response read from the operations endpoint.
const HTTP_RESPONSE_BYTES_MAX: u64 = 16 << 20;

#[derive(Debug, Clone)]
pub struct ClusterStatus {
    pub cluster_id: String,
    pub controller_id: i32,
    pub topics: usize,
    pub partitions: usize,
    /// In node id order.
    pub nodes: Vec<NodeStatus>,
    /// Where `/v1/status` was asked.
    pub endpoint: String,
    /// `/v1/status`, or why it could not be read.
    pub status: Result<Status, String>,
    /// The metadata log's quorum, or why it could not be described.
    pub quorum: Result<QuorumStatus, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumStatus {
    pub controller_machine: i32,
    pub term: i32,
    pub commit_index: i64,
    /// (machine id, log end offset; -1 unknown).
    pub voters: Vec<(i32, i64)>,
    pub observers: Vec<(i32, i64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub node_id: i32,
    pub address: String,
    /// Partitions whose leader this node is, per Metadata.
    pub leaders: usize,
}

/// Asks `bootstrap` (host:port, the first of a comma-separated list) for
/// Metadata and the same host's `metrics_port` for `/v1/status`.
pub fn cluster_status(bootstrap: &str, metrics_port: u16) -> Result<ClusterStatus, ClientError> {
    let first = bootstrap.split(',').next().unwrap_or(bootstrap).trim();
    let mut admin = Admin::connect(first)?;
    let metadata = admin.metadata(None)?;
    // DescribeQuorum is answered by the controller's machine: ask the one
    // asked first, then the others Metadata names, one address per host:port.
    let mut quorum = describe_quorum(&mut admin);
    if quorum.is_err() {
        for broker in &metadata.brokers {
            let address = format!("{}:{}", broker.host, broker.port);
            if let Ok(answer @ Ok(_)) = Admin::connect(&address).map(|mut admin| describe_quorum(&mut admin)) {
                quorum = answer;
                break;
            }
        }
    }
    let mut nodes: Vec<NodeStatus> = metadata
        .brokers
        .iter()
        .map(|broker| NodeStatus {
            node_id: broker.node_id,
            address: format!("{}:{}", broker.host, broker.port),
            leaders: metadata
                .topics
                .iter()
                .flat_map(|t| &t.partitions)
                .filter(|p| p.leader_id == broker.node_id)
                .count(),
        })
        .collect();
    nodes.sort_by_key(|node| node.node_id);
    let host = first.rsplit_once(':').map_or(first, |(host, _)| host);
    let endpoint = format!("{host}:{metrics_port}");
    let status = http_get(&endpoint, "/v1/status", Duration::from_secs(10)).and_then(|(code, body)| {
        if code != 200 {
            return Err(format!("HTTP {code}"));
        }
        serde_json::from_str::<Status>(&body).map_err(|e| format!("bad JSON: {e}"))
    });
    Ok(ClusterStatus {
        cluster_id: metadata.cluster_id.unwrap_or_default(),
        controller_id: metadata.controller_id,
        topics: metadata.topics.len(),
        partitions: metadata.topics.iter().map(|t| t.partitions.len()).sum(),
        nodes,
        endpoint,
        status,
        quorum,
    })
}

/// The metadata quorum as `admin`'s machine describes it; an error unless
/// it is the controller's.
fn describe_quorum(admin: &mut Admin) -> Result<QuorumStatus, String> {
    admin.describe_quorum().map_err(|e| e.to_string()).and_then(|answer| {
        let partition = answer
            .topics
            .first()
            .and_then(|t| t.partitions.first())
            .ok_or_else(|| "no quorum in the answer".to_string())?;
        if !partition.error.is_ok() {
            return Err(format!("{:?} (controller machine {})", partition.error, partition.leader_id));
        }
        let members = |list: &[crate::protocol::describe_quorum::ReplicaState]| {
            list.iter().map(|r| (r.replica_id, r.log_end_offset)).collect()
        };
        Ok(QuorumStatus {
            controller_machine: partition.leader_id,
            term: partition.leader_epoch,
            commit_index: partition.high_watermark,
            voters: members(&partition.current_voters),
            observers: members(&partition.observers),
        })
    })
}

/// A blocking `GET path` over HTTP/1.1; the status code and body.
pub fn http_get(address: &str, path: &str, timeout: Duration) -> Result<(u16, String), String> {
    let fail = |e: std::io::Error| format!("{address}: {e}");
    let socket = address.to_socket_addrs().map_err(fail)?.next().ok_or_else(|| format!("{address}: no address"))?;
    let mut stream = TcpStream::connect_timeout(&socket, timeout).map_err(fail)?;
    stream.set_read_timeout(Some(timeout)).map_err(fail)?;
    stream.set_write_timeout(Some(timeout)).map_err(fail)?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").map_err(fail)?;
    let mut raw = Vec::new();
    stream.take(HTTP_RESPONSE_BYTES_MAX).read_to_end(&mut raw).map_err(fail)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("{address}: incomplete HTTP response"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("{address}: bad HTTP status line"))?;
    Ok((code, body.to_string()))
}

impl fmt::Display for ClusterStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "cluster {}  controller node {}  {} topics  {} partitions",
            self.cluster_id, self.controller_id, self.topics, self.partitions
        )?;
        match &self.quorum {
            Ok(quorum) => {
                let list = |members: &[(i32, i64)]| {
                    members.iter().map(|(id, end)| format!("{id} (log end {end})")).collect::<Vec<_>>().join(", ")
                };
                write!(
                    f,
                    "controller quorum: controller machine {}  term {}  committed {}  voters {}",
                    quorum.controller_machine,
                    quorum.term,
                    quorum.commit_index,
                    list(&quorum.voters)
                )?;
                if !quorum.observers.is_empty() {
                    write!(f, "  observers {}", list(&quorum.observers))?;
                }
                writeln!(f)?;
            }
            Err(reason) => writeln!(f, "controller quorum unavailable: {reason}")?,
        }
        let status = self.status.as_ref().ok();
        if let Some(machines) = status.map(|s| &s.machines).filter(|m| !m.is_empty()) {
            writeln!(f, "{:<8} {:<12} {:<8} NODES", "MACHINE", "RACK", "STATE")?;
            for machine in machines {
                let nodes: Vec<String> = machine.nodes.iter().map(i32::to_string).collect();
                let state = if machine.fenced { "FENCED" } else { "serving" };
                let this = if machine.this { "  (answered)" } else { "" };
                writeln!(
                    f,
                    "{:<8} {:<12} {:<8} {}{this}",
                    machine.machine,
                    machine.rack.as_deref().unwrap_or("-"),
                    state,
                    nodes.join(",")
                )?;
            }
        }
        writeln!(
            f,
            "{:<6} {:<24} {:>5} {:>10} {:>12} {:>11}",
            "NODE", "ADDRESS", "CORE", "PARTITIONS", "LOG BYTES", "CONNECTIONS"
        )?;
        for node in &self.nodes {
            let core = status.and_then(|s| s.nodes.iter().find(|c| c.node_id == node.node_id));
            let (core_id, log_bytes, connections) = match core {
                Some(core) => (core.core.to_string(), human_bytes(core.log_size_bytes), core.connections.to_string()),
                None => ("-".into(), "-".into(), "-".into()),
            };
            writeln!(
                f,
                "{:<6} {:<24} {:>5} {:>10} {:>12} {:>11}",
                node.node_id, node.address, core_id, node.leaders, log_bytes, connections
            )?;
        }
        match &self.status {
            Ok(status) => {
                let ready = if status.ready { "ready" } else { "NOT READY" };
                write!(f, "broker {ready}, {} cores, data {}", status.cores, status.data_dir)?;
                if let (Some(free), Some(total)) = (status.disk_free_bytes, status.disk_total_bytes) {
                    write!(f, ": {} free of {}", human_bytes(free), human_bytes(total))?;
                }
                writeln!(f)
            }
            Err(reason) => writeln!(f, "operations endpoint http://{}/v1/status unavailable: {reason}", self.endpoint),
        }
    }
}

fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_the_largest_unit_below_1024() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(5 << 30), "5.0 GiB");
    }
}
