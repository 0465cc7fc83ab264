//! TLS towards clients: the server certificate and key (`--tls-cert`,
//! `--tls-key`) and the optional client CA (`--tls-client-ca`), read from PEM
//! files and read again when their bytes change (cert-manager rotates a
//! mounted Secret in place). A new set that does not load (unparsable, a key
//! that is not the certificate's, a half-written rotation) is logged and
//! the one in force kept. A verified client certificate's names become the
//! connection's [`PeerCertificate`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use tokio_rustls::TlsAcceptor;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::args::{ClientCert, GatewayError, TlsArgs};
use super::peer::PeerCertificate;

/// The files of the server side's TLS.
#[derive(Debug, Clone)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
    client_cert: ClientCert,
}

/// The bytes of the files, as last read (to notice a change).
#[derive(PartialEq, Eq)]
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// The server's TLS config in force, and what it was built from.
pub(super) struct ServerTls {
    files: Files,
    current: RwLock<(Arc<ServerConfig>, Contents)>,
    /// Whether unreadable files were reported (once until readable again).
    unreadable: AtomicBool,
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

impl Files {
    fn read(&self) -> Result<Contents, String> {
        Ok(Contents {
            cert: read(&self.cert)?,
            key: read(&self.key)?,
            client_ca: self.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// PEM certificates, at least one.
pub(super) fn certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what}: no PEM certificate"));
    }
    Ok(certs)
}

/// A server config from the files' bytes: the chain and its key (which
/// must match), the client verifier with a client CA, ALPN http/1.1.
fn build(files: &Files, c: &Contents) -> Result<ServerConfig, String> {
    let cert = files.cert.display();
    let chain = certificates(&c.cert, &format!("{cert}"))?;
    let key = PrivateKeyDer::from_pem_slice(&c.key)
        .map_err(|e| format!("{}: {e}", files.key.display()))?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &c.client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for ca in certificates(pem, "--tls-client-ca")? {
                roots.add(ca).map_err(|e| format!("--tls-client-ca: {e}"))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider());
            let verifier = match files.client_cert {
                ClientCert::Required => verifier,
                ClientCert::Optional => verifier.allow_unauthenticated(),
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| e.to_string())?)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{cert} with {}: {e}", files.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl ServerTls {
    /// The server side's TLS from the flags (none without `--tls-cert`);
    /// files that do not load stop the gateway starting.
    pub(super) fn from_args(a: &TlsArgs) -> Result<Option<Arc<ServerTls>>, GatewayError> {
        let (Some(cert), Some(key)) = (&a.tls_cert, &a.tls_key) else {
            return Ok(None);
        };
        let files = Files {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: a.tls_client_ca.clone(),
            client_cert: a.tls_client_cert,
        };
        let contents = files.read().map_err(GatewayError::Tls)?;
        let config = build(&files, &contents).map_err(GatewayError::Tls)?;
        Ok(Some(Arc::new(ServerTls {
            files,
            current: RwLock::new((Arc::new(config), contents)),
            unreadable: AtomicBool::new(false),
        })))
    }

    /// Whether clients must present a certificate.
    pub(super) fn describe(&self) -> &'static str {
        match (&self.files.client_ca, self.files.client_cert) {
            (None, _) => "TLS",
            (Some(_), ClientCert::Required) => "TLS, client certificate required",
            (Some(_), ClientCert::Optional) => "TLS, client certificate optional",
        }
    }

    /// An acceptor with the config in force.
    pub(super) fn acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        TlsAcceptor::from(current.0.clone())
    }

    /// Reads the files; when their bytes changed, installs what they hold
    /// or says why not and keeps the config in force.
    fn reload(&self) {
        let contents = match self.files.read() {
            Ok(c) => c,
            Err(e) => {
                if !self.unreadable.swap(true, Ordering::Relaxed) {
                    tracing::error!(error = %e, "TLS files unreadable; keeping the certificate in force");
                }
                return;
            }
        };
        self.unreadable.store(false, Ordering::Relaxed);
        if self.current.read().unwrap_or_else(|e| e.into_inner()).1 == contents {
            return;
        }
        match build(&self.files, &contents) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) =
                    (Arc::new(config), contents);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "the new TLS files do not load; keeping the certificate in force");
                // Not again until the bytes change once more.
                let mut current = self.current.write().unwrap_or_else(|e| e.into_inner());
                current.1 = contents;
            }
        }
    }

    /// Re-reads the files every `every`.
    pub(super) async fn watch(self: Arc<Self>, every: Duration) {
        loop {
            tokio::time::sleep(every).await;
            self.reload();
        }
    }
}

/// The names of the client's verified certificate: subject common name(s),
/// then SAN DNS names, then SAN URIs. None without a certificate (a
/// certificate the verifier did not accept never gets this far).
pub(super) fn peer_certificate(conn: &ServerConnection) -> Option<PeerCertificate> {
    let leaf = conn.peer_certificates()?.first()?;
    let peer = PeerCertificate {
        names: names(leaf.as_ref()),
    };
    tracing::debug!(names = ?peer.names, "client certificate verified");
    Some(peer)
}

fn names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_owned))
        .collect();
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => names.push((*d).to_owned()),
                GeneralName::URI(u) => uris.push((*u).to_owned()),
                _ => {}
            }
        }
    }
    names.extend(uris);
    names
}
