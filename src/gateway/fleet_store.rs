//! The shared store of the fleet's lane budgets (Valkey or Redis, one
//! protocol): leases of each lane's fleet bucket taken and given back with
//! one atomic server-side script, against the store's clock so that the
//! replicas' clocks do not matter. The arithmetic is
//! [`lanes::fleet_lease::FleetBucket`]'s; `tests/it/fleet_store_redis.rs`
//! checks the script against it on a real server.
//!
//! Every call has a deadline of a few milliseconds: a slow or absent store
//! is an error the caller turns into the replica's local share, never a
//! request held up or failed. A lease call keeps waiting for its answer
//! past the deadline, apart from the caller ([`Answer::Late`]): the script
//! ran on the store, so a lease granted late must be used or given back,
//! never lost (`fleet_late`).

use std::time::Duration;

use lanes::fleet_lease::FleetLimits;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// The lease script: `KEYS[1]` the lane's bucket (a hash of `tokens` and
/// `updated`), `ARGV` rate, burst, `take` or `give`, a token count and the
/// key's expiry in milliseconds. Returns the tokens granted (0 for `give`).
///
/// What it reads back is not trusted: a NaN or negative `tokens` counts as
/// an empty bucket, and a NaN `updated` or one in the future (the store's
/// clock stepped back, or a failover to a host behind it) as now, so a
/// damaged key neither opens the lane nor starves it past one refill.
const LEASE_SCRIPT: &str = r"
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local n = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'updated')
local tokens = tonumber(b[1])
local updated = tonumber(b[2])
if tokens == nil or updated == nil then
  tokens = burst
  updated = now
end
if tokens ~= tokens or tokens < 0 then tokens = 0 end
if updated ~= updated or updated > now then updated = now end
local elapsed = now - updated
if elapsed < 0 then elapsed = 0 end
tokens = math.min(burst, tokens + elapsed * rate)
if updated < now then updated = now end
local granted = 0
if ARGV[3] == 'take' then
  granted = math.max(0, math.min(n, math.floor(tokens)))
  tokens = tokens - granted
  redis.call('HINCRBY', KEYS[1], 'taken', granted)
else
  tokens = math.min(burst, tokens + n)
  redis.call('HINCRBY', KEYS[1], 'returned', n)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens),
  'updated', string.format('%.17g', updated))
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return granted
";

/// A bucket key lives at least this long after its last lease.
const MIN_KEY_SECONDS: f64 = 60.0;
/// And at most this long (a paused lane's bucket refills never).
const MAX_KEY_SECONDS: f64 = 86_400.0;

/// How long a call's answer is still waited for after its deadline (a late
/// lease is then used or given back); the connection's own response
/// timeout.
const LATE_ANSWER: Duration = Duration::from_secs(5);

/// A lease call's answer: in time, or still to come (the caller went on
/// without it, on the local share).
pub(super) enum Answer<T> {
    /// Within the call's deadline.
    InTime(Result<T, FleetStoreError>),
    /// Past it: the call goes on; its answer comes through the handle.
    Late(tokio::task::JoinHandle<Result<T, FleetStoreError>>),
}

/// What a lease call does to its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum LeaseOp {
    /// Takes up to n tokens.
    Take,
    /// Gives n unused tokens back.
    Give,
}

impl LeaseOp {
    fn as_str(self) -> &'static str {
        match self {
            LeaseOp::Take => "take",
            LeaseOp::Give => "give",
        }
    }
}

/// Runs `call` apart from the caller and waits for it up to `deadline`.
async fn within<T: Send + 'static>(
    deadline: Duration,
    call: impl Future<Output = Result<T, FleetStoreError>> + Send + 'static,
) -> Answer<T> {
    let mut task = tokio::spawn(call);
    match tokio::time::timeout(deadline, &mut task).await {
        Ok(joined) => {
            Answer::InTime(joined.unwrap_or_else(|e| Err(FleetStoreError::Lost(e.to_string()))))
        }
        Err(_) => Answer::Late(task),
    }
}

/// Why a call to the store did not answer.
#[derive(Debug, thiserror::Error)]
pub enum FleetStoreError {
    /// The store did not answer within the call's deadline.
    #[error("the shared store did not answer within {0:?}")]
    Timeout(Duration),
    /// The store answered with an error, or the connection failed.
    #[error("the shared store: {0}")]
    Store(#[from] redis::RedisError),
    /// The call's task ended without an answer.
    #[error("the shared store's call was lost: {0}")]
    Lost(String),
}

/// A connection to the shared store, for one gateway fleet.
#[derive(Clone)]
pub struct FleetStore {
    pub(super) conn: ConnectionManager,
    script: redis::Script,
    pub(super) prefix: String,
    pub(super) deadline: Duration,
}

impl FleetStore {
    /// Connects to `url` (`redis://`, `rediss://` for TLS, with a password in
    /// the URL when the store needs one). Keys start with `prefix` (one per
    /// fleet: its namespace and profile); every call gets `deadline`.
    pub async fn connect(
        url: &str,
        prefix: &str,
        deadline: Duration,
    ) -> Result<FleetStore, FleetStoreError> {
        FleetStore::connect_with(url, None, None, prefix, deadline).await
    }

