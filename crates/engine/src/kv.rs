//! Which KV cells each sequence owns.
//!
//! Foundation version: the pool is cut into equal slots (like llama.cpp's `-np`
//! slots); a running sequence owns one slot and keeps position `p` in the slot's
//! cell `p`. Each sequence then attends over its own contiguous window, so its
//! arithmetic is the same alone or batched. The engine-core issue replaces this with
//! pages allocated per real token and a content-addressed prefix cache.

/// Identifies a sequence inside the engine.
pub type SeqId = u64;

/// Errors of the slot allocator.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    /// Every slot is taken.
    #[error("all {0} KV slots are in use")]
    NoSlot(usize),
}

/// Hands out fixed-size KV slots.
#[derive(Debug)]
pub struct SlotAllocator {
    slot_cells: usize,
    owners: Vec<Option<SeqId>>,
}

impl SlotAllocator {
    /// `n_slots` slots of `slot_cells` cells each.
    pub fn new(n_slots: usize, slot_cells: usize) -> SlotAllocator {
        SlotAllocator {
            slot_cells,
            owners: vec![None; n_slots.max(1)],
        }
    }

    /// Cells per slot: the most tokens (prompt + generated) one sequence can hold.
    pub fn slot_cells(&self) -> usize {
        self.slot_cells
    }

    /// Number of free slots.
    pub fn n_free(&self) -> usize {
        self.owners.iter().filter(|o| o.is_none()).count()
    }

    /// Gives `seq` a free slot; returns its first cell.
    pub fn acquire(&mut self, seq: SeqId) -> Result<usize, KvError> {
        let n = self.owners.len();
        let i = self
            .owners
            .iter()
            .position(Option::is_none)
            .ok_or(KvError::NoSlot(n))?;
        self.owners[i] = Some(seq);
        Ok(i * self.slot_cells)
    }

    /// Frees `seq`'s slot (no-op if it has none).
    pub fn release(&mut self, seq: SeqId) {
        for o in self.owners.iter_mut().filter(|o| **o == Some(seq)) {
            *o = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_release() {
        let mut a = SlotAllocator::new(2, 256);
        assert_eq!(a.acquire(7), Ok(0));
        assert_eq!(a.acquire(8), Ok(256));
        assert_eq!(a.acquire(9), Err(KvError::NoSlot(2)));
        a.release(7);
        assert_eq!(a.n_free(), 1);
        assert_eq!(a.acquire(9), Ok(0), "freed slot is reused");
        a.release(8);
        a.release(9);
        a.release(9);
        assert_eq!(a.n_free(), 2);
    }
}
