//! API keys, pure: the SHA-256 hashes of the keys each watched Secret
//! holds (never the keys), and matching a presented key against them and
//! the credentials file's hashes in constant time.

use std::collections::{BTreeMap, HashMap};

use lanes::ApiKeySecret;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::index::{Grant, Index, grants};

/// The shortest value of a Secret taken as a key, in bytes: shorter ones
/// are guessable and ignored (with a warning naming the Secret's data key).
pub(super) const MIN_KEY_BYTES: usize = 16;

/// SHA-256 of a key.
pub(super) fn sha256(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

/// The key hashes of one Secret, by data key.
pub(super) type SecretKeys = Vec<(String, [u8; 32])>;

/// The hashes of a Secret's data values, and the data keys whose value is
/// too short to be a key.
pub(super) fn hash_secret(data: &BTreeMap<String, Vec<u8>>) -> (SecretKeys, Vec<String>) {
    let mut keys = Vec::new();
    let mut short = Vec::new();
    for (name, value) in data {
        let value = value.trim_ascii();
        if value.len() < MIN_KEY_BYTES {
            short.push(name.clone());
        } else {
            keys.push((name.clone(), sha256(value)));
        }
    }
    (keys, short)
}

/// The hashes of every watched Secret.
#[derive(Debug, Default)]
pub(super) struct KeyStore {
    secrets: HashMap<ApiKeySecret, SecretKeys>,
}

impl KeyStore {
    /// A Secret's keys now (replacing what it held).
    pub(super) fn put(&mut self, secret: ApiKeySecret, keys: SecretKeys) {
        self.secrets.insert(secret, keys);
    }

    /// A Secret deleted or no longer referenced: its keys stop working.
    pub(super) fn remove(&mut self, secret: &ApiKeySecret) {
        self.secrets.remove(secret);
    }

    /// The grants of a presented key: every Secret the index names and
    /// every file key, each hash compared in constant time (no early exit).
    pub(super) fn grants(&self, index: &Index, key: &[u8]) -> Vec<Grant> {
        let presented = sha256(key.trim_ascii());
        let mut out = Vec::new();
        for (secret, allowed) in &index.api_keys {
            let Some(keys) = self.secrets.get(secret) else {
                continue;
            };
            for (name, hash) in keys {
                if bool::from(hash.ct_eq(&presented)) {
                    out.extend(grants(allowed, name, &|_| None));
                }
            }
        }
        for fk in &index.file_keys {
            if bool::from(fk.sha256.ct_eq(&presented)) {
                out.extend(fk.lanes.iter().map(|lane| Grant {
                    lane: lane.clone(),
                    tenant: fk.tenant.clone(),
                }));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lanes::{ClientIdentity, ClientRule};

    fn index_for(secret: &ApiKeySecret, lanes: &[(&str, Option<&str>)]) -> Index {
        let text = std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/inc-47/lanes-420.json"
        ))
        .unwrap();
        let mut cfg = lanes::GatewayConfig::from_json(&text).unwrap();
        for (lane, tenant) in lanes {
            let l = cfg.lanes.iter_mut().find(|l| l.name == *lane).unwrap();
            l.clients.push(ClientRule {
                identity: ClientIdentity::ApiKeys(secret.clone()),
                tenant: tenant.map(str::to_owned),
                tenant_claim: None,
            });
        }
        Index::build(&cfg.lanes)
    }

    #[test]
    fn a_key_of_a_named_secret_grants_its_lanes_with_the_data_key_as_tenant() {
        let s = ApiKeySecret {
            namespace: "ns".into(),
            secret: "keys".into(),
        };
        let ix = index_for(
            &s,
            &[("p1-agent-assist", None), ("p3-shift-batch", Some("shift"))],
        );
        let data = BTreeMap::from([
            (
                "team-a".to_owned(),
                b"sk-team-a-0123456789abcdef\n".to_vec(),
            ),
            ("weak".to_owned(), b"1234".to_vec()),
        ]);
        let (keys, short) = hash_secret(&data);
        assert_eq!(short, vec!["weak".to_owned()]);
        let mut store = KeyStore::default();
        assert!(store.grants(&ix, b"sk-team-a-0123456789abcdef").is_empty());
        store.put(s.clone(), keys);
        let g = store.grants(&ix, b"sk-team-a-0123456789abcdef");
        let got: Vec<(&str, &str)> = g
            .iter()
            .map(|g| (g.lane.as_str(), g.tenant.as_str()))
            .collect();
        assert_eq!(
            got.len(),
            2,
            "both lanes: {got:?} (order follows the index)"
        );
        assert!(got.contains(&("p1-agent-assist", "team-a")));
        assert!(got.contains(&("p3-shift-batch", "shift")));
        assert!(
            store.grants(&ix, b"1234").is_empty(),
            "a short value is no key"
        );
        assert!(store.grants(&ix, b"sk-team-a-0123456789abcdeF").is_empty());
        store.remove(&s);
        assert!(store.grants(&ix, b"sk-team-a-0123456789abcdef").is_empty());
    }

    #[test]
    fn a_secret_no_lane_names_grants_nothing() {
        let named = ApiKeySecret {
            namespace: "ns".into(),
            secret: "keys".into(),
        };
        let other = ApiKeySecret {
            namespace: "ns".into(),
            secret: "other".into(),
        };
        let ix = index_for(&named, &[("p1-agent-assist", None)]);
        let mut store = KeyStore::default();
        store.put(
            other,
            vec![("x".into(), sha256(b"sk-other-0123456789abcdef"))],
        );
        assert!(store.grants(&ix, b"sk-other-0123456789abcdef").is_empty());
    }
}
