//! Client certificates, pure: the names a verified certificate proves (the
//! TLS listener's [`PeerCertificate`]) against the index's certificate
//! names. The certificate itself was checked against the client CA by the
//! listener; a plain-HTTP connection carries no names.

use super::super::peer::PeerCertificate;
use super::index::{Grant, Index, grants};

/// The grants of every name of the certificate the index knows; the
/// matched name is the identity's own name (its tenant when the rule names
/// none).
pub(super) fn grants_of(index: &Index, cert: &PeerCertificate) -> Vec<Grant> {
    cert.names
        .iter()
        .filter_map(|name| {
            index
                .certificates
                .get(name)
                .map(|allowed| grants(allowed, name, &|_| None))
        })
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanes::{CertificateName, ClientIdentity};

    use super::super::index::{Allowed, TenantFrom};

    #[test]
    fn only_an_exact_name_of_the_certificate_grants() {
        let text = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/inc-47/lanes-420.json"
        ))
        .unwrap();
        let cfg = lanes::GatewayConfig::from_json(&text).unwrap();
        let mut ix = Index::build(&cfg.lanes);
        ix.add(
            &ClientIdentity::Certificate(CertificateName {
                name: "spiffe://c/ns/bot".into(),
            }),
            Allowed {
                lane: "p1-agent-assist".into(),
                tenant: TenantFrom::Own,
            },
        );
        let cert = |names: &[&str]| PeerCertificate {
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        let g = grants_of(&ix, &cert(&["bot.example", "spiffe://c/ns/bot"]));
        assert_eq!(g.len(), 1);
        assert_eq!(g[0].tenant, "spiffe://c/ns/bot");
        assert!(grants_of(&ix, &cert(&["spiffe://c/ns/bot2", "SPIFFE://c/ns/bot"])).is_empty());
        assert!(grants_of(&ix, &cert(&[])).is_empty());
    }
}
