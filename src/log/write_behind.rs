//! Write-behind timing of one core. Under flush `never` (or an interval) a
//! log writes its pending data once the first of it has waited
//! `WRITE_BEHIND_DELAY` (or at once when a chunk has gathered, which the
//! log handles itself). The delay is the same for every log, so the logs
//! waiting on a core are due in the order they started waiting: one queue
//! and one timer per core serve them all, instead of a task and a timer per
//! log and batch.
//!
//! When the first log is due, the logs due within `GATHER` after it are
//! written in the same pass, up to `GATHER_BYTES` of pending data. Their
//! writes reach io_uring in one submission, which the block layer
//! dispatches together: one device notification for the lot instead of one
//! per write. With thousands of partitions each receiving a batch now and
//! then, a core otherwise issues thousands of lone writes a second, and
//! each lone write's notification (a VM exit on virtio) costs more than the
//! copy of its data. The byte limit keeps a pass short (the writes copy
//! their data before the core serves anything else) and keeps logs with
//! large writes, whose notification is cheap next to the copy, at their own
//! times instead of falling into step.
//!
//! Logs that started receiving together stay due together (each is queued
//! again as soon as new data arrives), so one instant can hold every log of
//! the core. A pass therefore starts at most `PASS_BYTES` of writes and the
//! core serves its requests before the next: the copies of a 20 MB instant
//! no longer hold every request on the core for 10 ms.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Logs due within this much of the first due one are written with it.
const GATHER: Duration = Duration::from_millis(10);
/// ...while their pending data stays within this.
const GATHER_BYTES: usize = 128 << 10;
/// A pass starts writes for at most this much pending data (at least one
/// log), then lets the core serve requests before the next. Starting a
/// write copies its data into the DMA buffer before the core serves
/// anything else, and logs that started receiving together fall due
/// together: 100 partitions at 2 MB/s each put 20 MB in one pass, a 10 ms
/// stall of every request on the core every 100 ms.
const PASS_BYTES: usize = 512 << 10;
/// The least pause between two passes.
const PASS_PAUSE: Duration = Duration::from_micros(50);

/// Something the core's write-behind runs: a log with pending data.
pub(super) trait PendingWrite {
    /// Starts writing the pending data (in a task of its own).
    fn start_write(&self);
    /// Bytes waiting to be written.
    fn pending_bytes(&self) -> usize;
}

struct Queue {
    due: VecDeque<(Instant, Box<dyn PendingWrite>)>,
    running: bool,
}

thread_local! {
    static QUEUE: RefCell<Queue> = const { RefCell::new(Queue { due: VecDeque::new(), running: false }) };
}

/// Queues `log` to be written `delay` from now. Delays must be the same for
/// every call on a core (the queue is kept in arrival order).
pub(super) fn schedule(log: Box<dyn PendingWrite>, delay: Duration) {
    schedule_at(log, Instant::now() + delay);
}

/// Queues `log` to be written at `due`, which is no earlier than any queued.
fn schedule_at(log: Box<dyn PendingWrite>, due: Instant) {
    let start_runner = QUEUE.with(|queue| {
        let mut queue = queue.borrow_mut();
        debug_assert!(queue.due.back().is_none_or(|(last, _)| *last <= due));
        queue.due.push_back((due, log));
        !std::mem::replace(&mut queue.running, true)
    });
    if start_runner {
        glommio::spawn_local(run()).detach();
    }
}

/// Logs queued on the calling thread's core.
#[cfg(test)]
pub(super) fn queued() -> usize {
    QUEUE.with(|queue| queue.borrow().due.len())
}

