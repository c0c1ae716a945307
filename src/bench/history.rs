//! The history checker (issue 30), after Jepsen's Kafka workload: a
//! history of sends and polls, recorded by any client against any
//! Kafka-compatible cluster, in, and the anomalies it holds out. Pure: the
//! workload that records (`tests/compat/history_workload.py` drives real
//! clients through faults) and the checker share only the file format.
//!
//! A history is JSON lines, one operation each:
//!
//! ```text
//! {"op":"send","key":"k3","value":"v17","outcome":"ok","partition":2,"offset":40}
//! {"op":"send","key":"k3","value":"v18","outcome":"fail"}      definitely not written
//! {"op":"send","key":"k3","value":"v19","outcome":"info"}      may or may not be written
//! {"op":"poll","consumer":"c1","generation":3,"partition":2,"offset":40,"key":"k3","value":"v17"}
//! ```
//!
//! Values are unique per send. A consumer's `generation` changes whenever
//! its assignment does (a rebalance); a consumer named `drain` reads every
//! partition from the start after the faults, to the end.
//!
//! Anomalies:
//! - lost: acknowledged, never read, although a later offset of its
//!   partition was read (it should have been seen);
//! - unseen: acknowledged and not read by the final drain;
//! - duplicate: one value at two offsets;
//! - inconsistent: one (partition, offset) read or acknowledged with two values;
//! - non-monotonic: a consumer read an offset at or below one it read before
//!   in the same partition and generation;
//! - skipped: a consumer went past an offset that holds a value (known from
//!   another read) within one generation;
//! - phantom: a value read that no send produced, or one whose send
//!   definitely failed.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Op {
    Send {
        key: String,
        value: String,
        outcome: Outcome,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        partition: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<i64>,
    },
    Poll {
        consumer: String,
        #[serde(default)]
        generation: i64,
        partition: i32,
        offset: i64,
        key: String,
        value: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Ok,
    Fail,
    Info,
}

/// The consumer name of the final read of every partition.
pub const DRAIN: &str = "drain";

/// What the checker found; every list empty is a valid history.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub sends: usize,
    pub acknowledged: usize,
    pub indefinite: usize,
    pub failed: usize,
    pub polls: usize,
    /// Acknowledged values never read though later offsets were.
    pub lost: Vec<String>,
    /// Acknowledged values the drain did not read.
    pub unseen: Vec<String>,
    /// Values at more than one offset, with their positions.
    pub duplicates: Vec<(String, Vec<(i32, i64)>)>,
    /// Positions with more than one value.
    pub inconsistent: Vec<((i32, i64), Vec<String>)>,
    /// (consumer, partition, offset read, offset read before it).
    pub non_monotonic: Vec<(String, i32, i64, i64)>,
    /// (consumer, partition, from, to): offsets with values between were not read.
    pub skipped: Vec<(String, i32, i64, i64)>,
    pub phantom: Vec<String>,
    /// Whether a drain was recorded (without one, `unseen` is not checked).
    pub drained: bool,
}

impl Report {
    pub fn is_valid(&self) -> bool {
        self.lost.is_empty()
            && self.unseen.is_empty()
            && self.duplicates.is_empty()
            && self.inconsistent.is_empty()
            && self.non_monotonic.is_empty()
            && self.skipped.is_empty()
            && self.phantom.is_empty()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
}

/// Parses a JSON-lines history; blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<Op>, HistoryError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(at, line)| {
            serde_json::from_str(line).map_err(|e| HistoryError::Parse { line: at + 1, message: e.to_string() })
        })
        .collect()
}

