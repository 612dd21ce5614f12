//! Least-recently-used order of unreferenced cache entries, for the managers of
//! cache groups that keep entries beside the full-attention pages' own LRU.

use std::collections::BTreeMap;

/// Entries in the order they were cached, each named by the stamp [`Lru::push`]
/// returned (its holder keeps the stamp to take it out again).
#[derive(Debug)]
pub(crate) struct Lru<T> {
    order: BTreeMap<u64, T>,
    next: u64,
}

impl<T: Copy> Lru<T> {
    pub fn new() -> Lru<T> {
        Lru {
            order: BTreeMap::new(),
            next: 0,
        }
    }

    /// Caches `t` as the most recent entry; returns its stamp.
    pub fn push(&mut self, t: T) -> u64 {
        let stamp = self.next;
        self.next += 1;
        self.order.insert(stamp, t);
        stamp
    }

    /// Takes out the entry of `stamp`.
    pub fn remove(&mut self, stamp: u64) {
        self.order.remove(&stamp);
    }

    /// Takes out the least recently cached entry.
    pub fn pop_oldest(&mut self) -> Option<T> {
        self.order.pop_first().map(|(_, t)| t)
    }

    /// Entries cached.
    pub fn len(&self) -> usize {
        self.order.len()
    }
}
