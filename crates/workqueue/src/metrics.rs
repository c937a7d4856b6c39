//! Metrics hooks, as client-go's `MetricsProvider`, so that a layer above can
//! export queue metrics (to Prometheus, with controller-runtime's names)
//! without this crate depending on any metrics library.

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
    /// once `done` queues it again; client-go counts it at the add already.
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
        }
    }
}
