//! Metrics hooks, as client-go's `MetricsProvider`, so that a layer above can
//! export queue metrics (to Prometheus, with controller-runtime's names)
//! without this crate depending on any metrics library.

use crate::Priority;

/// A gauge that goes up and down (queue depth).
pub trait GaugeMetric: Send + Sync {
    /// Adds one.
    fn inc(&self);
    /// Subtracts one.
    fn dec(&self);
}

/// A gauge set to a value (unfinished work, longest running processor).
pub trait SettableGaugeMetric: Send + Sync {
    /// Sets the value.
    fn set(&self, value: f64);
}

/// A counter (adds, retries).
pub trait CounterMetric: Send + Sync {
    /// Adds one.
    fn inc(&self);
}

/// A histogram of durations in seconds (queue latency, work duration).
pub trait HistogramMetric: Send + Sync {
    /// Records one observation.
    fn observe(&self, seconds: f64);
}

/// Makes the metrics of one named queue. Every method is called once, when
/// the queue is built.
pub trait MetricsProvider: Send + Sync {
    /// Current number of queued (not yet taken) items, always equal to the
    /// queue's `len()`. An item added again while it is processed counts
    /// once its guard drops and queues it again; client-go counts it at the
    /// add already.
    fn new_depth_metric(&self, name: &str) -> Box<dyn GaugeMetric>;
    /// Items added (duplicates of a queued item excluded).
    fn new_adds_metric(&self, name: &str) -> Box<dyn CounterMetric>;
    /// Seconds an item waited between add and get; for an item added again
    /// while it was processed, from that add (as client-go).
    fn new_latency_metric(&self, name: &str) -> Box<dyn HistogramMetric>;
    /// Seconds between get and done.
    fn new_work_duration_metric(&self, name: &str) -> Box<dyn HistogramMetric>;
    /// Seconds of work in progress and not yet done, summed over items.
    fn new_unfinished_work_seconds_metric(&self, name: &str) -> Box<dyn SettableGaugeMetric>;
    /// Seconds the longest running item has been in progress.
    fn new_longest_running_processor_seconds_metric(
        &self,
        name: &str,
    ) -> Box<dyn SettableGaugeMetric>;
    /// Delayed re-adds (`add_after`, `add_rate_limited`).
    fn new_retries_metric(&self, name: &str) -> Box<dyn CounterMetric>;
    /// Queued items of one priority (the depth, split by priority). By
    /// default none: a provider that has no priority label skips it.
    fn new_depth_by_priority_metric(&self, name: &str, priority: Priority) -> Box<dyn GaugeMetric> {
        let _ = (name, priority);
        Box::new(Noop)
    }
    /// Seconds an item waited at one priority: between add and get, but an
    /// item raised from `Low` to `High` before it is taken reports its wait at
    /// `Low` when raised, and its wait at `High` from then (see
    /// [`Queue`](crate::Queue)). By default none.
    fn new_latency_by_priority_metric(
        &self,
        name: &str,
        priority: Priority,
    ) -> Box<dyn HistogramMetric> {
        let _ = (name, priority);
        Box::new(Noop)
    }
}

/// The metric of a provider that does not keep it.
struct Noop;

impl GaugeMetric for Noop {
    fn inc(&self) {}
    fn dec(&self) {}
}

impl HistogramMetric for Noop {
    fn observe(&self, _: f64) {}
}

/// The metrics of one queue, made from a provider.
pub(crate) struct QueueMetrics {
    pub depth: Box<dyn GaugeMetric>,
    pub adds: Box<dyn CounterMetric>,
    pub latency: Box<dyn HistogramMetric>,
    pub work_duration: Box<dyn HistogramMetric>,
    pub unfinished_work: Box<dyn SettableGaugeMetric>,
    pub longest_running: Box<dyn SettableGaugeMetric>,
    pub retries: Box<dyn CounterMetric>,
    /// Indexed by priority: `[low, high]`.
    depth_by_priority: [Box<dyn GaugeMetric>; 2],
    latency_by_priority: [Box<dyn HistogramMetric>; 2],
}

impl QueueMetrics {
    pub(crate) fn new(provider: &dyn MetricsProvider, name: &str) -> Self {
        Self {
            depth: provider.new_depth_metric(name),
            adds: provider.new_adds_metric(name),
            latency: provider.new_latency_metric(name),
            work_duration: provider.new_work_duration_metric(name),
            unfinished_work: provider.new_unfinished_work_seconds_metric(name),
            longest_running: provider.new_longest_running_processor_seconds_metric(name),
            retries: provider.new_retries_metric(name),
            depth_by_priority: [Priority::Low, Priority::High]
                .map(|p| provider.new_depth_by_priority_metric(name, p)),
            latency_by_priority: [Priority::Low, Priority::High]
                .map(|p| provider.new_latency_by_priority_metric(name, p)),
        }
    }

    pub(crate) fn depth_at(&self, priority: Priority) -> &dyn GaugeMetric {
        &*self.depth_by_priority[priority as usize]
    }

    pub(crate) fn latency_at(&self, priority: Priority) -> &dyn HistogramMetric {
        &*self.latency_by_priority[priority as usize]
    }
}
