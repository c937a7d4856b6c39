//! A CA and a serving certificate made on the spot, for development and
//! tests: the API server trusts the webhook once the CA is the webhook
//! configuration's `caBundle`. In a cluster, cert-manager (or the like)
//! issues the certificate instead, and [`CertFiles`](crate::CertFiles)
//! reads it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::WebhookError;

/// A CA, and a serving certificate it signed, as PEM.
#[derive(Clone)]
pub struct DevCerts {
    /// The CA certificate: the `caBundle`.
    pub ca: String,
    /// The serving certificate.
    pub cert: String,
    /// The serving certificate's private key.
    pub key: String,
    issuer: Arc<Issuer<'static, KeyPair>>,
}

impl std::fmt::Debug for DevCerts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCerts").finish_non_exhaustive()
    }
}

impl DevCerts {
    /// A new CA and a certificate for `names` (DNS names or IP addresses,
    /// such as `127.0.0.1` or `my-webhook.my-namespace.svc`).
    pub fn new(names: &[&str]) -> Result<Self, WebhookError> {
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "kinformer-webhook-dev-ca");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = Arc::new(Issuer::new(ca, ca_key));
        Self::signed(ca_cert.pem(), issuer, names)
    }

    /// A new serving certificate (and key) for `names` from the same CA: a
    /// rotation, as cert-manager makes one.
    pub fn renew(&self, names: &[&str]) -> Result<Self, WebhookError> {
        Self::signed(self.ca.clone(), Arc::clone(&self.issuer), names)
    }

    fn signed(
        ca: String,
        issuer: Arc<Issuer<'static, KeyPair>>,
        names: &[&str],
    ) -> Result<Self, WebhookError> {
        let key = KeyPair::generate()?;
        let mut serving =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
        serving.distinguished_name.push(
            DnType::CommonName,
            names.first().copied().unwrap_or("webhook"),
        );
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = serving.signed_by(&key, &issuer)?;
        Ok(Self {
            ca,
            cert: cert.pem(),
            key: key.serialize_pem(),
            issuer,
        })
    }

    /// Writes `tls.crt` and `tls.key` (the names of a kubernetes.io/tls
    /// Secret's keys) into `dir`, each replaced at once (written beside,
    /// then renamed), and returns their paths.
    pub fn write(&self, dir: &Path) -> Result<(PathBuf, PathBuf), WebhookError> {
        let put = |name: &str, contents: &str| {
            let path = dir.join(name);
            let partial = dir.join(format!(".{name}.partial"));
            std::fs::write(&partial, contents)
                .and_then(|()| std::fs::rename(&partial, &path))
                .map_err(|source| WebhookError::Write {
                    path: path.clone(),
                    source,
                })?;
            Ok::<_, WebhookError>(path)
        };
        Ok((put("tls.crt", &self.cert)?, put("tls.key", &self.key)?))
    }
}
