//! ServiceAccount tokens at the gateway, on real sockets: `lanekeeper
//! gateway` with a kubeconfig for the API double, which issues tokens,
//! serves the cluster's ServiceAccount keys (`/openid/v1/jwks`) and answers
//! TokenReviews, in front of a fake model.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::StreamExt;
use serde_json::{Value, json};

use crate::gateway::{
    ConfigFile, Proc, chat, client, config_file, inc47, lane_mut, model, ready, spawn_with_env,
};
use crate::scratch::ScratchFile;
use crate::support::apiserver::ApiServer;

pub(crate) const LANE: &str = "p1-agent-assist";
const NS: &str = "ai-platform";
const SA: &str = "agent";

/// A gateway (and what it needs kept) with the API double as its cluster.
pub(crate) struct Rig {
    pub(crate) api: ApiServer,
    pub(crate) gw: Proc,
    _model: Proc,
    _config: ConfigFile,
    _kubeconfig: ScratchFile,
}

/// The P1 lane admits the ServiceAccount `ai-platform/agent`.
async fn rig(test: &str) -> Rig {
    let clients = json!([{"serviceAccount": {"namespace": NS, "name": SA}, "tenant": "agents"}]);
    rig_with(test, ApiServer::start().await, clients).await
}

/// A gateway whose P1 lane (`p1-agent-assist`) admits `clients`, with
/// `api` as its cluster, in front of a fake model; ready.
pub(crate) async fn rig_with(test: &str, api: ApiServer, clients: Value) -> Rig {
    let kubeconfig = ScratchFile::new(&format!("gw-{test}"), "kubeconfig", api.kubeconfig());
    let mut cfg = inc47();
    lane_mut(&mut cfg, LANE)["clients"] = clients;
    let config = config_file(test, &cfg);
    let model = model(&[]);
    let path = config.display().to_string();
    let mut args = vec![
        "gateway".to_owned(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--metrics-addr".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--config".to_owned(),
        path,
    ];
    for r in ["agent-large", "extract-small", "batch-medium", "eval-large"] {
        args.push("--route".to_owned());
        args.push(format!("{r}=http://{}", model.addr));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let gw = spawn_with_env(
        env!("CARGO_BIN_EXE_lanekeeper"),
        &args,
        &[("KUBECONFIG", &kubeconfig)],
    );
    ready(&client(), &gw).await;
    Rig {
        api,
        gw,
        _model: model,
        _config: config,
        _kubeconfig: kubeconfig,
    }
}

impl Rig {
    /// The status of a request on the lane with this bearer token.
    pub(crate) async fn status(&self, c: &reqwest::Client, token: &str) -> u16 {
        chat(c, &self.gw, Some(LANE))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    }

    /// The TokenReviews the API server was asked for.
    fn reviews(&self) -> usize {
        self.api
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/tokenreviews"))
            .count()
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token's `exp`.
fn exp_of(token: &str) -> u64 {
    let payload = token.split('.').nth(1).unwrap();
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    claims["exp"].as_u64().unwrap()
}

/// A made-up token that looks like one of the cluster's: the listed
/// ServiceAccount, the gateway's audience, a future `exp`, the cluster
/// key's id, and a signature of random bytes; each one different.
fn made_up(kid: &str, n: usize) -> String {
    let e = |v: &Value| URL_SAFE_NO_PAD.encode(v.to_string());
    let header = json!({"alg": "EdDSA", "kid": kid});
    let claims = json!({
        "iss": "https://kubernetes.default.svc.cluster.local",
        "sub": format!("system:serviceaccount:{NS}:{SA}"),
        "aud": ["lanekeeper"],
        "exp": unix_now() + 3600,
        "jti": n,
    });
    let sig = URL_SAFE_NO_PAD.encode([(n % 251) as u8; 64]);
    format!("{}.{}.{sig}", e(&header), e(&claims))
}

/// A stream of made-up tokens from one client spends no TokenReview: each
/// is refused (401) by its signature, checked against the cluster's keys,
/// so the review budget (100 a second, shared) is left to the tokens the
/// cluster issued, and a valid token is served on its first use in the
/// middle of the flood.
#[tokio::test]
async fn made_up_service_account_tokens_cannot_spend_the_token_reviews_of_valid_ones() {
    let rig = rig("sa-flood").await;
    let c = client();
    let kid = rig.api.service_account_key_id();
    let flood = |from: usize| {
        let (rig, c, kid) = (&rig, &c, kid.clone());
        futures::stream::iter(from..from + 200)
            .map(move |n| {
                let token = made_up(&kid, n);
                async move { rig.status(c, &token).await }
            })
            .buffer_unordered(16)
            .collect::<Vec<u16>>()
    };
    let first = flood(0).await;
    assert!(first.iter().all(|s| *s == 401), "{first:?}");
    let valid = rig
        .api
        .service_account_token(NS, SA, &["lanekeeper"], Duration::from_secs(600));
    let (more, served) = tokio::join!(flood(1000), rig.status(&c, &valid));
    assert_eq!(served, 200, "the valid token on its first use");
    assert!(more.iter().all(|s| *s == 401), "{more:?}");
    assert_eq!(rig.reviews(), 1, "only the valid token was reviewed");
    // A token of the cluster for another audience is refused unasked too.
    let other = rig
        .api
        .service_account_token(NS, SA, &["vault"], Duration::from_secs(600));
    assert_eq!(rig.status(&c, &other).await, 401);
    assert_eq!(rig.reviews(), 1);
}

/// An answer of the API server is reused for 10 s at most, and never past
/// the token's own `exp`: a token that expired is reviewed again (and
/// refused), not served from the cache.
#[tokio::test]
async fn a_reviewed_token_is_not_served_from_the_cache_past_its_exp() {
    let rig = rig("sa-exp").await;
    let c = client();
    let token = rig
        .api
        .service_account_token(NS, SA, &["lanekeeper"], Duration::from_secs(2));
    let exp = exp_of(&token);
    assert_eq!(rig.status(&c, &token).await, 200);
    assert_eq!(rig.status(&c, &token).await, 200, "from the cache");
    assert_eq!(rig.reviews(), 1);
    // Past `exp` (and within the 10 s an answer is otherwise reused).
    while unix_now() <= exp {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(rig.status(&c, &token).await, 401, "expired");
    assert_eq!(rig.reviews(), 2, "asked again, not answered from the cache");
}
