//! The two controllers the `kinformer` binary runs, built on this crate as
//! any user's would be.

pub mod pod_stdout;
pub mod service_strategy;