/// Checks a history.
pub fn check(history: &[Op]) -> Report {
    let mut report = Report::default();
    // value -> outcome; value -> positions (acknowledged or read)
    let mut sent: BTreeMap<&str, Outcome> = BTreeMap::new();
    let mut positions: BTreeMap<&str, BTreeSet<(i32, i64)>> = BTreeMap::new();
    let mut at_position: BTreeMap<(i32, i64), BTreeSet<&str>> = BTreeMap::new();
    let mut read: BTreeSet<&str> = BTreeSet::new();
    let mut drained: BTreeSet<&str> = BTreeSet::new();
    let mut highest_read: BTreeMap<i32, i64> = BTreeMap::new();
    // (consumer, generation, partition) -> offsets read in order
    let mut reads: BTreeMap<(&str, i64, i32), Vec<i64>> = BTreeMap::new();
    for op in history {
        match op {
            Op::Send { value, outcome, partition, offset, .. } => {
                report.sends += 1;
                sent.insert(value, *outcome);
                match outcome {
                    Outcome::Ok => report.acknowledged += 1,
                    Outcome::Info => report.indefinite += 1,
                    Outcome::Fail => report.failed += 1,
                }
                if let (Outcome::Ok, Some(partition), Some(offset)) = (outcome, partition, offset) {
                    positions.entry(value).or_default().insert((*partition, *offset));
                    at_position.entry((*partition, *offset)).or_default().insert(value);
                }
            }
            Op::Poll { consumer, generation, partition, offset, value, .. } => {
                report.polls += 1;
                read.insert(value);
                if consumer == DRAIN {
                    report.drained = true;
                    drained.insert(value);
                }
                positions.entry(value).or_default().insert((*partition, *offset));
                at_position.entry((*partition, *offset)).or_default().insert(value);
                let highest = highest_read.entry(*partition).or_insert(*offset);
                *highest = (*highest).max(*offset);
                reads.entry((consumer, *generation, *partition)).or_default().push(*offset);
            }
        }
    }
    for value in &read {
        match sent.get(value) {
            None | Some(Outcome::Fail) => report.phantom.push(value.to_string()),
            _ => {}
        }
    }
    for (value, at) in &positions {
        if at.len() > 1 {
            report.duplicates.push((value.to_string(), at.iter().copied().collect()));
        }
    }
    for (position, values) in &at_position {
        if values.len() > 1 {
            report.inconsistent.push((*position, values.iter().map(|v| v.to_string()).collect()));
        }
    }
    for op in history {
        let Op::Send { value, outcome: Outcome::Ok, partition, offset, .. } = op else { continue };
        if read.contains(value.as_str()) {
            continue;
        }
        let later_read = match (partition, offset) {
            (Some(partition), Some(offset)) => highest_read.get(partition).is_some_and(|high| high > offset),
            _ => false,
        };
        if later_read {
            report.lost.push(value.clone());
        }
        if report.drained && !drained.contains(value.as_str()) {
            report.unseen.push(value.clone());
        }
    }
    // Offsets known to hold a value, per partition.
    let mut occupied: BTreeMap<i32, BTreeSet<i64>> = BTreeMap::new();
    for (partition, offset) in at_position.keys() {
        occupied.entry(*partition).or_default().insert(*offset);
    }
    for ((consumer, _, partition), offsets) in &reads {
        for pair in offsets.windows(2) {
            let (before, now) = (pair[0], pair[1]);
            if now <= before {
                report.non_monotonic.push((consumer.to_string(), *partition, now, before));
            } else if now > before + 1 {
                let between = occupied.get(partition).is_some_and(|set| set.range(before + 1..now).next().is_some());
                if between {
                    report.skipped.push((consumer.to_string(), *partition, before, now));
                }
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(value: &str, outcome: Outcome, at: Option<(i32, i64)>) -> Op {
        Op::Send {
            key: "k".into(),
            value: value.into(),
            outcome,
            partition: at.map(|(p, _)| p),
            offset: at.map(|(_, o)| o),
        }
    }

    fn poll(consumer: &str, generation: i64, partition: i32, offset: i64, value: &str) -> Op {
        Op::Poll { consumer: consumer.into(), generation, partition, offset, key: "k".into(), value: value.into() }
    }

    fn valid() -> Vec<Op> {
        vec![
            send("v1", Outcome::Ok, Some((0, 0))),
            send("v2", Outcome::Info, None),
            send("v3", Outcome::Ok, Some((0, 2))),
            send("v4", Outcome::Fail, None),
            poll("c", 1, 0, 0, "v1"),
            poll("c", 1, 0, 1, "v2"),
            poll("c", 1, 0, 2, "v3"),
            // A rebalance may read again from the committed offset.
            poll("c", 2, 0, 1, "v2"),
            poll(DRAIN, 0, 0, 0, "v1"),
            poll(DRAIN, 0, 0, 1, "v2"),
            poll(DRAIN, 0, 0, 2, "v3"),
        ]
    }

    #[test]
    fn a_valid_history_has_no_anomaly_and_round_trips_as_json_lines() {
        let history = valid();
        let text: String = history.iter().map(|op| serde_json::to_string(op).unwrap() + "\n").collect();
        assert_eq!(parse(&text).unwrap(), history);
        let report = check(&history);
        assert!(report.is_valid(), "{report:?}");
        assert_eq!((report.sends, report.acknowledged, report.indefinite, report.failed), (4, 2, 1, 1));
        assert!(report.drained);
        assert!(parse("{\"op\":\"send\"}").is_err());
    }

    #[test]
    fn an_acknowledged_write_passed_over_by_readers_is_lost_and_unseen() {
        let mut history = valid();
        history.push(send("v5", Outcome::Ok, Some((0, 3))));
        history.push(send("v6", Outcome::Ok, Some((0, 4))));
        history.push(poll(DRAIN, 0, 0, 4, "v6"));
        let report = check(&history);
        assert_eq!(report.lost, vec!["v5".to_string()]);
        assert_eq!(report.unseen, vec!["v5".to_string()]);
        let drain_skip = (DRAIN.to_string(), 0, 2, 4);
        assert_eq!(report.skipped, vec![drain_skip], "the drain went past offset 3, which holds v5");
        assert_eq!(report.non_monotonic, vec![], "{report:?}");
    }

    #[test]
    fn one_value_at_two_offsets_is_a_duplicate_and_two_values_at_one_offset_are_inconsistent() {
        let mut history = valid();
        history.push(poll(DRAIN, 0, 0, 3, "v3"));
        let report = check(&history);
        assert_eq!(report.duplicates, vec![("v3".to_string(), vec![(0, 2), (0, 3)])]);
        let mut history = valid();
        history.push(poll("other", 1, 0, 2, "v2"));
        let report = check(&history);
        assert_eq!(report.inconsistent, vec![((0, 2), vec!["v2".to_string(), "v3".to_string()])]);
    }

    #[test]
    fn a_consumer_going_back_or_skipping_within_a_generation_is_caught() {
        let mut history = valid();
        history.push(poll("c", 2, 0, 1, "v2"));
        let report = check(&history);
        assert_eq!(report.non_monotonic, vec![("c".to_string(), 0, 1, 1)]);
        let mut history = valid();
        history.push(poll("d", 1, 0, 0, "v1"));
        history.push(poll("d", 1, 0, 2, "v3"));
        let report = check(&history);
        assert_eq!(report.skipped, vec![("d".to_string(), 0, 0, 2)], "offset 1 holds v2");
    }

    #[test]
    fn a_value_never_sent_or_definitely_failed_is_a_phantom() {
        let mut history = valid();
        history.push(poll(DRAIN, 0, 0, 3, "v4"));
        history.push(poll(DRAIN, 0, 0, 4, "nobody"));
        let report = check(&history);
        assert_eq!(report.phantom, vec!["nobody".to_string(), "v4".to_string()]);
    }
}
