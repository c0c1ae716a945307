//! The partitions a core has open, by topic and then by partition number.
//! A fetch or produce of many partitions of one topic finds the topic once
//! and then indexes: a `(topic, partition)` hash map cost a lookup and a
//! name compare per partition, a third of a 10,000-partition fetch.
//!
//! Owned by its core's `Shard`; changed only when the metadata opens or
//! removes partitions there, or a failed log is reopened.

use std::collections::HashMap;
use std::rc::Rc;

use super::partition::Partition;

#[derive(Default)]
pub struct PartitionTable {
    topics: HashMap<String, Vec<Option<Rc<Partition>>>>,
    len: usize,
}

impl PartitionTable {
    pub fn len(&self) -> usize {
        self.len
    }

    /// The partitions of `topic` by number (gaps are None).
    pub fn topic(&self, topic: &str) -> Option<&[Option<Rc<Partition>>]> {
        self.topics.get(topic).map(Vec::as_slice)
    }

    pub fn get(&self, topic: &str, index: i32) -> Option<&Rc<Partition>> {
        self.topic(topic)?.get(usize::try_from(index).ok()?)?.as_ref()
    }

    /// Puts `partition` in its place; returns the one it replaced.
    pub fn insert(&mut self, partition: Rc<Partition>) -> Option<Rc<Partition>> {
        let index = usize::try_from(partition.index).expect("partition numbers from the metadata are not negative");
        let slots = self.topics.entry(partition.topic.to_string()).or_default();
        if slots.len() <= index {
            slots.resize(index + 1, None);
        }
        let replaced = slots[index].replace(partition);
        if replaced.is_none() {
            self.len += 1;
        }
        replaced
    }

    pub fn remove(&mut self, topic: &str, index: i32) -> Option<Rc<Partition>> {
        let slots = self.topics.get_mut(topic)?;
        let removed = slots.get_mut(usize::try_from(index).ok()?)?.take()?;
        self.len -= 1;
        if slots.iter().all(Option::is_none) {
            self.topics.remove(topic);
        }
        Some(removed)
    }

    /// Every open partition, topic by topic.
    pub fn values(&self) -> impl Iterator<Item = &Rc<Partition>> {
        self.topics.values().flat_map(|slots| slots.iter().flatten())
    }
}
