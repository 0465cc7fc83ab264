//! The index, pure: for each identity the contracts (and the credentials
//! file) name, the lanes it may use and the tenant it is counted as in
//! each; and the choice of a request's lane among an identity's lanes.

use std::collections::{BTreeSet, HashMap};

use lanes::{ApiKeySecret, ClientIdentity, JwtIssuer, LaneConfig, ServiceAccountName};

/// Where an identity's tenant comes from in one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TenantFrom {
    /// Named by the rule.
    Fixed(String),
    /// A JWT claim's value.
    Claim(String),
    /// The identity's own name.
    Own,
}

impl TenantFrom {
    fn of(tenant: Option<&String>, claim: Option<&String>) -> TenantFrom {
        match (tenant, claim) {
            (Some(t), _) => TenantFrom::Fixed(t.clone()),
            (None, Some(c)) => TenantFrom::Claim(c.clone()),
            (None, None) => TenantFrom::Own,
        }
    }
}

/// One lane an identity may use, and how its tenant is found there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Allowed {
    pub(super) lane: String,
    pub(super) tenant: TenantFrom,
}

/// A lane the caller may use, with the tenant it is counted as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Grant {
    pub(super) lane: String,
    pub(super) tenant: String,
}

/// A hashed key of the credentials file.
#[derive(Clone, Debug)]
pub(super) struct FileKey {
    pub(super) sha256: [u8; 32],
    pub(super) tenant: String,
    pub(super) lanes: Vec<String>,
}

/// Who may use which lane.
#[derive(Debug, Default)]
pub(super) struct Index {
    pub(super) api_keys: HashMap<ApiKeySecret, Vec<Allowed>>,
    pub(super) file_keys: Vec<FileKey>,
    pub(super) service_accounts: HashMap<ServiceAccountName, Vec<Allowed>>,
    pub(super) jwt: Vec<(JwtIssuer, Allowed)>,
    pub(super) certificates: HashMap<String, Vec<Allowed>>,
    /// The lanes of the config (a file's rule for another lane is kept out).
    lanes: BTreeSet<String>,
}

impl Index {
    /// The index of a config's lanes (the credentials file is added with
    /// `Credentials::add_to`).
    pub(super) fn build(lanes: &[LaneConfig]) -> Index {
        let mut ix = Index {
            lanes: lanes.iter().map(|l| l.name.clone()).collect(),
            ..Index::default()
        };
        for l in lanes {
            for r in &l.clients {
                let allowed = Allowed {
                    lane: l.name.clone(),
                    tenant: TenantFrom::of(r.tenant.as_ref(), r.tenant_claim.as_ref()),
                };
                ix.add(&r.identity, allowed);
            }
        }
        ix
    }

    /// One rule's identity allowed into one lane (of the config).
    pub(super) fn add(&mut self, identity: &ClientIdentity, allowed: Allowed) {
        if !self.lanes.contains(&allowed.lane) {
            return;
        }
        match identity {
            ClientIdentity::ApiKeys(s) => self.api_keys.entry(s.clone()).or_default().push(allowed),
            ClientIdentity::ServiceAccount(s) => self
                .service_accounts
                .entry(s.clone())
                .or_default()
                .push(allowed),
            ClientIdentity::Jwt(j) => self.jwt.push((j.clone(), allowed)),
            ClientIdentity::Certificate(c) => self
                .certificates
                .entry(c.name.clone())
                .or_default()
                .push(allowed),
        }
    }

    /// A file key allowed into the lanes of the config it names.
    pub(super) fn add_file_key(&mut self, mut key: FileKey) {
        key.lanes.retain(|l| self.lanes.contains(l));
        if !key.lanes.is_empty() {
            self.file_keys.push(key);
        }
    }

    /// The Secrets of API keys the index names (the ones to watch).
    pub(super) fn secrets(&self) -> BTreeSet<ApiKeySecret> {
        self.api_keys.keys().cloned().collect()
    }

