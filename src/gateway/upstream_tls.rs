//! TLS towards the routes: the roots `https://` routes are verified against
//! (`--upstream-ca`, or the public web roots compiled in), and the
//! connector that speaks plain HTTP to `http://` routes and TLS to
//! `https://` ones.

use std::path::Path;
use std::sync::Arc;

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::{ClientConfig, RootCertStore};

use super::args::GatewayError;
use super::tls::certificates;

/// The upstream client's connector.
pub(super) type Connector = HttpsConnector<HttpConnector>;

/// The client TLS config: the CA bundle's certificates as the only roots,
/// or the public web roots without one.
pub(super) fn client_config(ca: Option<&Path>) -> Result<ClientConfig, GatewayError> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(path) => {
            let pem = std::fs::read(path)
                .map_err(|e| GatewayError::Tls(format!("--upstream-ca {}: {e}", path.display())))?;
            let what = format!("--upstream-ca {}", path.display());
            for cert in certificates(&pem, &what).map_err(GatewayError::Tls)? {
                roots
                    .add(cert)
                    .map_err(|e| GatewayError::Tls(format!("{what}: {e}")))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| GatewayError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// HTTP for `http://` routes, TLS (ALPN http/1.1) for `https://` ones.
pub(super) fn connector(config: ClientConfig) -> Connector {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http)
}
