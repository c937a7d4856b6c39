//! Kubernetes admission webhooks over HTTPS, for any kube-rs user: typed
//! validating and defaulting handlers on kube-core's admission types, one
//! server for all of them, and the serving certificate read from files and
//! reloaded as it rotates. It knows nothing of informers; the controllers
//! crate's Manager can serve it beside its metrics and health.
//!
//! ```no_run
//! # async fn demo() -> Result<(), kinformer_webhook::WebhookError> {
//! use std::sync::Arc;
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kinformer_webhook::{CertFiles, Verdict, Webhooks};
//!
//! let tls = Arc::new(CertFiles::new("/tmp/k8s-webhook-server/serving-certs/tls.crt",
//!                                   "/tmp/k8s-webhook-server/serving-certs/tls.key")?);
//! let server = Webhooks::new()
//!     // Refuse a ConfigMap without data.
//!     .validate("/validate-configmap", |request| async move {
//!         let cm: Option<ConfigMap> = request.object;
//!         match cm.and_then(|cm| cm.data) {
//!             Some(_) => Verdict::allow(),
//!             None => Verdict::deny("a ConfigMap here needs data"),
//!         }
//!     })
//!     // Label every ConfigMap as managed; the JSON patch is computed.
//!     .defaulting("/default-configmap", |mut cm: ConfigMap, _request| async move {
//!         cm.metadata.labels.get_or_insert_default().insert("managed".into(), "true".into());
//!         Ok(cm)
//!     })
//!     .bind("0.0.0.0:9443".parse().unwrap(), tls)
//!     .await?;
//! server.run(tokio_util::sync::CancellationToken::new()).await;
//! # Ok(()) }
//! ```
//!
//! - [`Webhooks`]: the handlers, by path; [`Server`]: bound and serving.
//!   What it answers to bad input (malformed, oversized, wrong content
//!   type, an object of another kind, a panicking or slow handler) is in
//!   the [`server`] module's docs.
//! - [`Conversion`], served by [`Webhooks::convert`]: a CRD's versions
//!   converted hub and spoke.
//! - [`CertFiles`]: the serving certificate and key, reloaded when the
//!   files change, the last good pair kept when a change does not load.
//! - With the `dev-certs` feature, `dev_certs::DevCerts`: a CA and a serving
//!   certificate for development and tests (the CA goes in the webhook
//!   configuration's `caBundle`).

#![warn(missing_docs)]
#![warn(clippy::return_self_not_must_use)]

mod admission;
mod connection;
pub mod conversion;
#[cfg(feature = "dev-certs")]
pub mod dev_certs;
mod nesting;
pub mod server;
mod tls;

pub use admission::Verdict;
pub use conversion::Conversion;
pub use kube_core::admission::{AdmissionRequest, Operation};
pub use server::{DEFAULT_MAX_BODY_BYTES, Observer, OnPanic, Server, Webhooks};
pub use tls::CertFiles;

use std::net::SocketAddr;
use std::path::PathBuf;

/// What can go wrong setting a webhook server up. Requests never make one:
/// each gets an answer (see [`server`]). Each variant names the file or
/// address at fault; the cause is its `source()`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// A file (the certificate or its key) could not be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("writing {path}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why not.
        source: std::io::Error,
    },
    /// The certificate or key does not load: not PEM, empty, or a key that
    /// does not go with the certificate.
    #[error("the serving certificate in {path} {reason}")]
    Certificate {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
        /// The PEM parser's or rustls's error, when one said why.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// rustls refused the configuration.
    #[error("rustls refused the TLS configuration")]
    Tls(#[source] tokio_rustls::rustls::Error),
    /// The server could not listen on its address.
    #[error("binding the webhook server to {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why not.
        source: std::io::Error,
    },
    /// A webhook path that does not start with `/`, or is given twice.
    #[error("webhook path {0}")]
    Path(String),
    /// A development certificate could not be made.
    #[cfg(feature = "dev-certs")]
    #[error("making a development certificate failed")]
    DevCerts(#[from] rcgen::Error),
}

/// The README's code, compiled (and run, unless marked `no_run`) as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
