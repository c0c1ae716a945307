//! Fixed-rate pacing without coordinated omission. Each producer owns a
//! schedule: message i is due at `start + i / rate`. A message's latency is
//! counted from that intended time, not from when it actually went out, so a
//! stall (in the broker, the network or the generator itself) shows up as
//! latency for every message it delayed instead of quietly lowering the rate.

use std::time::{Duration, Instant};

/// The intended send times of one producer.
#[derive(Debug, Clone)]
pub struct Schedule {
    start: Instant,
    per_second: f64,
    next: u64,
}

impl Schedule {
    /// `per_second` messages a second from `start` on.
    pub fn new(start: Instant, per_second: f64) -> Self {
        assert!(per_second > 0.0 && per_second.is_finite(), "rate must be positive");
        Self { start, per_second, next: 0 }
    }

    /// A producer's share of a total rate, phase-shifted so that `count`
    /// producers do not all fire at the same instant.
    pub fn share(start: Instant, total_per_second: f64, index: usize, count: usize) -> Self {
        assert!(index < count);
        let per_second = total_per_second / count as f64;
        let phase = Duration::from_nanos((index as f64 * 1e9 / count as f64 / per_second).round() as u64);
        Self::new(start + phase, per_second)
    }

    /// When message `index` is due.
    pub fn intended(&self, index: u64) -> Instant {
        self.start + Duration::from_nanos((index as f64 * 1e9 / self.per_second).round() as u64)
    }

    /// When the next message not yet taken is due.
    pub fn next_due(&self) -> Instant {
        self.intended(self.next)
    }

    /// How many messages are due at `now` and not yet taken.
    pub fn due(&self, now: Instant) -> u64 {
        if now < self.start {
            return 0;
        }
        let elapsed_ns = (now - self.start).as_nanos() as f64;
        let due_total = (elapsed_ns * self.per_second / 1e9 + 1e-9).floor() as u64 + 1;
        due_total.saturating_sub(self.next)
    }

    /// Takes the next message: its intended send time.
    pub fn take(&mut self) -> Instant {
        let at = self.intended(self.next);
        self.next += 1;
        at
    }

    /// Messages taken so far.
    pub fn taken(&self) -> u64 {
        self.next
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_i_is_due_at_start_plus_i_over_rate() {
        let start = Instant::now();
        let schedule = Schedule::new(start, 1000.0);
        assert_eq!(schedule.intended(0), start);
        assert_eq!(schedule.intended(1000), start + Duration::from_secs(1));
        assert_eq!(schedule.intended(250), start + Duration::from_millis(250));
    }

    #[test]
    fn due_counts_what_is_late_and_not_yet_taken() {
        let start = Instant::now();
        let mut schedule = Schedule::new(start, 100.0);
        assert_eq!(schedule.due(start - Duration::from_millis(1)), 0);
        assert_eq!(schedule.due(start), 1);
        assert_eq!(schedule.due(start + Duration::from_millis(995)), 100);
        for _ in 0..40 {
            schedule.take();
        }
        assert_eq!(schedule.due(start + Duration::from_millis(995)), 60);
        assert_eq!(schedule.taken(), 40);
        assert_eq!(schedule.next_due(), start + Duration::from_millis(400));
    }

    #[test]
    fn a_stall_keeps_the_intended_times() {
        // The generator wakes up 500 ms late: the messages it now sends keep
        // the times they were due at, so their latency includes the stall.
        let start = Instant::now();
        let mut schedule = Schedule::new(start, 10.0);
        let now = start + Duration::from_millis(500);
        let due = schedule.due(now);
        assert_eq!(due, 6);
        let times: Vec<Instant> = (0..due).map(|_| schedule.take()).collect();
        assert_eq!(times[0], start);
        assert_eq!(times[5], start + Duration::from_millis(500));
        assert!(now - times[0] >= Duration::from_millis(500));
    }

    #[test]
    fn shares_add_up_to_the_total_and_are_phase_shifted() {
        let start = Instant::now();
        let a = Schedule::share(start, 1000.0, 0, 4);
        let b = Schedule::share(start, 1000.0, 1, 4);
        assert_eq!(a.intended(250), start + Duration::from_secs(1));
        assert_eq!(b.intended(0), start + Duration::from_millis(1));
        let later = start + Duration::from_secs(10);
        let total: u64 = (0..4).map(|i| Schedule::share(start, 1000.0, i, 4).due(later)).sum();
        assert!((9_999..=10_004).contains(&total), "{total}");
    }
}
