//! Prefix reuse inside a page: a new prompt copies the KV cells it shares with
//! another prompt's page of exactly computed cells.
//!
//! The prefix cache shares whole pages, and a hit leaves at least [`ROW_GROUP`]
//! prompt tokens to compute. So without more, a prompt under [`CHUNK_ALIGN`] tokens
//! never hits; a prompt that continues an earlier one (the next turn of a chat, an
//! agent's next step: the earlier prompt, its answer and a tool result) recomputes
//! the earlier prompt's last, partial page; and prompts that share a system prompt
//! and part inside a page recompute the shared part of that page. llama.cpp's
//! server reuses a slot's previous prompt token by token.
//!
//! A prompt's token rows are computed in pieces that start at multiples of
//! [`ROW_GROUP`] (chunks start at multiples of [`CHUNK_ALIGN`], or where a hit or a
//! copy ended). Flash attention computes each row on its own (ggml's one-pass kernel
//! for prompts under a chunk; the tiled kernel, padded to a full tile, for longer
//! ones), and the matmuls' arithmetic for a row depends only on where it sits in its
//! piece's blocks of [`ROW_GROUP`] rows. So a row in a whole block has the same bits
//! in any piece that starts at a multiple of [`ROW_GROUP`] at or before it: another
//! prompt with the same tokens up to there, computed with the same kernel (prompts
//! both under a chunk, or both not), may copy those cells (a multiple of
//! [`ROW_GROUP`] of them) and compute the rest, at least a block of it (pieces of
//! fewer rows were measured to round apart), getting the numbers it would get
//! without the copy. A copy is at most one page of cells.
//!
//! Sources are pages whose leading cells hold a prompt's exact KV: the page where a
//! running request's exact cells end, once its prompt is computed; and the registered
//! pages under the same cached page (a registered page is never written), which the
//! pool lists with their exact cells ([`PagePool::copy_candidates`]). Those are whole
//! pages of earlier prompts that part from the new one inside the page (or that a
//! hit could not take: a hit leaves a block to compute), and the pages where
//! finished prompts' exact cells end: a page the answer filled is registered as a
//! whole page, one it left partial is kept as a partial entry
//! ([`PagePool::free_keeping_tail`]), so short answers (a tool call) also spare the
//! next turn the tail. A source fits a new prompt only under the same cached page
//! (or both at the start), so everything before it is the same.

use crate::pages::PageId;
#[cfg(doc)]
use crate::pages::PagePool;
use crate::scheduler::CHUNK_ALIGN;

/// Rows per block in ggml's repacked CPU matmuls: on x86 they take 16 rows at a
/// time, then 4, then one, each with its own rounding (so a row's numbers depend on
/// its block); copies cover whole blocks of 16.
pub(crate) const ROW_GROUP: usize = 16;

/// Registered pages under one parent checked as sources, newest first (a bound on
/// the work per admitted prompt where many prompts part inside one page).
pub(crate) const COPY_CANDIDATES: usize = 256;

/// Leading cells of a prompt of `n_prompt` tokens that sit in whole row blocks
/// (computed exactly as any prompt with those tokens computes them).
pub(crate) fn exact_cells(n_prompt: usize) -> usize {
    n_prompt / ROW_GROUP * ROW_GROUP
}

/// Where `exact` leading cells end inside a page of `page_size`: (page index, exact
/// cells in it); `None` when they end on a page boundary (whole pages are shared
/// through the prefix cache) or there are none.
pub(crate) fn exact_tail(exact: usize, page_size: usize) -> Option<(usize, usize)> {
    (!exact.is_multiple_of(page_size)).then_some((exact / page_size, exact % page_size))
}

/// Whether a prompt of `n_prompt` tokens runs through the tiled flash-attention
/// kernel (the kind of source it may copy from).
pub(crate) fn tiled(n_prompt: usize) -> bool {
    n_prompt >= CHUNK_ALIGN
}

/// A page whose leading `tokens.len()` cells hold exact prompt KV.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Source<'a> {
    pub page: PageId,
    /// The cached page before it (`None`: a first page).
    pub parent: Option<PageId>,
    /// Computed through the tiled attention kernel (see [`tiled`]).
    pub tiled: bool,
    pub tokens: &'a [u32],
}

/// What a new prompt asks of a source: to follow `parent`, be of kind `tiled`, and
/// share the tokens `rest` (the prompt from the page's start on), at most `limit`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Want<'a> {
    pub parent: Option<PageId>,
    pub tiled: bool,
    pub rest: &'a [u32],
    pub limit: usize,
}

/// The longest copy `want` can take from `sources`: `(page, cells)`, a multiple of
/// [`ROW_GROUP`] within `want.limit`; `None` when no source shares a whole block.
pub(crate) fn best_match<'a>(
    want: Want<'_>,
    sources: impl Iterator<Item = Source<'a>>,
) -> Option<(PageId, usize)> {
    sources
        .filter(|s| s.parent == want.parent && s.tiled == want.tiled)
        .map(|s| {
            let common = s.tokens.iter().zip(want.rest).take_while(|(a, b)| a == b);
            (
                s.page,
                common.count().min(want.limit) / ROW_GROUP * ROW_GROUP,
            )
        })
        .filter(|&(_, n)| n > 0)
        .max_by_key(|&(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_whole_groups_within_the_limit() {
        assert_eq!(exact_cells(61), 48);
        assert_eq!(exact_cells(15), 0);
        assert_eq!(exact_cells(150), 144);
        assert_eq!(exact_tail(144, 64), Some((2, 16)));
        assert_eq!(exact_tail(128, 64), None);
        assert_eq!(exact_tail(0, 64), None);
        assert_eq!(exact_tail(48, 64), Some((0, 48)));
        let a: Vec<u32> = (0..60).collect();
        let mut b = a.clone();
        b[35] = 999;
        let src = |page, parent, tiled, tokens| Source {
            page,
            parent,
            tiled,
            tokens,
        };
        let sources = [
            src(1, None, false, &a[..17]),
            src(2, None, false, &b[..]),
            src(3, Some(7), false, &a[..]),
            src(4, None, true, &a[..]),
        ];
        let want = |rest, limit| Want {
            parent: None,
            tiled: false,
            rest,
            limit,
        };
        // Shares 35 tokens with page 2: two whole blocks. Pages 3 (another parent)
        // and 4 (another kernel) share more but do not fit.
        assert_eq!(
            best_match(want(&a, 59), sources.iter().copied()),
            Some((2, 32))
        );
        assert_eq!(
            best_match(want(&a, 20), sources.iter().copied()).map(|m| m.1),
            Some(16)
        );
        assert_eq!(best_match(want(&a, 15), sources.iter().copied()), None);
        assert_eq!(
            best_match(want(&[7, 8, 9], 2), sources.iter().copied()),
            None
        );
        let under_7 = Want {
            parent: Some(7),
            ..want(&a, 59)
        };
        assert_eq!(best_match(under_7, sources.iter().copied()), Some((3, 48)));
        let tiled = Want {
            tiled: true,
            ..want(&a, 59)
        };
        assert_eq!(best_match(tiled, sources.iter().copied()), Some((4, 48)));
    }
}
