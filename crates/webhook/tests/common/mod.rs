//! What the webhook crate's test files share.

#![allow(dead_code)]

use std::sync::Arc;

use kinformer_webhook::dev_certs::DevCerts;
use kinformer_webhook::{CertFiles, Webhooks};
use tokio_util::sync::CancellationToken;

/// A webhook server on loopback with a fresh CA, serving until `stop`.
pub struct Served {
    pub port: u16,
    pub certs: DevCerts,
    pub tls: Arc<CertFiles>,
    /// Where `tls.crt` and `tls.key` are.
    pub dir: tempfile::TempDir,
    pub stop: CancellationToken,
    pub stopped: tokio::task::JoinHandle<()>,
}

pub async fn serve(webhooks: Webhooks) -> Served {
    let certs = DevCerts::new(&["127.0.0.1"]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = certs.write(dir.path()).unwrap();
    let tls = Arc::new(CertFiles::new(cert, key).unwrap());
    let server = webhooks
        .bind("127.0.0.1:0".parse().unwrap(), Arc::clone(&tls))
        .await
        .unwrap();
    let port = server.local_addr().port();
    let stop = CancellationToken::new();
    let stopped = tokio::spawn(server.run(stop.clone()));
    Served {
        port,
        certs,
        tls,
        dir,
        stop,
        stopped,
    }
}
