//! A real Kubernetes control plane on loopback, for tests, benchmarks and the demo.
//!
//! kinformer tests everything that crosses the wire against a real
//! `kube-apiserver` backed by a real `etcd`, as controller-runtime's envtest
//! does, without Docker or a kubelet. This crate (a dev-dependency, not a
//! layer of kinformer):
//!
//! - builds `kube-apiserver` and `kubectl` v1.37.2 and `etcd` v3.6.16 from
//!   the Go modules pinned under `go/`, once, into a cache outside the
//!   repository ([`Binaries`]);
//! - starts etcd and kube-apiserver on free loopback ports with a fresh CA,
//!   serving certificate, admin client certificate and service-account keys,
//!   waits until the server is ready, and hands out `kube::Client`s and a
//!   kubeconfig file ([`TestEnv`]);
//! - kills both processes and removes their files on drop, on an explicit
//!   [`TestEnv::stop`], when a test panics, and (for the process-wide
//!   [`TestEnv::shared`] one, or one kept with [`TestEnv::into_static`])
//!   when the test binary exits; if it is killed, its processes die with
//!   it and the next control plane started removes the files it left.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kinformer_envtest::EnvtestError> {
//! use k8s_openapi::api::core::v1::Namespace;
//! let env = kinformer_envtest::TestEnv::start().await?;
//! let namespaces: kube_client::Api<Namespace> = kube_client::Api::all(env.client()?);
//! assert!(namespaces.get("default").await.is_ok());
//! # Ok(()) }
//! ```

#![deny(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod answering_proxy;
mod binaries;
mod certs;
mod env;
mod error;
mod etcd;
pub mod fault_run;
mod namespace;
mod process;
mod proxy;
pub mod rbac;
mod webhooks;

pub use answering_proxy::AnsweringProxy;
pub use binaries::{Binaries, ETCD_VERSION, KUBERNETES_VERSION};
pub use env::{TestEnv, TestEnvOptions};
pub use error::EnvtestError;
pub use fault_run::{Check, Fault, FaultRun, FaultRunFailure, Passed, Snapshot, Target};
pub use namespace::TestNamespace;
pub use proxy::Proxy;

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
