//! Prefix reuse inside a page, for prompts shorter than [`CHUNK_ALIGN`] tokens.
//!
//! The prefix cache shares whole pages, so a prompt under [`CHUNK_ALIGN`] tokens
//! (no whole page to share) never hits. Yet short prompts that differ only in their
//! last words are common (chat turns, a batch of similar requests), and llama.cpp's
//! server reuses a slot's previous prompt token by token.
//!
//! Such a prompt is computed in one piece, through ggml's CPU flash-attention kernel
//! for fewer than [`CHUNK_ALIGN`] query rows (one pass per row, independent of the
//! other rows) and matmuls whose arithmetic for a row depends only on where it sits
//! in the piece's blocks of [`ROW_GROUP`] rows. So a row's KV has the same bits in
//! any short piece that starts at a multiple of [`ROW_GROUP`] at or before it, as
//! long as the row sits in a whole block: a new short prompt may copy the cells it
//! shares with a first page computed that way (a multiple of [`ROW_GROUP`] of them)
//! and compute the rest, getting the numbers it would get from scratch. The copy is
//! a few hundred KiB at most.
//!
//! Sources are first pages: of running requests once their short prompt is
//! computed, and of finished ones while the page stays registered in the prefix
//! cache (a registered page is never written).

use std::collections::VecDeque;

use crate::core::CHUNK_ALIGN;
use crate::pages::{PageId, PagePool};

/// Rows per block in ggml's repacked CPU matmuls: on x86 they take 16 rows at a
/// time, then 4, then one, each with its own rounding (so a row's numbers depend on
/// its block); copies cover whole blocks of 16.
pub(crate) const ROW_GROUP: usize = 16;

/// Finished sources remembered (oldest dropped first).
const FINISHED_CAP: usize = 64;

/// Leading cells of a prompt of `n_prompt` tokens, computed in one piece from a
/// multiple of [`ROW_GROUP`], that another short prompt may copy.
pub(crate) fn exact_cells(n_prompt: usize) -> usize {
    if n_prompt < CHUNK_ALIGN {
        n_prompt / ROW_GROUP * ROW_GROUP
    } else {
        0
    }
}

/// A first page whose leading `tokens.len()` cells hold exact short-prompt KV.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub page: PageId,
    pub tokens: &'a [u32],
}

/// The longest copy `prompt` can take from `sources`: `(page, cells)`, a multiple of
/// [`ROW_GROUP`] that leaves at least one prompt token to compute; `None` when no
/// source shares a whole group.
pub(crate) fn best_match<'a>(
    prompt: &[u32],
    sources: impl Iterator<Item = Source<'a>>,
) -> Option<(PageId, usize)> {
    let limit = prompt.len().saturating_sub(1);
    sources
        .map(|s| {
            let common = s.tokens.iter().zip(prompt).take_while(|(a, b)| a == b);
            (s.page, common.count().min(limit) / ROW_GROUP * ROW_GROUP)
        })
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(_, n)| n)
}

/// First pages of finished short prompts, each valid while the registration it
/// had when remembered lasts: (page, registration, exact leading cells).
#[derive(Debug, Default)]
pub(crate) struct FinishedSources {
    entries: VecDeque<(PageId, u64, usize)>,
}

impl FinishedSources {
    /// Remembers `page` (its first `exact` cells holding exact KV) if it is
    /// registered, which keeps its cells unchanged after its request lets go of it.
    pub fn remember(&mut self, pool: &PagePool, page: PageId, exact: usize) {
        let Some((reg, _)) = pool.registration(page) else {
            return;
        };
        self.entries.retain(|e| e.0 != page);
        if self.entries.len() == FINISHED_CAP {
            self.entries.pop_front();
        }
        self.entries.push_back((page, reg, exact));
    }

    /// Drops the entries whose page was evicted or re-registered since.
    pub fn prune(&mut self, pool: &PagePool) {
        self.entries
            .retain(|&(page, reg, _)| pool.registration(page).map(|r| r.0) == Some(reg));
    }

    /// The remembered sources still registered, their tokens read from the pool
    /// (call [`FinishedSources::prune`] first to skip the stale ones for good).
    pub fn iter<'a>(&'a self, pool: &'a PagePool) -> impl Iterator<Item = Source<'a>> {
        self.entries.iter().filter_map(move |&(page, reg, exact)| {
            let (r, tokens) = pool.registration(page)?;
            (r == reg).then(|| Source {
                page,
                tokens: &tokens[..exact],
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_whole_groups_and_leaves_a_token() {
        assert_eq!(exact_cells(61), 48);
        assert_eq!(exact_cells(15), 0);
        assert_eq!(exact_cells(CHUNK_ALIGN), 0);
        let a: Vec<u32> = (0..60).collect();
        let mut b = a.clone();
        b[35] = 999;
        let src = [
            Source {
                page: 1,
                tokens: &a[..17],
            },
            Source {
                page: 2,
                tokens: &b,
            },
        ];
        // Shares 35 tokens with page 2: two whole blocks.
        assert_eq!(best_match(&a, src.iter().copied()), Some((2, 32)));
        // A prompt equal to a source's tokens keeps its last token to compute.
        assert_eq!(best_match(&a[..16], src.iter().copied()), None);
        assert_eq!(
            best_match(&a[..17], src.iter().copied()).map(|m| m.1),
            Some(16)
        );
        assert_eq!(best_match(&[7, 8, 9], src.iter().copied()), None);
    }

    #[test]
    fn finished_sources_last_while_registered() {
        let ps = 64;
        let mut pool = PagePool::new(4, ps);
        let toks: Vec<u32> = (100..164).collect();
        pool.allocate(1, &toks, 0).unwrap();
        pool.append_slots(1, ps).unwrap();
        pool.commit_full_pages(1, &toks).unwrap();
        let page = pool.page_table(1).unwrap()[0];
        let mut f = FinishedSources::default();
        f.remember(&pool, page, 48);
        pool.free(1).unwrap();
        f.prune(&pool);
        let sources: Vec<Source<'_>> = f.iter(&pool).collect();
        assert_eq!((sources.len(), sources[0].tokens), (1, &toks[..48]));
        // Fill the pool with other requests until the cached page is evicted.
        for seq in 2..7 {
            pool.allocate(seq, &[seq as u32], 0).unwrap();
            pool.append_slots(seq, ps).unwrap();
            pool.free(seq).unwrap();
        }
        let mut held = Vec::new();
        for seq in 10..14 {
            pool.allocate(seq, &[seq as u32], 0).unwrap();
            pool.append_slots(seq, ps).unwrap();
            held.push(seq);
        }
        assert_eq!(f.iter(&pool).count(), 0, "evicted pages are no source");
        f.prune(&pool);
        assert!(f.entries.is_empty());
        // An unregistered page is never remembered.
        f.remember(&pool, pool.page_table(10).unwrap()[0], 16);
        assert!(f.entries.is_empty());
    }
}