    /// Whether no identity may use any lane.
    pub(super) fn is_empty(&self) -> bool {
        self.api_keys.is_empty()
            && self.file_keys.is_empty()
            && self.service_accounts.is_empty()
            && self.jwt.is_empty()
            && self.certificates.is_empty()
    }

    /// Whether a JWT with this (unverified) issuer could be accepted.
    pub(super) fn has_issuer(&self, iss: &str) -> bool {
        self.jwt.iter().any(|(j, _)| j.issuer == iss)
    }
}

/// Grants from `allowed` for an identity whose own name is `own`; a claim
/// is looked up with `claim` (None for kinds without claims: such a rule
/// grants nothing).
pub(super) fn grants<'a>(
    allowed: impl IntoIterator<Item = &'a Allowed>,
    own: &str,
    claim: &dyn Fn(&str) -> Option<String>,
) -> Vec<Grant> {
    allowed
        .into_iter()
        .filter_map(|a| {
            let tenant = match &a.tenant {
                TenantFrom::Fixed(t) => t.clone(),
                TenantFrom::Own => own.to_owned(),
                TenantFrom::Claim(c) => claim(c)?,
            };
            if tenant.is_empty() {
                return None;
            }
            Some(Grant {
                lane: a.lane.clone(),
                tenant,
            })
        })
        .collect()
}

/// Why an authenticated caller gets no lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum NoLane {
    /// The lane asked for is not one of the identity's (or does not
    /// exist: the two are not told apart).
    NotAllowed,
    /// No lane was named and the identity has several.
    NotNamed,
}

/// The lane of a request: the one asked for when the identity may use it;
/// without a lane header, the identity's one lane.
pub(super) fn choose(grants: Vec<Grant>, asked: Option<&str>) -> Result<Grant, NoLane> {
    match asked {
        Some(lane) => grants
            .into_iter()
            .find(|g| g.lane == lane)
            .ok_or(NoLane::NotAllowed),
        None => {
            let distinct: BTreeSet<&str> = grants.iter().map(|g| g.lane.as_str()).collect();
            match distinct.len() {
                0 => Err(NoLane::NotAllowed),
                1 => Ok(grants.into_iter().next().expect("one grant")),
                _ => Err(NoLane::NotNamed),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(lane: &str, tenant: &str) -> Grant {
        Grant {
            lane: lane.into(),
            tenant: tenant.into(),
        }
    }

    #[test]
    fn the_lane_header_chooses_among_the_identitys_lanes_only() {
        let two = vec![grant("p1", "a"), grant("p3", "b")];
        assert_eq!(choose(two.clone(), Some("p3")), Ok(grant("p3", "b")));
        assert_eq!(choose(two.clone(), Some("p0")), Err(NoLane::NotAllowed));
        assert_eq!(choose(two, None), Err(NoLane::NotNamed));
        assert_eq!(choose(vec![grant("p1", "a")], None), Ok(grant("p1", "a")));
        assert_eq!(choose(Vec::new(), None), Err(NoLane::NotAllowed));
        assert_eq!(choose(Vec::new(), Some("p1")), Err(NoLane::NotAllowed));
    }

    #[test]
    fn the_tenant_is_the_rules_the_claims_or_the_identitys_own_name() {
        let allowed = [
            Allowed {
                lane: "a".into(),
                tenant: TenantFrom::Fixed("team".into()),
            },
            Allowed {
                lane: "b".into(),
                tenant: TenantFrom::Own,
            },
            Allowed {
                lane: "c".into(),
                tenant: TenantFrom::Claim("org".into()),
            },
            Allowed {
                lane: "d".into(),
                tenant: TenantFrom::Claim("missing".into()),
            },
        ];
        let claim = |c: &str| (c == "org").then(|| "acme".to_owned());
        assert_eq!(
            grants(&allowed, "me", &claim),
            vec![grant("a", "team"), grant("b", "me"), grant("c", "acme")],
            "a missing claim grants nothing"
        );
    }
}
