//! `CapacityProfile.spec.concurrency` and `spec.longContext`: limits of the
//! whole pool the gateway holds next to the lanes' own (passed through in
//! `lanes.json`). Each gateway replica enforces its share (1/N, rounded
//! up).

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The pool's model slots.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConcurrencySpec {
    /// Most requests in flight to the pool at once, every lane's (those
    /// never shed included): the model servers' slots (for vLLM, the
    /// replicas' `--max-num-seqs` together). An arrival beyond it is
    /// refused (429, `concurrency.max`, Retry-After the expected wait for a
    /// slot); a waiting request waits for a slot.
    #[x_kube(validation = Rule::new("self >= 1").message("max must be >= 1"))]
    pub max: i64,
}

/// The pool's long-context limit.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct LongContextSpec {
    /// A request whose estimated input tokens are above this is long.
    #[x_kube(validation = Rule::new("self >= 1").message("aboveInputTokens must be >= 1"))]
    pub above_input_tokens: i64,
    /// Most long requests in flight at once: a burst of long prompts cannot
    /// fill the pool's KV cache, and short requests keep flowing. A long
    /// request beyond it is refused (429, `longContext.maxConcurrency`,
    /// Retry-After the expected wait for a place).
    #[x_kube(validation = Rule::new("self >= 1").message("maxConcurrency must be >= 1"))]
    pub max_concurrency: i64,
}
