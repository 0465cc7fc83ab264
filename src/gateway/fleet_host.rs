//! The gateway's shared state as the fleet's link sees it ([`FleetHost`]):
//! its clock, its core under the lock, and the driver's wake-up.

use lanes::Core;

use super::fleet_share::FleetHost;
use super::state::Gateway;

impl FleetHost for Gateway {
    fn now(&self) -> f64 {
        Gateway::now(self)
    }

    fn with_core<R>(&self, f: impl FnOnce(&mut Core) -> R) -> Option<R> {
        self.lock().core.as_mut().map(f)
    }

    fn wake(&self) {
        self.wake.notify_one();
    }
}
