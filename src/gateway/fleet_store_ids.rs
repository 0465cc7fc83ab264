//! Request ids across the fleet in the shared store: the first sighting of
//! an id in its lane (an original), a later one (a retry), and the first
//! one after it was marked deferred (a request told to come back, which is
//! neither, on whichever replica it comes back to; the return consumes the
//! deferral). The id's key holds the store's clock at its
//! first sighting, so a returning request keeps its first arrival (its
//! deadline counts from there) whatever the replicas' clocks say.

use std::sync::LazyLock;
use std::time::Duration;

use super::fleet_store::{FleetStore, FleetStoreError};

/// `KEYS[1]` the id's key; `ARGV[1]` `see` or `defer`, `ARGV[2]` its expiry
/// in milliseconds (the lane's deadline). The value is the first
/// sighting's time in milliseconds of the store's clock, prefixed with `d`
/// while deferred: the sighting that finds the `d` (the return) takes it
/// off, so the next one is a retry unless the id is deferred again.
/// Returns `{kind, age}`: kind 1 first, 0 seen before, 2 seen and deferred
/// (age: milliseconds since the first sighting).
const SIGHTING_SCRIPT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
if ARGV[1] == 'defer' then
  if not v then
    redis.call('SET', KEYS[1], 'd' .. now, 'PX', ARGV[2])
  elseif string.sub(v, 1, 1) ~= 'd' then
    redis.call('SET', KEYS[1], 'd' .. v, 'KEEPTTL')
  end
  return {3, 0}
end
if not v then
  redis.call('SET', KEYS[1], now, 'PX', ARGV[2])
  return {1, 0}
end
if string.sub(v, 1, 1) == 'd' then
  local first = string.sub(v, 2)
  redis.call('SET', KEYS[1], first, 'KEEPTTL')
  return {2, now - tonumber(first)}
end
return {0, 0}
";

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SIGHTING_SCRIPT));

/// How the fleet has seen a request id before.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sighting {
    /// Never: an original.
    First,
    /// Before, not deferred: a retry.
    Again,
    /// Deferred, first seen this many seconds ago: a return (the first
    /// sighting since its deferral; the next one is `Again`).
    Deferred {
        /// Seconds since its first sighting (the store's clock).
        age_seconds: f64,
    },
}

impl FleetStore {
    fn id_key(&self, lane: &str, id: &str) -> String {
        format!("{}:lane:{lane}:id:{id}", self.prefix)
    }

    async fn sight(
        &self,
        lane: &str,
        id: &str,
        op: &str,
        for_how_long: Duration,
    ) -> Result<(i64, i64), FleetStoreError> {
        let mut conn = self.conn.clone();
        let mut invocation = SCRIPT.key(self.id_key(lane, id));
        invocation
            .arg(op)
            .arg(for_how_long.as_millis().max(1) as u64);
        tokio::time::timeout(self.deadline, invocation.invoke_async(&mut conn))
            .await
            .map_err(|_| FleetStoreError::Timeout(self.deadline))?
            .map_err(FleetStoreError::from)
    }

    /// Remembers `id` in `lane` for `for_how_long` (the lane's deadline)
    /// and says how the fleet saw it before.
    pub async fn sighting(
        &self,
        lane: &str,
        id: &str,
        for_how_long: Duration,
    ) -> Result<Sighting, FleetStoreError> {
        Ok(match self.sight(lane, id, "see", for_how_long).await? {
            (1, _) => Sighting::First,
            (2, age) => Sighting::Deferred {
                age_seconds: age.max(0) as f64 / 1_000.0,
            },
            _ => Sighting::Again,
        })
    }

    /// Remembers `id` in `lane` for `for_how_long` (the lane's deadline):
    /// true the first time any replica sees it (an original), false after
    /// (a retry, or a return after a deferral, wherever its original
    /// landed; [`FleetStore::sighting`] tells them apart).
    pub async fn first_sighting(
        &self,
        lane: &str,
        id: &str,
        for_how_long: Duration,
    ) -> Result<bool, FleetStoreError> {
        let s = self.sighting(lane, id, for_how_long).await?;
        Ok(s == Sighting::First)
    }

    /// Marks `id` in `lane` deferred: where it comes back, it is a return,
    /// with its first arrival. Its memory keeps its expiry (or gets
    /// `for_how_long` when it had none).
    pub async fn deferred(
        &self,
        lane: &str,
        id: &str,
        for_how_long: Duration,
    ) -> Result<(), FleetStoreError> {
        self.sight(lane, id, "defer", for_how_long)
            .await
            .map(|_| ())
    }

    /// Marks every `(lane, id, for how long)` of `items` deferred, in one
    /// pipelined call with one deadline.
    pub async fn deferred_all(
        &self,
        items: &[(&str, &str, Duration)],
    ) -> Result<(), FleetStoreError> {
        let invocations: Vec<_> = items
            .iter()
            .map(|(lane, id, d)| {
                let mut inv = SCRIPT.key(self.id_key(lane, id));
                inv.arg("defer").arg(d.as_millis().max(1) as u64);
                inv
            })
            .collect();
        let mut pipe = redis::pipe();
        pipe.load_script(&SCRIPT).ignore();
        for inv in &invocations {
            pipe.invoke_script(inv).ignore();
        }
        let mut conn = self.conn.clone();
        tokio::time::timeout(self.deadline, pipe.query_async::<()>(&mut conn))
            .await
            .map_err(|_| FleetStoreError::Timeout(self.deadline))?
            .map_err(FleetStoreError::from)
    }
}
