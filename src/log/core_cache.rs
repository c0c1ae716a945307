//! The tail-cache budget of one core. O_DIRECT bypasses the page cache, so
//! the logs keep recent batches in memory themselves; all the logs of a core
//! share one budget, and when it is spent the batch cached longest ago, in
//! whichever log, leaves first (the page cache's policy for an append-only
//! workload). A log that has stopped receiving data keeps its batches until
//! newer data elsewhere needs the room, and one busy partition among ten
//! thousand idle ones may use the whole budget.
//!
//! Bookkeeping: every cached batch carries a core-wide sequence number; the
//! core keeps, per log with anything cached, the sequence number of that
//! log's oldest batch, so the oldest batch of the core is the first entry
//! of a map (O(log logs) per batch cached or evicted).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Weak;

/// Budget per core unless set (`--cache-bytes-max`). Larger budgets let
/// consumers further behind read from memory, but on a host whose fresh
/// pages are expensive to fault in, filling a large cache costs producers
/// latency the first time (see docs/perf-history.md).
pub const CORE_CACHE_BYTES_MAX_DEFAULT: usize = 256 << 20;

/// What the core cache needs of a log: evict its oldest batch.
pub(super) trait CachingLog {
    /// Drops the log's oldest cached batch if it is written; false when it
    /// is not (unwritten batches stay) or the log is busy.
    fn evict_oldest(&self) -> bool;
}

struct CoreCache {
    bytes: usize,
    budget: usize,
    next_seq: u64,
    /// Sequence number of each caching log's oldest batch -> that log.
    oldest: BTreeMap<u64, Weak<dyn CachingLog>>,
}

thread_local! {
    static CORE: RefCell<CoreCache> = RefCell::new(CoreCache {
        bytes: 0,
        budget: CORE_CACHE_BYTES_MAX_DEFAULT,
        next_seq: 0,
        oldest: BTreeMap::new(),
    });
}

/// Sets the cache budget shared by the logs of the calling thread (core).
pub fn set_core_cache_bytes_max(bytes: usize) {
    CORE.with(|core| core.borrow_mut().budget = bytes);
}

/// Bytes cached by all the logs of the calling thread.
pub fn core_cache_bytes() -> usize {
    CORE.with(|core| core.borrow().bytes)
}

/// Counts a batch of `len` bytes a log caches and returns its sequence
/// number; `log` is the log, given when the batch is its only cached one.
pub(super) fn cached(len: usize, log: Option<Weak<dyn CachingLog>>) -> u64 {
    CORE.with(|core| {
        let mut core = core.borrow_mut();
        let seq = core.next_seq;
        core.next_seq += 1;
        core.bytes += len;
        if let Some(log) = log {
            core.oldest.insert(seq, log);
        }
        seq
    })
}

/// A log dropped its oldest batch (`seq`, `len` bytes); `next` is the
/// sequence number of its new oldest batch, if any.
pub(super) fn evicted(seq: u64, len: usize, next: Option<u64>) {
    CORE.with(|core| {
        let mut core = core.borrow_mut();
        core.bytes -= len;
        if let Some(log) = core.oldest.remove(&seq) {
            if let Some(next) = next {
                core.oldest.insert(next, log);
            }
        }
    });
}

/// A log closed with `len` bytes cached, its oldest batch `oldest`.
pub(super) fn forget(oldest: Option<u64>, len: usize) {
    CORE.with(|core| {
        let mut core = core.borrow_mut();
        core.bytes -= len;
        if let Some(seq) = oldest {
            core.oldest.remove(&seq);
        }
    });
}

/// Evicts the core's oldest batches until the cache fits its budget, or
/// the oldest cannot go yet (unwritten, or its log busy).
pub(super) fn evict_over_budget() {
    loop {
        let oldest = CORE.with(|core| {
            let core = core.borrow();
            if core.bytes <= core.budget {
                return None;
            }
            core.oldest.first_key_value().map(|(seq, log)| (*seq, log.clone()))
        });
        let Some((seq, log)) = oldest else { return };
        match log.upgrade() {
            Some(log) if log.evict_oldest() => {}
            Some(_) => return,
            None => {
                // Its log is gone (a dropped log forgets its batches; this is
                // only reachable if it is being dropped right now).
                CORE.with(|core| core.borrow_mut().oldest.remove(&seq));
            }
        }
    }
}
