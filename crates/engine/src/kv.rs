//! Which KV cells each sequence owns.
//!
//! Foundation version: cells are handed out one at a time, lowest free index first,
//! and a sequence keeps a list of `(cell, position)` pairs. Cells of a sequence need
//! not be contiguous: attention finds them through the mask. The engine-core issue
//! replaces this with fixed-size pages and a content-addressed prefix cache behind
//! the same calls (`reserve`, `cells`, `release`).

use std::collections::BTreeSet;

/// Identifies a sequence inside the engine.
pub type SeqId = u64;

/// Errors of the cell allocator.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    /// Not enough free cells.
    #[error("KV cache full: {want} cells wanted, {free} free")]
    Full {
        /// Cells requested.
        want: usize,
        /// Cells free.
        free: usize,
    },
}

/// Hands out KV cells of a pool of fixed size and remembers who holds them.
#[derive(Debug)]
pub struct CellAllocator {
    n_cells: usize,
    free: BTreeSet<u32>,
    seqs: std::collections::HashMap<SeqId, Vec<(u32, i32)>>,
}

impl CellAllocator {
    /// A pool of `n_cells` free cells.
    pub fn new(n_cells: usize) -> CellAllocator {
        CellAllocator {
            n_cells,
            free: (0..n_cells as u32).collect(),
            seqs: Default::default(),
        }
    }

    /// Total cells.
    pub fn n_cells(&self) -> usize {
        self.n_cells
    }

    /// Free cells.
    pub fn n_free(&self) -> usize {
        self.free.len()
    }

    /// Reserves cells for positions `positions` of `seq`; returns the cells in order.
    /// All or nothing: on error nothing is reserved.
    pub fn reserve(&mut self, seq: SeqId, positions: &[i32]) -> Result<Vec<u32>, KvError> {
        if positions.len() > self.free.len() {
            return Err(KvError::Full {
                want: positions.len(),
                free: self.free.len(),
            });
        }
        let cells: Vec<u32> = (0..positions.len())
            .map(|_| self.free.pop_first().expect("checked"))
            .collect();
        let list = self.seqs.entry(seq).or_default();
        list.extend(cells.iter().copied().zip(positions.iter().copied()));
        Ok(cells)
    }

    /// The `(cell, position)` pairs `seq` holds, in the order they were reserved.
    pub fn cells(&self, seq: SeqId) -> &[(u32, i32)] {
        self.seqs.get(&seq).map_or(&[], |v| v.as_slice())
    }

    /// Returns all of `seq`'s cells to the pool.
    pub fn release(&mut self, seq: SeqId) {
        if let Some(cells) = self.seqs.remove(&seq) {
            self.free.extend(cells.into_iter().map(|(c, _)| c));
        }
    }

    /// One past the highest cell in use (the attention span needed), at least 1.
    pub fn span(&self) -> usize {
        let max_used = self
            .seqs
            .values()
            .flat_map(|v| v.iter().map(|&(c, _)| c))
            .max();
        max_used.map_or(1, |c| c as usize + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_release_roundtrip() {
        let mut a = CellAllocator::new(8);
        assert_eq!(a.reserve(1, &[0, 1, 2]).unwrap(), vec![0, 1, 2]);
        assert_eq!(a.reserve(2, &[0, 1]).unwrap(), vec![3, 4]);
        assert_eq!(a.span(), 5);
        a.release(1);
        assert_eq!(a.n_free(), 6);
        // Lowest free first, so the span stays compact.
        assert_eq!(a.reserve(3, &[0]).unwrap(), vec![0]);
        assert_eq!(a.cells(2), &[(3, 0), (4, 1)]);
        assert_eq!(
            a.reserve(4, &[0; 6]),
            Err(KvError::Full { want: 6, free: 5 })
        );
        assert_eq!(a.n_free(), 5, "failed reserve takes nothing");
        a.release(2);
        a.release(3);
        assert_eq!(a.n_free(), 8);
        assert_eq!(a.span(), 1);
    }
}
