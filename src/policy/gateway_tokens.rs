//! A lane's token settings as `lanes.json` carries them: the contract's
//! `spec.cost` and `spec.tokens`, and the output cap of the level in force
//! (`capOutputTokens` of levels 1..=level; the lowest applies). Absent when
//! the contract and the level set nothing, so configs without them do not
//! change.

use lanes::{TokenCost, TokenLimits};

use crate::api::{DegradationPolicy, LaneContract, ObjectKey};

/// The contract's `spec.cost` (absent without one).
pub(super) fn cost(contract: &LaneContract) -> Option<TokenCost> {
    let c = contract.spec.cost.as_ref()?;
    Some(TokenCost {
        per_request: c.per_request.as_ref().map(|d| d.value()),
        per_input_token: c.per_input_token.as_ref().map(|d| d.value()),
        per_output_token: c.per_output_token.as_ref().map(|d| d.value()),
    })
}

/// The lowest `capOutputTokens` of levels 1..=`level` selecting the lane.
pub fn level_output_cap(
    policy: Option<&DegradationPolicy>,
    level: u32,
    contract: &LaneContract,
) -> Option<u64> {
    policy?
        .spec
        .levels
        .iter()
        .take(level as usize)
        .flat_map(|l| &l.actions.cap_output_tokens)
        .filter(|a| a.selects(contract.spec.priority, contract.name_str()))
        .map(|a| positive(a.tokens))
        .min()
}

/// The contract's limits with the level's output cap (absent when there is
/// none of them).
pub(super) fn tokens(
    contract: &LaneContract,
    policy: Option<&DegradationPolicy>,
    level: u32,
) -> Option<TokenLimits> {
    let spec = contract.spec.tokens.as_ref();
    let limits = TokenLimits {
        max_input_tokens: spec.and_then(|t| t.max_input_tokens).map(positive),
        max_output_tokens: spec.and_then(|t| t.max_output_tokens).map(positive),
        cap_output_tokens: level_output_cap(policy, level, contract),
    };
    (!limits.is_empty()).then_some(limits)
}

/// A token count from the CRD (validated >= 1; an object that bypassed
/// validation gets 1, the strictest).
fn positive(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(extra: serde_json::Value) -> LaneContract {
        let mut v = serde_json::json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "LaneContract",
            "metadata": {"name": "p1", "namespace": "ns"},
            "spec": {
                "profile": "pool", "priority": 1, "workUnitsPerRequest": "1",
                "expectedRequestsPerSecond": "1", "deadlineSeconds": 30,
                "queue": {"maxDepth": 1, "ttlSeconds": 1}, "retry": {"maxAttempts": 1},
                "routes": {"primary": ["r"]}
            }
        });
        for (k, x) in extra.as_object().unwrap() {
            v["spec"][k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn policy() -> DegradationPolicy {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "lanekeeper.dev/v1alpha1", "kind": "DegradationPolicy",
            "metadata": {"name": "ladder", "namespace": "ns"},
            "spec": {"profile": "pool", "levels": [
                {"name": "shorter", "enterWhen": {"overCapacity": true},
                 "actions": {"capOutputTokens": [{"priorityAtLeast": 1, "tokens": 256}]}},
                {"name": "shortest", "enterWhen": {"overCapacity": true},
                 "actions": {"capOutputTokens": [{"lanes": ["p1"], "tokens": 64},
                                                 {"lanes": ["other"], "tokens": 8}]}}
            ]}
        }))
        .unwrap()
    }

    #[test]
    fn nothing_set_is_left_out() {
        let l = lane(serde_json::json!({}));
        assert_eq!(cost(&l), None);
        assert_eq!(tokens(&l, Some(&policy()), 0), None);
    }

    #[test]
    fn the_contracts_cost_and_limits_reach_lanes_json() {
        let l = lane(serde_json::json!({
            "cost": {"perRequest": "0.5", "perOutputToken": "0.002"},
            "tokens": {"maxInputTokens": 8000, "maxOutputTokens": 1024}
        }));
        assert_eq!(
            serde_json::to_value(cost(&l)).unwrap(),
            serde_json::json!({"perRequest": 0.5, "perOutputToken": 0.002})
        );
        assert_eq!(
            serde_json::to_value(tokens(&l, None, 3)).unwrap(),
            serde_json::json!({"maxInputTokens": 8000, "maxOutputTokens": 1024})
        );
    }

    #[test]
    fn the_levels_output_cap_is_the_lowest_of_the_levels_in_force() {
        let l = lane(serde_json::json!({"tokens": {"maxOutputTokens": 1024}}));
        let p = policy();
        assert_eq!(level_output_cap(Some(&p), 0, &l), None);
        assert_eq!(level_output_cap(Some(&p), 1, &l), Some(256));
        assert_eq!(level_output_cap(Some(&p), 2, &l), Some(64));
        assert_eq!(level_output_cap(None, 2, &l), None);
        let t = tokens(&l, Some(&p), 1).unwrap();
        assert_eq!(
            (t.max_output_tokens, t.cap_output_tokens),
            (Some(1024), Some(256))
        );
        assert_eq!(t.output_limit(), Some(256));
        // A lane the actions do not select keeps only its own limit (level
        // 1 selects by priority; level 2 names p1, which this lane is).
        let p0 = lane(serde_json::json!({"priority": 0}));
        assert_eq!(tokens(&p0, Some(&p), 1), None);
        assert_eq!(level_output_cap(Some(&p), 2, &p0), Some(64));
    }
}
