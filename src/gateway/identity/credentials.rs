//! `--credentials FILE`: the identities a gateway accepts without a
//! cluster (local use, tests), in YAML, the same content as the contracts'
//! `clients` with the lanes each may use. API keys are given by their
//! SHA-256 hash, never the key. Parsed here (pure); `watch` re-reads it
//! when the file changes, the last good one kept when a new one is refused.

use lanes::{CertificateName, ClientIdentity, JwksSource, JwtIssuer, ServiceAccountName};
use serde::Deserialize;

use super::index::{Allowed, FileKey, Index, TenantFrom};
use super::jwks::jwks_url;

/// The file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Credentials {
    #[serde(default)]
    api_keys: Vec<FileApiKey>,
    #[serde(default)]
    service_accounts: Vec<FileServiceAccount>,
    #[serde(default)]
    jwt: Vec<FileJwt>,
    #[serde(default)]
    certificates: Vec<FileCertificate>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileApiKey {
    /// Hex SHA-256 of the key (`printf %s KEY | sha256sum`).
    sha256: String,
    tenant: String,
    lanes: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileServiceAccount {
    namespace: String,
    name: String,
    #[serde(default)]
    tenant: Option<String>,
    lanes: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileJwt {
    issuer: String,
    audience: String,
    /// `https://`, or `http://` to a loopback IP (`jwks::jwks_url`).
    jwks_url: String,
    #[serde(default)]
    subject: Option<String>,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    tenant_claim: Option<String>,
    lanes: Vec<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileCertificate {
    name: String,
    #[serde(default)]
    tenant: Option<String>,
    lanes: Vec<String>,
}

/// A lowercase or uppercase hex SHA-256.
fn parse_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl Credentials {
    /// Parses and checks the file's bytes.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Credentials, String> {
        let c: Credentials = serde_yaml::from_slice(bytes).map_err(|e| e.to_string())?;
        for (i, k) in c.api_keys.iter().enumerate() {
            if parse_sha256(&k.sha256).is_none() {
                return Err(format!(
                    "apiKeys[{i}].sha256 is not 64 hex digits (give the key's SHA-256, never the key)"
                ));
            }
            if k.tenant.trim().is_empty() {
                return Err(format!("apiKeys[{i}].tenant must not be empty"));
            }
        }
        for (i, j) in c.jwt.iter().enumerate() {
            if j.tenant.is_some() && j.tenant_claim.is_some() {
                return Err(format!("jwt[{i}]: give tenant or tenantClaim, not both"));
            }
            jwks_url(&j.jwks_url).map_err(|e| format!("jwt[{i}].jwksUrl: {e}"))?;
        }
        Ok(c)
    }

    /// Its identities into the index (lanes the config does not have are
    /// left out).
    pub(super) fn add_to(&self, ix: &mut Index) {
        for k in &self.api_keys {
            if let Some(sha256) = parse_sha256(&k.sha256) {
                ix.add_file_key(FileKey {
                    sha256,
                    tenant: k.tenant.clone(),
                    lanes: k.lanes.clone(),
                });
            }
        }
        let each = |ix: &mut Index, id: ClientIdentity, tenant: TenantFrom, lanes: &[String]| {
            for lane in lanes {
                let allowed = Allowed {
                    lane: lane.clone(),
                    tenant: tenant.clone(),
                };
                ix.add(&id, allowed);
            }
        };
        let fixed_or_own =
            |t: &Option<String>| t.clone().map_or(TenantFrom::Own, TenantFrom::Fixed);
        for s in &self.service_accounts {
            let id = ClientIdentity::ServiceAccount(ServiceAccountName {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
            });
            each(ix, id, fixed_or_own(&s.tenant), &s.lanes);
        }
        for j in &self.jwt {
            let id = ClientIdentity::Jwt(JwtIssuer {
                issuer: j.issuer.clone(),
                audience: j.audience.clone(),
                jwks: JwksSource::Url(j.jwks_url.clone()),
                subject: j.subject.clone(),
            });
            let tenant = match (&j.tenant, &j.tenant_claim) {
                (None, Some(c)) => TenantFrom::Claim(c.clone()),
                (t, _) => fixed_or_own(t),
            };
            each(ix, id, tenant, &j.lanes);
        }
        for c in &self.certificates {
            let id = ClientIdentity::Certificate(CertificateName {
                name: c.name.clone(),
            });
            each(ix, id, fixed_or_own(&c.tenant), &c.lanes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_HASH: &str = "4f1c0de2aa4f1c0de2aa4f1c0de2aa4f1c0de2aa4f1c0de2aa4f1c0de2aa0000";

    #[test]
    fn a_file_of_hashes_parses_and_a_raw_key_does_not() {
        let ok = format!(
            "apiKeys:\n  - sha256: {KEY_HASH}\n    tenant: team-a\n    lanes: [p1-agent-assist]\n\
             certificates:\n  - name: bot.example\n    lanes: [p1-agent-assist]\n"
        );
        let c = Credentials::parse(ok.as_bytes()).unwrap();
        assert_eq!(c.api_keys.len(), 1);
        assert_eq!(parse_sha256(KEY_HASH).unwrap()[0], 0x4f);
        for bad in [
            "apiKeys:\n  - sha256: sk-my-raw-key\n    tenant: a\n    lanes: [x]\n",
            "apiKeys:\n  - key: sk-my-raw-key\n    tenant: a\n    lanes: [x]\n",
            "passwords: []\n",
        ] {
            assert!(Credentials::parse(bad.as_bytes()).is_err(), "{bad}");
        }
        let bad_tenant =
            format!("apiKeys:\n  - sha256: {KEY_HASH}\n    tenant: ''\n    lanes: [x]\n");
        assert!(Credentials::parse(bad_tenant.as_bytes()).is_err());
    }

    #[test]
    fn a_jwks_url_must_be_https_or_http_to_a_loopback_ip() {
        let file = |url: &str| {
            format!(
                "jwt:\n  - {{issuer: https://idp.example, audience: lk, jwksUrl: \"{url}\", lanes: [x]}}\n"
            )
        };
        for ok in ["https://idp.example/jwks", "http://127.0.0.1:5556/keys"] {
            assert!(Credentials::parse(file(ok).as_bytes()).is_ok(), "{ok}");
        }
        for bad in ["http://idp.example/jwks", "http://localhost:5556/keys"] {
            let err = Credentials::parse(file(bad).as_bytes()).unwrap_err();
            assert!(
                err.starts_with("jwt[0].jwksUrl:") && err.contains("not https://"),
                "{err}"
            );
        }
    }
}