    /// As [`FleetStore::connect`], with the store's password given apart
    /// from the URL (from a Secret), in place of one in the URL, and for
    /// `rediss://` the PEM CA bundle the store's certificate must chain to
    /// (only these roots; the system's without one).
    pub async fn connect_with(
        url: &str,
        password: Option<&str>,
        root_ca: Option<&[u8]>,
        prefix: &str,
        deadline: Duration,
    ) -> Result<FleetStore, FleetStoreError> {
        let mut info = redis::IntoConnectionInfo::into_connection_info(url)?;
        if let Some(pw) = password {
            let settings = info.redis_settings().clone().set_password(pw);
            info = info.set_redis_settings(settings);
        }
        let client = match root_ca {
            Some(ca) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.to_vec()),
                },
            )?,
            None => redis::Client::open(info)?,
        };
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(deadline.max(Duration::from_millis(100))))
            .set_response_timeout(Some(deadline.max(LATE_ANSWER)))
            .set_number_of_retries(1);
        let conn = tokio::time::timeout(
            deadline.max(Duration::from_secs(1)),
            ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| FleetStoreError::Timeout(deadline))??;
        Ok(FleetStore {
            conn,
            script: redis::Script::new(LEASE_SCRIPT),
            prefix: prefix.to_string(),
            deadline,
        })
    }

    /// Takes up to `want` tokens of `lane`'s fleet bucket.
    pub async fn take(
        &self,
        lane: &str,
        limits: FleetLimits,
        want: u64,
    ) -> Result<u64, FleetStoreError> {
        let key = self.bucket_key(lane);
        in_time(
            self.lease(key, limits, LeaseOp::Take, want).await,
            self.deadline,
        )
    }

    /// Gives `unused` tokens of an ended lease back to `lane`'s bucket.
    pub async fn give_back(
        &self,
        lane: &str,
        limits: FleetLimits,
        unused: u64,
    ) -> Result<(), FleetStoreError> {
        if unused == 0 {
            return Ok(());
        }
        let key = self.bucket_key(lane);
        in_time(
            self.lease(key, limits, LeaseOp::Give, unused).await,
            self.deadline,
        )
        .map(|_| ())
    }

    /// Whether the store answers within the deadline (a probe); it loads
    /// the lease script on the way, so that the first lease after a
    /// (re)start of the store does not pay for the load.
    pub async fn ping(&self) -> Result<(), FleetStoreError> {
        let mut conn = self.conn.clone();
        let _: String = tokio::time::timeout(
            self.deadline,
            self.script.prepare_invoke().load_async(&mut conn),
        )
        .await
        .map_err(|_| FleetStoreError::Timeout(self.deadline))??;
        Ok(())
    }

    /// One lease call on the bucket at `key` (a full key, see
    /// [`FleetStore::bucket_key`], [`FleetStore::spare_key`]).
    pub(super) async fn lease(
        &self,
        key: String,
        limits: FleetLimits,
        op: LeaseOp,
        n: u64,
    ) -> Answer<u64> {
        let mut conn = self.conn.clone();
        let script = self.script.clone();
        let call = async move {
            let mut invocation = script.key(key);
            invocation
                .arg(limits.rate.max(0.0))
                .arg(limits.burst.max(0.0))
                .arg(op.as_str())
                .arg(n)
                .arg(key_millis(limits));
            let got: u64 = invocation.invoke_async(&mut conn).await?;
            Ok(got)
        };
        within(self.deadline, call).await
    }

    /// The key of lane `lane`'s bucket (`lane`: the profile, `/`, the
    /// lane's name).
    pub(super) fn bucket_key(&self, lane: &str) -> String {
        format!("{}:lane:{lane}:bucket", self.prefix)
    }

    /// The key of the pool's spare-capacity bucket of `profile`.
    pub(super) fn spare_key(&self, profile: &str) -> String {
        format!("{}:pool:{profile}:spare", self.prefix)
    }
}

/// An answer in time, or a timeout (its late answer is not waited for).
fn in_time<T>(a: Answer<T>, deadline: Duration) -> Result<T, FleetStoreError> {
    match a {
        Answer::InTime(r) => r,
        Answer::Late(_) => Err(FleetStoreError::Timeout(deadline)),
    }
}

/// How long a bucket's key outlives its last lease: long enough that an
/// expired key (read back as a full bucket) could have refilled anyway.
fn key_millis(limits: FleetLimits) -> u64 {
    let refill = if limits.rate > 0.0 {
        2.0 * limits.burst / limits.rate
    } else {
        MAX_KEY_SECONDS
    };
    (refill.clamp(MIN_KEY_SECONDS, MAX_KEY_SECONDS) * 1_000.0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_outlives_the_time_its_bucket_takes_to_refill() {
        let l = |rate, burst| FleetLimits { rate, burst };
        assert_eq!(key_millis(l(50.0, 10.0)), 60_000);
        assert_eq!(key_millis(l(0.01, 10.0)), 2_000_000);
        assert_eq!(key_millis(l(0.0, 10.0)), 86_400_000);
        assert_eq!(key_millis(l(1e-9, 1e9)), 86_400_000);
    }
}
