//! The TLS listener in-process on a real loopback socket: test CAs and
//! certificates made here (rcgen), a router that answers with the
//! [`PeerCertificate`] it was handed. A verified client certificate's names
//! reach the request; no certificate, or one of another CA, is refused when
//! one is required; a key that is not the certificate's never loads.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::args::{ClientCert, TlsArgs};
use super::conn::{Clocks, Serves};
use super::listen::{self, Listener, Slots};
use super::peer::PeerCertificate;
use super::tls::ServerTls;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Ca(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    /// A leaf (PEM certificate, PEM key) with a common name and SANs.
    fn leaf(
        &self,
        cn: &str,
        sans: Vec<SanType>,
        usage: ExtendedKeyUsagePurpose,
    ) -> (String, String) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.subject_alt_names = sans;
        p.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &self.0).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn args(
    dir: &Path,
    server: &(String, String),
    client_ca: Option<&Ca>,
    mode: ClientCert,
) -> TlsArgs {
    TlsArgs {
        tls_cert: Some(write(dir, "tls.crt", &server.0)),
        tls_key: Some(write(dir, "tls.key", &server.1)),
        tls_client_ca: client_ca.map(|ca| write(dir, "client-ca.crt", &ca.0.pem())),
        tls_client_cert: mode,
        upstream_ca: None,
        route_credentials: Vec::new(),
    }
}

/// A TLS listener whose one route answers with the client certificate's
/// names ("none" without).
async fn serve(tls: Arc<ServerTls>) -> SocketAddr {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    let router = Router::new().fallback(|r: Request| async move {
        r.extensions()
            .get::<PeerCertificate>()
            .map_or("none".to_owned(), |p| p.names.join(","))
    });
    let clocks = Clocks {
        header_read: Duration::from_secs(2),
        idle: Duration::from_secs(5),
        body_read: Duration::from_secs(5),
        max_body_bytes: 1024,
    };
    let l = Listener {
        tcp,
        serves: Serves { router, head: None },
        tls: Some(tls),
        clocks,
        slots: Slots::new(8),
    };
    tokio::spawn(listen::serve(
        l,
        std::future::pending(),
        Duration::from_secs(1),
    ));
    addr
}

/// One GET over TLS trusting `ca`, with `client` as the client certificate:
/// the response, or the error.
async fn get(
    addr: SocketAddr,
    ca: &Ca,
    client: Option<&(String, String)>,
) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.0.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("gateway.test").unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let mut s = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(b"GET / HTTP/1.1\r\nhost: gateway.test\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out)
}

fn server_cert(ca: &Ca) -> (String, String) {
    let dns = SanType::DnsName("gateway.test".try_into().unwrap());
    ca.leaf("gateway", vec![dns], ExtendedKeyUsagePurpose::ServerAuth)
}

fn client_cert(ca: &Ca) -> (String, String) {
    let sans = vec![
        SanType::DnsName("caller.team-a.example".try_into().unwrap()),
        SanType::URI(
            "spiffe://cluster.local/ns/team-a/sa/caller"
                .try_into()
                .unwrap(),
        ),
    ];
    ca.leaf("team-a-caller", sans, ExtendedKeyUsagePurpose::ClientAuth)
}

#[tokio::test]
async fn a_verified_client_certificates_names_reach_the_request() {
    let (server_ca, client_ca, other_ca) =
        (Ca::new("servers"), Ca::new("clients"), Ca::new("other"));
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let a = args(
        d,
        &server_cert(&server_ca),
        Some(&client_ca),
        ClientCert::Required,
    );
    let addr = serve(ServerTls::from_args(&a).unwrap().unwrap()).await;

    let ok = get(addr, &server_ca, Some(&client_cert(&client_ca)))
        .await
        .unwrap();
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(
        ok.ends_with(
            "team-a-caller,caller.team-a.example,spiffe://cluster.local/ns/team-a/sa/caller"
        ),
        "{ok}"
    );
    // Required: no certificate, or one of another CA, gets no answer.
    for client in [None, Some(client_cert(&other_ca))] {
        let refused = get(addr, &server_ca, client.as_ref()).await;
        assert!(
            refused.as_ref().is_err() || refused.as_ref().is_ok_and(|r| !r.contains("200")),
            "{refused:?}"
        );
    }
}

#[tokio::test]
async fn an_optional_client_certificate_may_be_absent_but_not_foreign() {
    let (server_ca, client_ca, other_ca) =
        (Ca::new("servers"), Ca::new("clients"), Ca::new("other"));
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let a = args(
        d,
        &server_cert(&server_ca),
        Some(&client_ca),
        ClientCert::Optional,
    );
    let addr = serve(ServerTls::from_args(&a).unwrap().unwrap()).await;
    let without = get(addr, &server_ca, None).await.unwrap();
    assert!(
        without.starts_with("HTTP/1.1 200") && without.ends_with("none"),
        "{without}"
    );
    let with = get(addr, &server_ca, Some(&client_cert(&client_ca)))
        .await
        .unwrap();
    assert!(
        with.ends_with("spiffe://cluster.local/ns/team-a/sa/caller"),
        "{with}"
    );
    let foreign = get(addr, &server_ca, Some(&client_cert(&other_ca))).await;
    assert!(
        foreign.as_ref().is_err() || foreign.as_ref().is_ok_and(|r| !r.contains("200")),
        "{foreign:?}"
    );
    // Without --tls-client-ca no certificate is asked for, none is passed on.
    let plain = args(d, &server_cert(&server_ca), None, ClientCert::Required);
    let addr = serve(ServerTls::from_args(&plain).unwrap().unwrap()).await;
    let r = get(addr, &server_ca, None).await.unwrap();
    assert!(r.ends_with("none"), "{r}");
}

#[test]
fn a_key_that_is_not_the_certificates_does_not_load() {
    let ca = Ca::new("servers");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let (cert, _) = server_cert(&ca);
    let (_, other_key) = server_cert(&ca);
    let a = args(d, &(cert.clone(), other_key), None, ClientCert::Required);
    let e = ServerTls::from_args(&a)
        .err()
        .expect("a mismatched pair is refused");
    assert!(e.to_string().contains("tls.crt"), "{e}");
    let a = args(
        d,
        &(cert, "not a key".to_owned()),
        None,
        ClientCert::Required,
    );
    assert!(ServerTls::from_args(&a).is_err());
}

#[tokio::test]
async fn a_client_that_never_finishes_its_handshake_is_closed_at_the_header_clock() {
    let ca = Ca::new("servers");
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let a = args(d, &server_cert(&ca), None, ClientCert::Required);
    let addr = serve(ServerTls::from_args(&a).unwrap().unwrap()).await;
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Half a ClientHello's record header, then nothing.
    s.write_all(&[0x16, 0x03]).await.unwrap();
    let start = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(6), s.read(&mut buf))
        .await
        .expect("closed by the header clock")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(4),
        "{took:?}"
    );
}
