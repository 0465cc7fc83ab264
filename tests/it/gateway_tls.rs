//! The gateway's TLS, the real binary on real sockets, with test CAs made
//! here (rcgen): clients reach it over TLS, a rotated certificate is served
//! without a restart, a bad rotated pair keeps the one in force; an
//! `https://` route is verified against `--upstream-ca` and gets the route's
//! own credential, re-read when its file changes and never logged.

use std::convert::Infallible;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::gateway_conn::{OPEN_LANE, Proc, gateway, model, ready, write_atomically};
use crate::scratch::Scratch;

struct Ca(CertifiedIssuer<'static, KeyPair>);

impl Ca {
    fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        Ca(CertifiedIssuer::self_signed(p, KeyPair::generate().unwrap()).unwrap())
    }

    fn pem(&self) -> String {
        self.0.pem()
    }

    /// A server certificate for 127.0.0.1: (PEM certificate, PEM key).
    fn server(&self) -> (String, String) {
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, "gateway");
        p.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().unwrap();
        (
            p.signed_by(&key, &self.0).unwrap().pem(),
            key.serialize_pem(),
        )
    }
}

/// A fresh client (no pooled connection) trusting only `ca`.
fn client(ca: &Ca) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

/// A chat request on `lane` over https: its status, or the error.
async fn chat(c: &reqwest::Client, gw: &Proc, lane: &str) -> Result<u16, String> {
    c.post(format!("https://{}/v1/chat/completions", gw.addr))
        .header("x-lanekeeper-lane", lane)
        .body(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// Installs a certificate and key the way a Secret volume is updated: each
/// file replaced whole.
fn install(dir: &Path, pair: &(String, String)) {
    write_atomically(&dir.join("tls.key"), pair.1.as_bytes());
    write_atomically(&dir.join("tls.crt"), pair.0.as_bytes());
}

async fn until_ok(c: &reqwest::Client, gw: &Proc, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while chat(c, gw, OPEN_LANE).await != Ok(200) {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn clients_reach_it_over_tls_and_a_rotated_certificate_is_served_without_restart() {
    let dir = Scratch::new("tls-rotate");
    let (first, second, third) = (Ca::new("first"), Ca::new("second"), Ca::new("third"));
    let a = first.server();
    install(&dir, &a);
    let m = model(&dir);
    let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
    let flags = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
    ];
    let gw = gateway(&dir, &format!("http://{}", m.addr), &flags, &[]);
    ready(&gw).await;

    assert_eq!(chat(&client(&first), &gw, OPEN_LANE).await, Ok(200));
    assert!(
        chat(&client(&second), &gw, OPEN_LANE).await.is_err(),
        "not yet rotated"
    );
    let plain = reqwest::get(format!("http://{}/v1/models", gw.addr)).await;
    assert!(plain.is_err(), "plain HTTP on the TLS port: {plain:?}");

    // Rotation (as cert-manager does): the new pair is served, no restart.
    let b = second.server();
    install(&dir, &b);
    until_ok(
        &client(&second),
        &gw,
        "the rotated certificate was never served",
    )
    .await;
    assert!(chat(&client(&first), &gw, OPEN_LANE).await.is_err());

    // A bad new pair (a key that is not the certificate's, then garbage)
    // keeps the one in force.
    let c = third.server();
    install(&dir, &(c.0.clone(), a.1.clone()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(chat(&client(&second), &gw, OPEN_LANE).await, Ok(200));
    assert!(chat(&client(&third), &gw, OPEN_LANE).await.is_err());
    install(&dir, &("garbage".to_owned(), "garbage".to_owned()));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(chat(&client(&second), &gw, OPEN_LANE).await, Ok(200));
    let log = std::fs::read_to_string(&gw.stderr).unwrap();
    assert!(log.contains("TLS certificate reloaded"), "{log}");
    assert!(
        log.contains("do not load; keeping the certificate in force"),
        "{log}"
    );
    // And a good one after the bad ones is taken.
    install(&dir, &c);
    until_ok(
        &client(&third),
        &gw,
        "a good pair after a bad one was never served",
    )
    .await;
}

/// A TLS model server stand-in: answers every request with the
/// `authorization` header it got; the last one is kept in `seen`.
async fn tls_upstream(ca: &Ca, seen: Arc<Mutex<Vec<String>>>) -> String {
    let (cert, key) = ca.server();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = tcp.accept().await {
            let (acceptor, seen) = (acceptor.clone(), seen.clone());
            tokio::spawn(async move {
                let Ok(s) = acceptor.accept(s).await else {
                    return;
                };
                let svc = hyper::service::service_fn(move |r: hyper::Request<Incoming>| {
                    let auth = r
                        .headers()
                        .get("authorization")
                        .map_or("none".to_owned(), |v| v.to_str().unwrap().to_owned());
                    seen.lock().unwrap().push(auth.clone());
                    async move {
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(auth))))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(s);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
    format!("https://{addr}")
}

#[tokio::test]
async fn an_https_route_is_verified_against_the_upstream_ca_and_gets_its_own_credential() {
    let dir = Scratch::new("tls-upstream");
    let ca = Ca::new("pool");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let upstream = tls_upstream(&ca, seen.clone()).await;
    let ca_file = dir.join("pool-ca.crt");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let token = dir.join("agent-large.token");
    std::fs::write(&token, "route-secret-1\n").unwrap();
    let flags = [
        "--upstream-ca".to_owned(),
        ca_file.display().to_string(),
        "--route-credential".to_owned(),
        format!("agent-large={}", token.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let gw = gateway(&dir, &upstream, &flags, &[]);
    ready(&gw).await;
    let c = reqwest::Client::new();
    let send = |lane: &'static str| {
        c.post(format!("http://{}/v1/chat/completions", gw.addr))
            .header("x-lanekeeper-lane", lane)
            .header("authorization", "Bearer the-clients-own-key")
            .body(r#"{"model": "m", "messages": []}"#)
            .send()
    };
    let r = send(OPEN_LANE).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "Bearer route-secret-1");

    // The Secret rotates: the new token within a few reloads.
    write_atomically(&token, b"route-secret-2\n");
    let deadline = Instant::now() + Duration::from_secs(10);
    while send(OPEN_LANE).await.unwrap().text().await.unwrap() != "Bearer route-secret-2" {
        assert!(
            Instant::now() < deadline,
            "the rotated credential was never sent"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Another route (P2's) never gets this route's credential.
    let other = send("p2-email-extract")
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!other.contains("route-secret"), "{other}");
    let log = std::fs::read_to_string(&gw.stderr).unwrap();
    assert!(
        !log.contains("route-secret"),
        "a credential in the log: {log}"
    );

    // Without --upstream-ca the pool's certificate is not trusted: 502.
    let reached = seen.lock().unwrap().len();
    let dir2 = Scratch::new("tls-upstream-untrusted");
    let untrusted = gateway(&dir2, &upstream, &[], &[]);
    ready(&untrusted).await;
    let r = c
        .post(format!("http://{}/v1/chat/completions", untrusted.addr))
        .header("x-lanekeeper-lane", OPEN_LANE)
        .body(r#"{"model": "m", "messages": []}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    assert_eq!(
        seen.lock().unwrap().len(),
        reached,
        "nothing reached the pool"
    );
}
