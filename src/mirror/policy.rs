//! Which source topics are mirrored and what they are called on the target:
//! MirrorMaker 2's `DefaultReplicationPolicy` (`<source-alias>.<topic>`) or
//! its identity policy, its topic filter (internal topics never travel) and
//! its cycle check (a topic that came from the target is never sent back,
//! so an active/active pair does not loop).

use regex::Regex;

/// The separator of remote topic names, as MirrorMaker 2's default.
pub const SEPARATOR: &str = ".";
/// The heartbeats topic (MirrorMaker 2's name).
pub const HEARTBEATS: &str = "heartbeats";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rename {
    /// `<source-alias>.<topic>` (DefaultReplicationPolicy).
    Prefix,
    /// The source's name (IdentityReplicationPolicy): no cycle check is
    /// possible by name, so it is for one-way flows.
    Identity,
}

#[derive(Debug, Clone)]
pub struct Policy {
    pub rename: Rename,
    pub source_alias: String,
    pub target_alias: String,
    topics: Regex,
    groups: Regex,
}

impl Policy {
    /// `topics` and `groups` must match a whole name (as MirrorMaker 2's
    /// filters do).
    pub fn new(
        rename: Rename,
        source_alias: &str,
        target_alias: &str,
        topics: &str,
        groups: &str,
    ) -> Result<Self, regex::Error> {
        Ok(Self {
            rename,
            source_alias: source_alias.into(),
            target_alias: target_alias.into(),
            topics: Regex::new(&format!("^(?:{topics})$"))?,
            groups: Regex::new(&format!("^(?:{groups})$"))?,
        })
    }

    /// The target's name for a source topic.
    pub fn target_topic(&self, topic: &str) -> String {
        match self.rename {
            Rename::Prefix => format!("{}{SEPARATOR}{topic}", self.source_alias),
            Rename::Identity => topic.to_string(),
        }
    }

    /// Whether a source topic is copied: it matches the filter (heartbeats
    /// topics always do, so the target sees where its data comes from), is
    /// not internal, and did not come from the target in the first place.
    pub fn mirrors_topic(&self, topic: &str) -> bool {
        (self.topics.is_match(topic) || is_heartbeats(topic)) && !is_internal(topic) && !self.is_cycle(topic)
    }

    /// Whether a consumer group's offsets are translated.
    pub fn mirrors_group(&self, group: &str) -> bool {
        self.groups.is_match(group)
            && !group.starts_with("__")
            && !group.starts_with("connect-")
            && !group.starts_with("console-consumer-")
            && !group.starts_with("shardlog-mirror")
    }

    /// Whether `topic` (on the source) already came from the target
    /// cluster, at any hop: `target.x`, `a.target.x`, ...
    fn is_cycle(&self, topic: &str) -> bool {
        if self.rename == Rename::Identity {
            return false;
        }
        let mut rest = topic;
        while let Some((source, upstream)) = rest.split_once(SEPARATOR) {
            if source == self.target_alias {
                return true;
            }
            rest = upstream;
        }
        false
    }

    /// Where the offset syncs live: on the target (MirrorMaker 2's
    /// `offset-syncs.topic.location=target`), so the mirror's progress is in
    /// the cluster it writes.
    pub fn offset_syncs_topic(&self) -> String {
        format!("mm2-offset-syncs.{}.internal", self.source_alias)
    }

    /// The checkpoints topic on the target.
    pub fn checkpoints_topic(&self) -> String {
        format!("{}.checkpoints.internal", self.source_alias)
    }
}

/// `heartbeats` or a mirrored copy of one (`a.heartbeats`, `b.a.heartbeats`).
pub fn is_heartbeats(topic: &str) -> bool {
    topic == HEARTBEATS || topic.ends_with(&format!("{SEPARATOR}{HEARTBEATS}"))
}

/// Topics that never travel: the broker's own (`__consumer_offsets`, ...),
/// MirrorMaker 2's and Connect's internal topics, and replica topics.
pub fn is_internal(topic: &str) -> bool {
    topic.starts_with("__")
        || topic.ends_with(".internal")
        || topic.ends_with("-internal")
        || topic.ends_with(".replica")
        || topic.starts_with("mm2-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(rename: Rename) -> Policy {
        Policy::new(rename, "east", "west", "orders|pay.*|.*\\.orders", ".*").unwrap()
    }

    #[test]
    fn prefix_names_the_target_topic_after_the_source_alias() {
        assert_eq!(policy(Rename::Prefix).target_topic("orders"), "east.orders");
        assert_eq!(policy(Rename::Identity).target_topic("orders"), "orders");
    }

    #[test]
    fn the_filter_matches_whole_names() {
        let p = policy(Rename::Prefix);
        assert!(p.mirrors_topic("orders"));
        assert!(p.mirrors_topic("payments"));
        assert!(!p.mirrors_topic("orders2"));
        assert!(!p.mirrors_topic("xorders"));
    }

    #[test]
    fn a_topic_that_came_from_the_target_is_never_sent_back() {
        let p = policy(Rename::Prefix);
        assert!(!p.mirrors_topic("west.orders"), "west is the target: a loop");
        assert!(!p.mirrors_topic("south.west.orders"), "west upstream of south: still a loop");
        assert!(p.mirrors_topic("south.orders"), "a third cluster's copy travels on");
        assert!(!policy(Rename::Identity).is_cycle("west.orders"));
    }

    #[test]
    fn internal_topics_never_travel_and_heartbeats_always_do() {
        let p = Policy::new(Rename::Prefix, "east", "west", "nothing", ".*").unwrap();
        assert!(p.mirrors_topic("heartbeats"));
        assert!(p.mirrors_topic("south.heartbeats"));
        assert!(!p.mirrors_topic("west.heartbeats"));
        let all = Policy::new(Rename::Prefix, "east", "west", ".*", ".*").unwrap();
        for topic in ["__consumer_offsets", "mm2-offset-syncs.west.internal", "east.checkpoints.internal"] {
            assert!(!all.mirrors_topic(topic), "{topic}");
        }
    }

    #[test]
    fn internal_topic_names_are_mirror_maker_2s() {
        let p = policy(Rename::Prefix);
        assert_eq!(p.offset_syncs_topic(), "mm2-offset-syncs.east.internal");
        assert_eq!(p.checkpoints_topic(), "east.checkpoints.internal");
    }

    #[test]
    fn groups_filter_skips_tool_and_internal_groups() {
        let p = policy(Rename::Prefix);
        assert!(p.mirrors_group("billing"));
        assert!(!p.mirrors_group("console-consumer-123"));
        assert!(!p.mirrors_group("shardlog-mirror-east"));
    }
}
