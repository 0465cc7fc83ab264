//! Which replicas share the fleet's budgets through the store right now:
//! each shared replica notes itself in the profile's replica hash once a
//! second, with an expiry on the store's clock, and reads how many are
//! noted. A replica cut off from the store stops noting itself and, within
//! [`HEARTBEAT_TTL`], is no longer counted: it enforces its 1/N share on
//! its own, so the shared buckets run at the rate of the replicas counted
//! (see `fleet_round`), and the fleet as a whole stays at its rate.

use std::sync::LazyLock;
use std::time::Duration;

use super::fleet_store::{FleetStore, FleetStoreError};

/// How long a replica's note lasts without being renewed.
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(3);

/// `KEYS[1]` the profile's replica hash (replica → expiry in milliseconds
/// of the store's clock); `ARGV` the replica, the note's life in
/// milliseconds. Expired notes are dropped. Returns how many replicas are
/// noted, this one included. A value that is not a number counts as
/// expired (dropped), never as a replica.
const HEARTBEAT_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
local flat = redis.call('HGETALL', KEYS[1])
local alive = 1
for i = 1, #flat, 2 do
  if flat[i] ~= ARGV[1] then
    local until_ms = tonumber(flat[i + 1])
    if until_ms == nil or until_ms ~= until_ms or until_ms <= now then
      redis.call('HDEL', KEYS[1], flat[i])
    else
      alive = alive + 1
    end
  end
end
redis.call('HSET', KEYS[1], ARGV[1], now + ttl)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return alive
";

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(HEARTBEAT_SCRIPT));

impl FleetStore {
    fn replicas_key(&self, profile: &str) -> String {
        format!("{}:pool:{profile}:replicas", self.prefix)
    }

    /// Notes `replica` as sharing `profile`'s budgets for [`HEARTBEAT_TTL`]
    /// and says how many replicas are noted now, itself included.
    pub async fn heartbeat(&self, profile: &str, replica: &str) -> Result<u64, FleetStoreError> {
        let mut conn = self.conn.clone();
        let mut invocation = SCRIPT.key(self.replicas_key(profile));
        invocation
            .arg(replica)
            .arg(HEARTBEAT_TTL.as_millis() as u64);
        tokio::time::timeout(self.deadline, invocation.invoke_async(&mut conn))
            .await
            .map_err(|_| FleetStoreError::Timeout(self.deadline))?
            .map_err(FleetStoreError::from)
    }
}
