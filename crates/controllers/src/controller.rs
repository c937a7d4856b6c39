//! One controller: its builder and options, the reconcile contract, the
//! runtime that feeds keys from its informers to workers, the gates a
//! worker passes each key through (leader election, sharding,
//! read-your-writes, debounce), why each key was queued, event filters, and
//! read-your-writes (never reconciling from a cache behind the Manager's
//! own writes).

pub(crate) mod builder;
pub(crate) mod gate;
pub(crate) mod options;
pub mod predicate;
pub(crate) mod read_your_writes;
pub(crate) mod reason;
pub(crate) mod reconcile;
pub(crate) mod runtime;
pub(crate) mod worker;
