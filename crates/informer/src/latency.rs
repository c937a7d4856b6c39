//! How long an informer takes to apply each unit it pops from its queue:
//! client-go's `informer_processing_latency_seconds`, with component-base's
//! buckets.
//!
//! Written by hand (a dozen atomic counters) because the informer crate
//! depends on no metrics library: the controllers crate exports it through
//! prometheus-client, and any other exporter can read a [`LatencySnapshot`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The upper bounds of the buckets, in seconds (component-base's
/// `informer_processing_latency_seconds`); a last bucket counts the rest.
pub const PROCESSING_LATENCY_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A histogram of processing times, safe to share and to observe from one
/// thread while others read it.
#[derive(Debug, Default)]
pub(crate) struct ProcessingLatency {
    /// Per bucket of [`PROCESSING_LATENCY_BUCKETS`], then the rest.
    counts: [AtomicU64; PROCESSING_LATENCY_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

impl ProcessingLatency {
    pub(crate) fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = PROCESSING_LATENCY_BUCKETS
            .iter()
            .position(|&le| secs <= le)
            .unwrap_or(PROCESSING_LATENCY_BUCKETS.len());
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LatencySnapshot {
        let buckets: Vec<(f64, u64)> = PROCESSING_LATENCY_BUCKETS
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(&self.counts)
            .map(|(le, n)| (le, n.load(Ordering::Relaxed)))
            .collect();
        LatencySnapshot {
            count: buckets.iter().map(|(_, n)| n).sum(),
            sum_seconds: self.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            buckets,
        }
    }
}

/// A reading of an informer's processing latency histogram.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LatencySnapshot {
    /// Each bucket's upper bound in seconds (the last is infinite) and how
    /// many units took longer than the bound before it and at most this
    /// one (not cumulative).
    pub buckets: Vec<(f64, u64)>,
    /// How many units were observed.
    pub count: u64,
    /// Their total time, in seconds.
    pub sum_seconds: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_time_lands_in_the_first_bucket_that_holds_it() {
        let h = ProcessingLatency::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(1));
        h.observe(Duration::from_millis(7));
        h.observe(Duration::from_secs(11));
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert_eq!(s.buckets[0], (0.001, 2), "at most 1 ms");
        assert_eq!(s.buckets[2], (0.01, 1));
        assert_eq!(s.buckets[12], (f64::INFINITY, 1));
        assert!((s.sum_seconds - 11.0085).abs() < 1e-9);
    }
}
