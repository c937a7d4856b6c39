//! Features around the reconcile of one key, as gates.
//!
//! A worker takes a key from the queue and asks each of its controller's
//! gates, in order, whether the key may be reconciled now
//! ([`Gate::admit`]): yes, not now (the gate parks it and queues it again
//! when woken), not here (skipped: its failures and reason are forgotten),
//! or no further key at all (the worker stops). An admitted key is
//! reconciled inside every gate's [`scope`](Gate::scope) and under every
//! gate's [`interrupted`](Gate::interrupted); then each gate that admitted
//! it learns what became of it ([`Gate::settle`]), the last admitted
//! first, before the key is done in the queue. A gate keeps whatever it
//! knows about a key itself, from `admit` to `settle`: the queue
//! guarantees that no two workers hold one key, so nothing else touches it
//! meanwhile.
//!
//! The gates, in the order a worker asks them:
//! - leader election ([`Leader`]): no key is taken once the lease is not
//!   safely this replica's;
//! - sharded key slots (`ShardGate`, in `sharding::key_slots`): a key is
//!   reconciled only inside its slot's guard, while that slot's Lease is
//!   held, and interrupted when it is lost;
//! - read-your-writes (`ReadYourWrites`, in `read_your_writes`): a key
//!   whose informers have not yet seen this Manager's writes is parked
//!   until they have; the writes a reconcile makes are credited to it.
//!
//! Debounce ([`Debounce`]) acts earlier, when an event queues a key
//! ([`Gate::delay`]), and admits every key.
//!
//! A new feature around the reconcile is a new gate, not a new branch in
//! the worker.

use std::time::Duration;

use futures::future::BoxFuture;
use kinformer_store::ObjectKey;
use kinformer_workqueue::Priority;
use std::sync::Arc;

use crate::LeaderElector;
use crate::reconcile::{Action, ReconcileError};

/// What a reconcile returned.
pub(crate) type Reconciled = Result<Action, ReconcileError>;

/// Whether a gate lets a worker reconcile a key now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Yes, as far as this gate is concerned.
    Admit,
    /// Not now: the gate keeps the key and queues it again when woken.
    Park,
    /// Not here: the key is done, its failures and reason forgotten.
    Skip,
    /// No: the worker takes no further key (this one is done, not queued
    /// again: the controller is stopping).
    Stop,
}

/// What became of a key a gate admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Reconciled and not scheduled again (done, terminal, dropped after
    /// its retries, a crash).
    Finished,
    /// Scheduled again (a retry, a requeue) or parked by a later gate.
    Requeued,
    /// Interrupted by a gate (its slot's Lease was lost): not scheduled
    /// again here.
    Interrupted,
    /// Skipped by a later gate: not reconciled here.
    Skipped,
    /// Aborted: the controller stops now.
    Aborted,
}

/// One feature around the reconcile of a key: see the module docs.
pub(crate) trait Gate: Send + Sync {
    /// Whether `key`, taken at `priority`, may be reconciled now.
    fn admit(&self, key: &ObjectKey, priority: Priority) -> Admission;

    /// `reconcile`, run as this gate needs (in a task-local scope, say).
    fn scope<'a>(
        &self,
        _key: &ObjectKey,
        reconcile: BoxFuture<'a, Reconciled>,
    ) -> BoxFuture<'a, Reconciled> {
        reconcile
    }

    /// A future that resolves, with why, when the reconcile of `key` must
    /// end now; `None` if this gate never interrupts it.
    fn interrupted(&self, _key: &ObjectKey) -> Option<BoxFuture<'static, String>> {
        None
    }

    /// What became of `key`, which this gate admitted.
    fn settle(&self, _key: &ObjectKey, _outcome: Outcome) {}

    /// How long an event's key waits before it is queued; `None`: at once.
    fn delay(&self) -> Option<Duration> {
        None
    }
}

/// Leader election: a worker takes no further key once the lease is not
/// safely this replica's (the elector's own flag turns false the instant
/// it is lost, before the controller gets to stop its workers).
pub(crate) struct Leader(pub(crate) Arc<LeaderElector>);

impl Gate for Leader {
    fn admit(&self, _key: &ObjectKey, _priority: Priority) -> Admission {
        match self.0.may_work() {
            true => Admission::Admit,
            false => Admission::Stop,
        }
    }
}

/// Debounce: the events of a burst join one reconcile. A key is queued
/// `debounce` after its first event; one already waiting keeps its
/// earlier time.
pub(crate) struct Debounce(pub(crate) Duration);

impl Gate for Debounce {
    fn admit(&self, _key: &ObjectKey, _priority: Priority) -> Admission {
        Admission::Admit
    }

    fn delay(&self) -> Option<Duration> {
        Some(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debounce_delays_every_event_and_admits_every_key() {
        let gate = Debounce(Duration::from_millis(250));
        assert_eq!(gate.delay(), Some(Duration::from_millis(250)));
        assert_eq!(
            gate.admit(&"ns/a".parse().unwrap(), Priority::Low),
            Admission::Admit
        );
    }
}
