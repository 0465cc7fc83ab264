//! Slot counts across the fleet in the shared store (a tenant's
//! `maxConcurrency`, the pool's `inFlight.stopAt`): each replica's holding,
//! moved by one atomic script against the store's clock. The arithmetic is
//! [`lanes::fleet_slots::FleetSlots`]'s; `tests/it/fleet_store_redis.rs`
//! checks the script on a real server.

use std::sync::LazyLock;
use std::time::Duration;

use lanes::fleet_slots::{SlotGrant, SlotOp};

use super::fleet_store::{FleetStore, FleetStoreError};

/// `KEYS[1]` the count (a hash: `h:R` slots held by replica R, `w:R` its
/// requests waiting short of a slot, `e:R` when its lease runs out, in
/// milliseconds of the store's clock). `ARGV`: the replica, `take` or
/// `give`, how many, its waiting, the maximum, the lease in milliseconds,
/// and what the replica holds by its own count (before a take's grant,
/// after a give). Holdings whose lease ran out are dropped first. The
/// replica's own count is the truth of what it holds: a store that
/// forgot it (flushed, evicted, failed over to a lagging copy, its clock
/// stepped past every lease) counts it again before it grants anyone
/// else, so the maximum holds across the fleet; the sum may then stand
/// above the maximum until requests end, never below what is in use.
/// Returns `{granted, others_waiting, others_held}`.
const SLOTS_SCRIPT: &str = r"
local me = ARGV[1]
local n = tonumber(ARGV[3])
local waiting = tonumber(ARGV[4])
local max = tonumber(ARGV[5])
local lease = tonumber(ARGV[6])
local held = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local flat = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #flat, 2 do f[flat[i]] = flat[i + 1] end
local others, others_waiting, mine = 0, 0, 0
for k, v in pairs(f) do
  if string.sub(k, 1, 2) == 'e:' then
    local r = string.sub(k, 3)
    if tonumber(v) <= now then
      redis.call('HDEL', KEYS[1], 'e:' .. r, 'h:' .. r, 'w:' .. r)
    elseif r == me then
      mine = tonumber(f['h:' .. r] or '0')
    else
      others = others + tonumber(f['h:' .. r] or '0')
      others_waiting = others_waiting + tonumber(f['w:' .. r] or '0')
    end
  end
end
local granted = 0
if ARGV[2] == 'take' then
  if mine < held then mine = held end
  local free = max - others - mine
  if free < 0 then free = 0 end
  granted = math.min(n, free)
  mine = mine + granted
  if n - granted > waiting then waiting = n - granted end
else
  mine = mine - n
  if mine < held then mine = held end
  if mine < 0 then mine = 0 end
end
if mine == 0 and waiting == 0 then
  redis.call('HDEL', KEYS[1], 'e:' .. me, 'h:' .. me, 'w:' .. me)
else
  redis.call('HSET', KEYS[1], 'h:' .. me, mine, 'w:' .. me, waiting, 'e:' .. me, now + lease)
end
redis.call('PEXPIRE', KEYS[1], 2 * lease)
return {granted, others_waiting, others}
";

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(SLOTS_SCRIPT));

/// What the store last said of one count a replica holds or asked for.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct SlotSeen {
    /// When (the core's clock).
    pub(super) at: f64,
    /// The other replicas' requests waiting short of a slot.
    pub(super) others_waiting: u64,
}

/// Which count a slot call moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotCount<'a> {
    /// A tenant's `maxConcurrency` in a lane (`profile/lane`).
    Tenant {
        /// `profile/lane`.
        lane: &'a str,
        /// The tenant.
        tenant: &'a str,
    },
    /// The pool's `inFlight.stopAt` (of a profile).
    Pool {
        /// The profile.
        profile: &'a str,
    },
}

/// One slot call: what it does to the replica's holding, with how many of
/// its requests wait short of a slot, under which maximum, for how long.
#[derive(Clone, Copy, Debug)]
pub struct SlotCall<'a> {
    /// The count.
    pub count: SlotCount<'a>,
    /// The replica (its holding's name).
    pub replica: &'a str,
    /// Take or give back.
    pub op: SlotOp,
    /// Its requests waiting short of a slot.
    pub waiting: u64,
    /// The count's maximum.
    pub max: u64,
    /// The holding's lease.
    pub lease: Duration,
    /// What the replica holds by its own count: before a take's grant, or
    /// after a give back (see the script).
    pub held: u64,
}

impl FleetStore {
    fn slots_key(&self, count: SlotCount<'_>) -> String {
        match count {
            SlotCount::Tenant { lane, tenant } => {
                format!("{}:lane:{lane}:tenant:{tenant}:slots", self.prefix)
            }
            SlotCount::Pool { profile } => format!("{}:pool:{profile}:slots", self.prefix),
        }
    }

    /// Moves the replica's holding of a count.
    pub async fn slots(&self, call: SlotCall<'_>) -> Result<SlotGrant, FleetStoreError> {
        let mut conn = self.conn.clone();
        let (op, n) = match call.op {
            SlotOp::Take(n) => ("take", n),
            SlotOp::GiveBack(n) => ("give", n),
        };
        let mut invocation = SCRIPT.key(self.slots_key(call.count));
        invocation
            .arg(call.replica)
            .arg(op)
            .arg(n)
            .arg(call.waiting)
            .arg(call.max)
            .arg(call.lease.as_millis().max(1) as u64)
            .arg(call.held);
        let (granted, others_waiting, others_held): (u64, u64, u64) =
            tokio::time::timeout(self.deadline, invocation.invoke_async(&mut conn))
                .await
                .map_err(|_| FleetStoreError::Timeout(self.deadline))??;
        Ok(SlotGrant {
            granted,
            others_waiting,
            others_held,
        })
    }
}