async fn run() {
    loop {
        let first = QUEUE.with(|queue| {
            let mut queue = queue.borrow_mut();
            let first = queue.due.front().map(|(at, _)| *at);
            queue.running = first.is_some();
            first
        });
        let Some(first) = first else { return };
        // At least `PASS_PAUSE`, so that after a pass stopped at
        // `PASS_BYTES` with logs still due the core serves its requests (and
        // the reactor its completions) before the next. A timer, not a
        // yield: glommio polls for I/O only once no task is runnable.
        glommio::timer::sleep(first.saturating_duration_since(Instant::now()).max(PASS_PAUSE)).await;
        let now = Instant::now();
        let horizon = now + GATHER;
        let due: Vec<Box<dyn PendingWrite>> = QUEUE.with(|queue| {
            let mut queue = queue.borrow_mut();
            let mut bytes = 0;
            let count = queue
                .due
                .iter()
                .take_while(|(at, log)| {
                    let before = bytes;
                    bytes += log.pending_bytes();
                    (*at <= now && (before == 0 || bytes <= PASS_BYTES)) || (*at <= horizon && bytes <= GATHER_BYTES)
                })
                .count();
            queue.due.drain(..count).map(|(_, log)| log).collect()
        });
        for log in due {
            log.start_write();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;

    struct Probe {
        written: Rc<RefCell<Vec<(usize, Instant)>>>,
        id: usize,
        bytes: usize,
    }

    fn in_executor<F: std::future::Future<Output = ()> + 'static>(test: impl FnOnce() -> F + Send + 'static) {
        glommio::LocalExecutorBuilder::new(glommio::Placement::Unbound)
            .io_memory(1 << 20)
            .spawn(test)
            .expect("executor starts")
            .join()
            .expect("test passes");
    }

    impl PendingWrite for Probe {
        fn start_write(&self) {
            self.written.borrow_mut().push((self.id, Instant::now()));
        }
        fn pending_bytes(&self) -> usize {
            self.bytes
        }
    }

    #[test]
    fn logs_are_written_after_the_delay_in_order_and_gathered() {
        in_executor(|| async {
            let written = Rc::new(RefCell::new(Vec::new()));
            let start = Instant::now();
            let probe = |id| Box::new(Probe { written: written.clone(), id, bytes: 1 });
            for id in 0..3 {
                schedule_at(probe(id), start + Duration::from_millis(50));
            }
            // Due 5 ms after the first three: inside GATHER, written with them.
            schedule_at(probe(3), start + Duration::from_millis(55));
            // Due 40 ms later: a pass of its own.
            schedule_at(probe(4), start + Duration::from_millis(90));
            assert_eq!(queued(), 5);
            assert!(written.borrow().is_empty());

            glommio::timer::sleep(Duration::from_millis(150)).await;
            let written = written.borrow();
            let ids: Vec<usize> = written.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids, vec![0, 1, 2, 3, 4]);
            let first_pass = written[0].1;
            assert!(first_pass >= start + Duration::from_millis(50), "written before it was due");
            // One pass starts the writes within microseconds of each other.
            assert!(written[3].1 - first_pass < Duration::from_millis(1), "the fourth is written with the first");
            assert!(written[4].1 >= start + Duration::from_millis(80), "written more than GATHER early");
            if first_pass < start + Duration::from_millis(75) {
                assert!(written[4].1 - first_pass > Duration::from_millis(5), "the last one has a pass of its own");
            }
            assert_eq!(queued(), 0);
            let runner_stopped = QUEUE.with(|queue| !queue.borrow().running);
            assert!(runner_stopped);
        });
    }

    #[test]
    fn a_pass_gathers_early_logs_only_within_the_byte_limit() {
        in_executor(|| async {
            let written = Rc::new(RefCell::new(Vec::new()));
            let start = Instant::now();
            schedule_at(
                Box::new(Probe { written: written.clone(), id: 0, bytes: GATHER_BYTES / 2 }),
                start + Duration::from_millis(20),
            );
            // Due within GATHER of the first, but over the byte limit with it.
            schedule_at(
                Box::new(Probe { written: written.clone(), id: 1, bytes: GATHER_BYTES }),
                start + Duration::from_millis(25),
            );
            glommio::timer::sleep(Duration::from_millis(60)).await;
            let written = written.borrow();
            assert_eq!(written.len(), 2);
            assert!(written[1].1 >= start + Duration::from_millis(25), "written when due, not early");
        });
    }

    #[test]
    fn due_logs_over_the_pass_limit_are_started_in_several_passes() {
        in_executor(|| async {
            let written = Rc::new(RefCell::new(Vec::new()));
            let start = Instant::now();
            let due = start + Duration::from_millis(20);
            // Five logs due at once: two fit a pass, the fifth alone is over it.
            for (id, bytes) in
                [(0, PASS_BYTES / 2), (1, PASS_BYTES / 2), (2, PASS_BYTES / 2), (3, 1), (4, 2 * PASS_BYTES)]
            {
                schedule_at(Box::new(Probe { written: written.clone(), id, bytes }), due);
            }
            glommio::timer::sleep(Duration::from_millis(60)).await;
            let written = written.borrow();
            let ids: Vec<usize> = written.iter().map(|(id, _)| *id).collect();
            assert_eq!(ids, vec![0, 1, 2, 3, 4], "every due log is written, in order");
            let at = |i: usize| written[i].1;
            assert!(at(1) - at(0) < PASS_PAUSE, "the first two are one pass");
            assert!(at(2) - at(1) >= PASS_PAUSE, "the third waits for the next pass");
            assert!(at(3) - at(2) < PASS_PAUSE, "the third and fourth are one pass");
            assert!(at(4) - at(3) >= PASS_PAUSE, "a log over the limit gets a pass of its own");
            assert_eq!(queued(), 0);
        });
    }

    #[test]
    fn the_runner_starts_again_after_the_queue_emptied() {
        in_executor(|| async {
            let written = Rc::new(RefCell::new(Vec::new()));
            for round in 0..3 {
                schedule(Box::new(Probe { written: written.clone(), id: round, bytes: 1 }), Duration::from_millis(5));
                glommio::timer::sleep(Duration::from_millis(30)).await;
                assert_eq!(written.borrow().len(), round + 1);
                let runner_stopped = QUEUE.with(|queue| !queue.borrow().running);
                assert!(runner_stopped);
            }
        });
    }
}
