//! The serving certificate, read from two PEM files and read again when
//! they change: cert-manager and the kubelet's Secret volumes rotate them in
//! place (a Secret volume swaps a `..data` symlink, so both files change at
//! once). Every TLS handshake compares the files' metadata (two `stat`s)
//! with what was loaded; a change is loaded before the handshake goes on, so
//! the first connection after a rotation already gets the new certificate.
//! A pair that does not load (half written, a key that does not match) is
//! not used: the last good one serves, the failure is logged and counted,
//! and it is read again on the next change or a second later. So no
//! admission fails across a rotation.
//!
//! Written here rather than taken from a crate: rustls's
//! `ResolvesServerCert` is the hook, and what it needs (a stat per
//! handshake, keep the last good pair) is a few lines; the crates that
//! watch files (notify) add a thread and inotify for the same outcome.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{self, ServerConfig};
use tracing::{info, warn};

use crate::WebhookError;

/// What identifies one version of a file: a rotation changes at least one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    changed: (i64, i64),
    len: u64,
    inode: u64,
    device: u64,
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        modified: meta.modified().ok(),
        changed: (meta.ctime(), meta.ctime_nsec()),
        len: meta.len(),
        inode: meta.ino(),
        device: meta.dev(),
    })
}

struct Loaded {
    stamps: (Option<Stamp>, Option<Stamp>),
    key: Arc<CertifiedKey>,
    /// When these stamps last failed to load: tried again after
    /// [`RETRY_AFTER`] (a file rewritten in place may keep its stamp once
    /// complete).
    failed_at: Option<Instant>,
}

/// How soon a pair that did not load is read again, its stamps unchanged.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// A serving certificate and key read from PEM files, reloaded when they
/// change (see the module docs).
pub struct CertFiles {
    cert: PathBuf,
    key: PathBuf,
    loaded: parking_lot::RwLock<Loaded>,
    reloads: AtomicU64,
    failures: AtomicU64,
}

impl std::fmt::Debug for CertFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertFiles")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("reloads", &self.reloads())
            .field("failures", &self.failures())
            .finish()
    }
}

/// `error` and its causes, `a: b: c`, for the log: its `Display` is its
/// own text only (kinformer-informer's `error_chain`, which this crate
/// does not depend on).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let causes = std::iter::successors(Some(error), |e| e.source()).take(64);
    causes
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Reads and checks a certificate chain and its key.
fn load(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, WebhookError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| WebhookError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let tls = |path: &Path, reason: String| WebhookError::Certificate {
        path: path.to_owned(),
        reason,
        source: None,
    };
    let caused = |path: &Path, reason: String, e| WebhookError::Certificate {
        path: path.to_owned(),
        reason,
        source: Some(e),
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| caused(cert, "is not a PEM certificate chain".into(), Box::new(e)))?;
    if chain.is_empty() {
        return Err(tls(cert, "holds no certificate".into()));
    }
    let private = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| caused(key, "is not a PEM private key".into(), Box::new(e)))?;
    let provider = rustls::crypto::ring::default_provider();
    let certified = CertifiedKey::from_der(chain, private, &provider).map_err(|e| {
        let reason = format!("does not go with the key in {}", key.display());
        caused(cert, reason, Box::new(e))
    })?;
    Ok(Arc::new(certified))
}

impl CertFiles {
    /// Reads `cert` (a PEM chain, the serving certificate first) and `key`
    /// (its PEM private key). Fails if they do not load now; later
    /// failures keep the last good pair.
    pub fn new(cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Result<Self, WebhookError> {
        let (cert, key) = (cert.into(), key.into());
        let stamps = (stamp(&cert), stamp(&key));
        let loaded = load(&cert, &key)?;
        Ok(Self {
            cert,
            key,
            loaded: parking_lot::RwLock::new(Loaded {
                stamps,
                key: loaded,
                failed_at: None,
            }),
            reloads: AtomicU64::new(0),
            failures: AtomicU64::new(0),
        })
    }

    /// Times a changed pair was loaded.
    pub fn reloads(&self) -> u64 {
        self.reloads.load(Ordering::Relaxed)
    }

    /// Times a changed pair did not load (the last good one kept serving).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The pair to serve: reloaded first if the files changed.
    fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.cert), stamp(&self.key));
        let settled = |loaded: &Loaded| {
            loaded.stamps == stamps && loaded.failed_at.is_none_or(|at| at.elapsed() < RETRY_AFTER)
        };
        {
            let loaded = self.loaded.read();
            if settled(&loaded) {
                return Arc::clone(&loaded.key);
            }
        }
        let mut loaded = self.loaded.write();
        if !settled(&loaded) {
            // A failing pair is not read again on every handshake, only
            // after RETRY_AFTER or a change.
            loaded.stamps = stamps;
            match load(&self.cert, &self.key) {
                Ok(key) => {
                    loaded.key = key;
                    loaded.failed_at = None;
                    self.reloads.fetch_add(1, Ordering::Relaxed);
                    info!(cert = %self.cert.display(), "serving certificate reloaded");
                }
                Err(error) => {
                    loaded.failed_at = Some(Instant::now());
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    let error = error_chain(&error);
                    warn!(%error, "the changed serving certificate does not load; the last good one still serves");
                }
            }
        }
        Arc::clone(&loaded.key)
    }

    /// A rustls server configuration serving these files (HTTP/1.1).
    pub fn server_config(self: Arc<Self>) -> Result<Arc<ServerConfig>, WebhookError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(WebhookError::Tls)?
            .with_no_client_auth()
            .with_cert_resolver(self);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for CertFiles {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_certificate_that_does_not_load_names_its_file_and_its_cause_is_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let missing = CertFiles::new(&cert, &key).unwrap_err();
        assert_eq!(missing.to_string(), format!("reading {}", cert.display()));
        let io = missing
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            io.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );

        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
        let garbled = CertFiles::new(&cert, &key).unwrap_err();
        let message = garbled.to_string();
        assert!(
            message.ends_with("tls.crt is not a PEM certificate chain"),
            "{message}"
        );
        let cause = garbled
            .source()
            .expect("the PEM parser's error")
            .to_string();
        assert!(!message.contains(&cause), "{message} / {cause}");
        assert_eq!(error_chain(&garbled), format!("{message}: {cause}"));
    }
}
