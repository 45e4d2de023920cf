//! The open connections, for shedding: when the server holds as many as its open-file limit
//! leaves room for, the connection idle the longest (no request in flight, nothing read) is
//! closed to make room for the newcomer. Half-open and keep-alive connections go first; a
//! connection with a request in flight is never shed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

pub struct Registry {
    capacity: usize,
    epoch: Instant,
    open: Mutex<BTreeMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    emptied: Notify,
}

/// One connection's activity, shared by its reader, its requests and the registry.
pub struct Slot {
    epoch: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `epoch` of the last byte read or response finished.
    last_active_ms: AtomicU64,
    /// Notified when the registry sheds this connection.
    pub shed: Notify,
}

/// Keeps a slot registered for as long as its connection lives.
pub struct Registered {
    registry: Arc<Registry>,
    id: u64,
    pub slot: Arc<Slot>,
}

/// A request in flight on a connection, until its response body is done or dropped.
pub struct InFlight(Arc<Slot>);

impl Registry {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Self {
            capacity,
            epoch: Instant::now(),
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            emptied: Notify::new(),
        })
    }

    /// Registers a new connection, shedding the longest-idle one if the server is full.
    /// None when it is full of busy connections: the newcomer is turned away.
    pub fn register(self: &Arc<Self>) -> Option<Registered> {
        let mut open = self.open.lock().expect("registry lock");
        if open.len() >= self.capacity && !shed_longest_idle(&open) {
            return None;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = Arc::new(Slot {
            epoch: self.epoch,
            in_flight: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(0),
            shed: Notify::new(),
        });
        slot.touch();
        open.insert(id, slot.clone());
        Some(Registered {
            registry: self.clone(),
            id,
            slot,
        })
    }

    /// Sheds the longest-idle connection (`accept` ran out of descriptors); false if none is.
    pub fn shed_one(&self) -> bool {
        shed_longest_idle(&self.open.lock().expect("registry lock"))
    }

    /// Completes when the last open connection closes after this call.
    pub fn emptied(&self) -> Notified<'_> {
        self.emptied.notified()
    }

    pub fn len(&self) -> usize {
        self.open.lock().expect("registry lock").len()
    }
}

/// Picks by least recent activity. A shed slot stays in the map until its connection task
/// ends, a moment later; it reads as busy meanwhile (see `SHED`), so it is not picked twice.
fn shed_longest_idle(open: &BTreeMap<u64, Arc<Slot>>) -> bool {
    let victim = open
        .values()
        .filter(|s| s.in_flight.load(Ordering::Acquire) == 0)
        .min_by_key(|s| s.last_active_ms.load(Ordering::Relaxed));
    match victim {
        Some(slot) => {
            slot.mark_shed();
            true
        }
        None => false,
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.registry.open.lock().expect("registry lock");
        open.remove(&self.id);
        if open.is_empty() {
            self.registry.emptied.notify_waiters();
        }
    }
}

/// `in_flight` of a shed slot: it reads as busy, so the same connection is not shed twice
/// while its task winds down.
const SHED: usize = usize::MAX / 2;

impl Slot {
    pub fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_active_ms.store(ms, Ordering::Relaxed);
    }

    pub fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.touch();
        InFlight(self.clone())
    }

    /// How long the connection has been idle: zero while a request is in flight.
    pub fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        let last = Duration::from_millis(self.last_active_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    fn mark_shed(&self) {
        self.in_flight.fetch_add(SHED, Ordering::AcqRel);
        self.shed.notify_one();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_registry_sheds_the_longest_idle_connection_and_never_a_busy_one() {
        let registry = Registry::new(2);
        let busy = registry.register().unwrap();
        let idle = registry.register().unwrap();
        let _request = busy.slot.request_started();
        let newcomer = registry.register().expect("room made by shedding the idle one");
        assert_eq!(idle.slot.idle_for(), Duration::ZERO, "a shed slot reads as busy");
        drop(idle);
        let _busy_too = newcomer.slot.request_started();
        assert!(registry.register().is_none(), "only busy connections left");
        assert_eq!(registry.len(), 2);
    }
}
