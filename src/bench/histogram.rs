//! Latency histograms (HdrHistogram, microseconds, 3 significant digits):
//! recording on each core, merging across cores, the percentile summary, and
//! the `.hgrm` percentile-distribution text that HdrHistogram's plotter reads.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

/// Longest latency recorded exactly; longer ones count as this.
pub const LATENCY_US_MAX: u64 = 3_600 * 1_000_000;
const SIGNIFICANT_DIGITS: u8 = 3;
/// Quantile steps per halving of the distance to 100% (HdrHistogram's default).
const TICKS_PER_HALF_DISTANCE: u32 = 5;

/// A latency histogram in microseconds.
#[derive(Debug, Clone)]
pub struct Latency(Histogram<u64>);

impl Default for Latency {
    fn default() -> Self {
        Self(Histogram::new_with_bounds(1, LATENCY_US_MAX, SIGNIFICANT_DIGITS).expect("valid histogram bounds"))
    }
}

/// The figures a report prints for one histogram, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Summary {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub p9999_us: u64,
    pub max_us: u64,
}

impl Latency {
    pub fn record(&mut self, micros: u64) {
        self.0.saturating_record(micros.clamp(1, LATENCY_US_MAX));
    }

    pub fn add(&mut self, other: &Latency) {
        self.0.add(&other.0).expect("histograms share their bounds");
    }

    pub fn reset(&mut self) {
        self.0.reset();
    }

    pub fn len(&self) -> u64 {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn quantile_us(&self, quantile: f64) -> u64 {
        self.0.value_at_quantile(quantile)
    }

    pub fn summary(&self) -> Summary {
        if self.0.is_empty() {
            return Summary::default();
        }
        let q = |quantile| self.0.value_at_quantile(quantile);
        Summary {
            count: self.0.len(),
            mean_us: self.0.mean(),
            p50_us: q(0.5),
            p90_us: q(0.9),
            p99_us: q(0.99),
            p999_us: q(0.999),
            p9999_us: q(0.9999),
            max_us: self.0.max(),
        }
    }

    /// (quantile, latency µs) points from the lowest to the highest value,
    /// denser towards 100%: what both the `.hgrm` file and the plot show.
    pub fn percentile_points(&self) -> Vec<(f64, u64)> {
        self.0
            .iter_quantiles(TICKS_PER_HALF_DISTANCE)
            .map(|step| (step.quantile_iterated_to(), self.0.highest_equivalent(step.value_iterated_to())))
            .collect()
    }

    /// The HdrHistogram percentile distribution, values in milliseconds.
    pub fn hgrm(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "{:>12} {:>14} {:>10} {:>14}\n", "Value", "Percentile", "TotalCount", "1/(1-Percentile)");
        let mut total = 0u64;
        for step in self.0.iter_quantiles(TICKS_PER_HALF_DISTANCE) {
            total += step.count_since_last_iteration();
            let value_ms = self.0.highest_equivalent(step.value_iterated_to()) as f64 / 1000.0;
            let quantile = step.quantile_iterated_to();
            if quantile < 1.0 {
                let _ = writeln!(out, "{value_ms:12.3} {quantile:2.12} {total:10} {:14.2}", 1.0 / (1.0 - quantile));
            } else {
                let _ = writeln!(out, "{value_ms:12.3} {quantile:2.12} {total:10}");
            }
        }
        let count = self.0.len();
        let (mean, stdev, max) = if count == 0 {
            (0.0, 0.0, 0.0)
        } else {
            (self.0.mean() / 1000.0, self.0.stdev() / 1000.0, self.0.max() as f64 / 1000.0)
        };
        let _ = writeln!(out, "#[Mean    = {mean:12.3}, StdDeviation   = {stdev:12.3}]");
        let _ = writeln!(out, "#[Max     = {max:12.3}, Total count    = {count:12}]");
        let sub_buckets = 2 * self.0.distinct_values() / (usize::from(self.0.buckets()) + 1);
        let _ = writeln!(out, "#[Buckets = {:12}, SubBuckets     = {:12}]", self.0.buckets(), sub_buckets);
        out
    }
}

/// The histograms one core fills.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    /// Send (intended send, at a fixed rate) to acknowledgement.
    pub produce: Latency,
    /// Time in the record to the consumer's receipt.
    pub e2e: Latency,
    /// One Fetch request, sent to answered.
    pub fetch: Latency,
}

impl Latencies {
    pub fn add(&mut self, other: &Latencies) {
        self.produce.add(&other.produce);
        self.e2e.add(&other.e2e);
        self.fetch.add(&other.fetch);
    }

    pub fn reset(&mut self) {
        self.produce.reset();
        self.e2e.reset();
        self.fetch.reset();
    }

    /// Named, non-empty histograms in report order.
    pub fn named(&self) -> Vec<(&'static str, &Latency)> {
        [("produce", &self.produce), ("e2e", &self.e2e), ("fetch", &self.fetch)]
            .into_iter()
            .filter(|(_, h)| !h.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reads_percentiles_in_microseconds() {
        let mut latency = Latency::default();
        for micros in 1..=10_000 {
            latency.record(micros);
        }
        let summary = latency.summary();
        assert_eq!(summary.count, 10_000);
        assert!((4_990..=5_010).contains(&summary.p50_us), "{summary:?}");
        assert!((9_890..=9_910).contains(&summary.p99_us), "{summary:?}");
        assert!((9_995..=10_010).contains(&summary.max_us), "{summary:?}");
    }

    #[test]
    fn merging_adds_counts() {
        let mut a = Latency::default();
        let mut b = Latency::default();
        a.record(100);
        b.record(200);
        b.record(0);
        a.add(&b);
        assert_eq!(a.len(), 3);
    }

    #[test]
    fn hgrm_has_header_rows_and_footer() {
        let mut latency = Latency::default();
        for micros in [100, 200, 300, 1_000, 50_000] {
            latency.record(micros);
        }
        let text = latency.hgrm();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("Percentile") && lines[0].contains("TotalCount"));
        assert!(lines[1].is_empty());
        let last_row = lines.iter().rev().find(|l| !l.starts_with('#')).expect("rows");
        assert!(last_row.contains("1.000000000000"), "{last_row}");
        assert!(text.contains("#[Max     =       50.015") || text.contains("#[Max     ="), "{text}");
        assert!(text.contains("Total count    =            5"));
    }
}
