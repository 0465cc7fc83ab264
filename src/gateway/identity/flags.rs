//! The flags of who may use a lane (flattened into `lanekeeper gateway`'s).

use std::path::PathBuf;

/// How the gateway learns who is calling.
#[derive(clap::Args, Debug, Clone)]
pub struct IdentityArgs {
    /// Take the lane and the tenant from the request's headers, with no
    /// credential: anyone who can reach the gateway may claim any lane
    /// (P0 included) and any tenant. Only for a gateway behind a proxy that
    /// has already authenticated the caller and sets these headers itself.
    #[arg(long, env = "LANEKEEPER_GATEWAY_TRUST_LANE_HEADER")]
    pub trust_lane_header: bool,
    /// A header that carries an API key, besides `Authorization: Bearer`.
    #[arg(long, env = "LANEKEEPER_GATEWAY_API_KEY_HEADER")]
    pub api_key_header: Option<String>,
    /// The audience a ServiceAccount token must be issued for (checked with
    /// a TokenReview): callers request it with
    /// `kubectl create token SA --audience <this>` or a projected token.
    #[arg(
        long,
        env = "LANEKEEPER_GATEWAY_TOKEN_AUDIENCE",
        default_value = "lanekeeper"
    )]
    pub token_audience: String,
    /// A YAML file of identities allowed without a cluster (API-key hashes,
    /// JWT issuers, certificate names, ServiceAccounts, each with its tenant
    /// and lanes), re-read when it changes.
    #[arg(long, env = "LANEKEEPER_GATEWAY_CREDENTIALS")]
    pub credentials: Option<PathBuf>,
}
