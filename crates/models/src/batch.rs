//! What a step computes: [`StepBatch`], its sequences and what each attends over
//! in each cache group, and the checks a batch passes before any graph is built.

use crate::cache::GroupKind;
use crate::{HParams, KvStore, ModelError};

/// One forward step over tokens of one or more sequences.
///
/// Tokens are flattened sequence by sequence; each sequence attends only to its own
/// KV windows (`SeqSpan::views`, one per cache group), so its numbers do not depend
/// on what else is in the step.
#[derive(Debug, Clone, Default)]
pub struct StepBatch {
    /// Token ids, flattened over sequences.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<i32>,
    /// Per cache group: the cell of the group's pool each token's keys and values
    /// are written to (`kv_slots[g].len() == tokens.len()`).
    pub kv_slots: Vec<Vec<i64>>,
    /// The sequences of the step, in token order.
    pub seqs: Vec<SeqSpan>,
    /// Token rows whose logits are returned, in this order.
    pub output_rows: Vec<i32>,
    /// Batch-invariant numbers: on the CPU, a lone decode row of a weight type that
    /// ggml multiplies with tinyBLAS from two rows on is multiplied as two rows, so
    /// it rounds exactly as it would batched with other decode rows. Costs up to
    /// twice the matmul work of a lone decode row (those types are common on AVX2,
    /// where ggml repacks none of Q5_0/Q8_0); off, a lone row takes ggml's dot
    /// products as llama.cpp's own decode does.
    pub batch_invariant: bool,
    /// Decode rows attend through flash attention at any depth, as llama.cpp's do,
    /// instead of through matmuls beyond [`crate::MATMUL_DECODE_ABOVE`] cells on the
    /// CPU. Slower at depth; the numbers are then those of ggml's flash attention,
    /// whose F16 V accumulator rounds apart from the matmul path's F32 sums (and,
    /// from 512 cells, with the number of threads that split the cells).
    pub flash_decode: bool,
    /// Rows whose final hidden state (after the output norm) is returned too, in
    /// this order: the input of the model's multi-token-prediction head (see
    /// [`crate::Model::forward_hidden`]). Only models with an MTP head.
    pub hidden_rows: Vec<i32>,
    /// Rows whose input is an embedding instead of their token's (an image's
    /// positions); their `tokens` entries are ignored.
    pub embeds: Option<RowEmbeds>,
    /// Four rope positions per token, section-major (all tokens' first, then
    /// second, ...), for multi-section rope when rows are image positions (2-D);
    /// None: each token's `positions` entry in the first three sections, 0 in
    /// the fourth (text).
    pub positions_multi: Option<Vec<i32>>,
}

/// Input embeddings of some rows of a step (see [`StepBatch::embeds`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowEmbeds {
    /// The rows, ascending.
    pub rows: Vec<i32>,
    /// Per row, [`crate::HParams::n_embd_inp`] values: the embedding, then any
    /// deepstack features.
    pub values: Vec<f32>,
}

/// A run of consecutive KV cells: `start..start + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CellRun {
    /// First cell.
    pub start: usize,
    /// Number of cells.
    pub len: usize,
}

/// What one sequence attends over in one cache group (in a
/// [`GroupKind::Recurrent`] group: its state slot, one cell, and no mask).
///
/// The window is made of cell runs of the group's pool laid end to end (a paged
/// cache gives one run per stretch of consecutive pages). A window of one run is
/// read in place; several runs are first copied into one contiguous window, so the
/// attention arithmetic is the same wherever the pages lie.
#[derive(Debug, Clone, Default)]
pub struct KvView {
    /// The attention window: cell runs of this group's pool, in window order.
    pub window: Vec<CellRun>,
    /// `[n_kv, n_rows]` F16 bits (see [`crate::MaskBuilder`]) for the group's layers
    /// (built with the sliding limit in a Sliding group), where `n_kv` is the
    /// window's total length.
    pub mask: Vec<u16>,
    /// Sliding-window mask of the same shape, for sliding layers kept in a Full
    /// group (the `swa_full` layout); None otherwise.
    pub mask_swa: Option<Vec<u16>>,
}

impl KvView {
    /// Cells in the attention window.
    pub fn n_kv(&self) -> usize {
        self.window.iter().map(|r| r.len).sum()
    }
}

/// One sequence's part of a [`StepBatch`].
#[derive(Debug, Clone, Default)]
pub struct SeqSpan {
    /// First token row of the sequence in the batch.
    pub row_start: usize,
    /// Number of token rows.
    pub n_rows: usize,
    /// What the sequence attends over in each cache group, in group order.
    pub views: Vec<KvView>,
    /// The rows are a chunk of a prompt that ggml's CPU flash attention computes
    /// with its tiled kernel when computed from scratch (prompts of a full tile,
    /// 64 tokens, or more): a shorter chunk of it (after a prefix-cache hit) is
    /// padded to a full tile of query rows, so its rows round the same way.
    pub tiled_prompt: bool,
    /// A copy of the sequence's recurrent state as it was `back` rows before the end
    /// of its rows, written into another slot of the recurrent group in the same
    /// step (a checkpoint inside a prompt piece, so the piece need not end there).
    pub state_snapshot: Option<StateSnapshot>,
    /// The rows continue the previous span's sequence: a verifying decode's next row
    /// (see the engine's speculative decoding). Attention treats the span as its own
    /// (its own window and mask, so each row computes as it would decoded alone);
    /// recurrent layers run its rows right after the previous span's, from the state
    /// those left, in the same state slot. Models without recurrent layers ignore it.
    pub continues: bool,
}

/// Where a sequence's mid-piece recurrent state goes (see [`SeqSpan::state_snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSnapshot {
    /// The recurrent group's slot written.
    pub slot: u32,
    /// Rows before the end of the sequence's rows (0: its final state), fewer than
    /// its rows.
    pub back: usize,
}

impl SeqSpan {
    /// Cells in the attention window of cache group `group`.
    pub fn n_kv(&self, group: usize) -> usize {
        self.views[group].n_kv()
    }
}

/// Checks `b` against the model's `hp` and the KV store it runs on.
pub(crate) fn check(hp: &HParams, b: &StepBatch, kv: &KvStore) -> Result<(), ModelError> {
    let n = b.tokens.len();
    let bad = |s: String| Err(ModelError::BadBatch(s));
    if n == 0 {
        return bad("no tokens".into());
    }
    if b.positions.len() != n {
        return bad("positions length differs from tokens".into());
    }
    if b.tokens.iter().any(|&t| t as usize >= hp.n_vocab) {
        return bad("token id outside the vocabulary".into());
    }
    if let Some(e) = &b.embeds {
        if !hp.arch.takes_images() {
            return bad(format!("{} takes no input embeddings", hp.arch.name()));
        }
        if e.rows.is_empty()
            || e.rows.windows(2).any(|w| w[0] >= w[1])
            || e.rows.iter().any(|&r| r < 0 || r as usize >= n)
        {
            return bad("embedding rows empty, unsorted or out of range".into());
        }
        if e.values.len() != e.rows.len() * hp.n_embd_inp() {
            return bad(format!(
                "{} embedding values for {} rows of {}",
                e.values.len(),
                e.rows.len(),
                hp.n_embd_inp()
            ));
        }
    }
    if let Some(p) = &b.positions_multi {
        if hp.rope_sections.is_none() || p.len() != 4 * n {
            return bad("positions_multi without multi-section rope, or not 4 per token".into());
        }
    }
    let n_groups = kv.n_groups();
    if b.kv_slots.len() != n_groups {
        return bad(format!(
            "kv_slots for {} cache groups, the KV store has {n_groups}",
            b.kv_slots.len()
        ));
    }
    for (g, slots) in b.kv_slots.iter().enumerate() {
        if slots.len() != n {
            return bad(format!("kv_slots[{g}] length differs from tokens"));
        }
        if slots.iter().any(|&s| s < 0 || s as usize >= kv.n_cells(g)) {
            return bad(format!("kv slot outside the pool of cache group {g}"));
        }
    }
    // Per group: whether its sequences need a `mask_swa` (sliding layers in a Full group).
    let needs_swa: Vec<bool> = kv
        .groups()
        .iter()
        .map(|g| g.kind == GroupKind::Full && g.layers.iter().any(|&il| hp.is_swa[il]))
        .collect();
    let recurrent = kv
        .groups()
        .iter()
        .position(|g| g.kind == GroupKind::Recurrent);
    let mut next_row = 0;
    for (i, s) in b.seqs.iter().enumerate() {
        if s.row_start != next_row || s.n_rows == 0 {
            return bad("sequence spans must cover the tokens in order".into());
        }
        if s.continues {
            // A continuing span carries the previous span's state on.
            let slot =
                |s: &SeqSpan| recurrent.and_then(|g| s.views.get(g)?.window.first().copied());
            if i == 0 || slot(s) != slot(&b.seqs[i - 1]) {
                return bad(format!(
                    "sequence span {i} continues one that is not there or has another state slot"
                ));
            }
        }
        next_row += s.n_rows;
        if let Some(snap) = s.state_snapshot {
            let Some(g) = recurrent else {
                return bad("a state snapshot in a model without recurrent layers".into());
            };
            let own = s
                .views
                .get(g)
                .and_then(|v| v.window.first())
                .map(|r| r.start);
            if snap.back >= s.n_rows
                || snap.slot as usize >= kv.n_cells(g)
                || own == Some(snap.slot as usize)
            {
                return bad(format!(
                    "state snapshot {} rows back into slot {} of a {}-row sequence",
                    snap.back, snap.slot, s.n_rows
                ));
            }
        }
        if s.views.len() != n_groups {
            return bad(format!(
                "a sequence has {} KV views for {n_groups} cache groups",
                s.views.len()
            ));
        }
        for (g, v) in s.views.iter().enumerate() {
            let n_cells = kv.n_cells(g);
            if kv.groups()[g].kind == GroupKind::Recurrent {
                // The view names the sequence's state slot; nothing is masked.
                match v.window[..] {
                    [r] if r.len == 1 && r.start < n_cells => {}
                    _ => {
                        return bad(format!(
                            "recurrent cache group {g}: a view must be one state slot"
                        ))
                    }
                }
                if !v.mask.is_empty() || v.mask_swa.is_some() {
                    return bad(format!("recurrent cache group {g}: a view has a mask"));
                }
                continue;
            }
            if let Some(r) = v
                .window
                .iter()
                .find(|r| r.len == 0 || r.start + r.len > n_cells)
            {
                return bad(format!(
                    "KV run {}+{} of cache group {g} empty or outside 0..{n_cells}",
                    r.start, r.len
                ));
            }
            let n_kv = v.n_kv();
            if n_kv == 0 {
                return bad(format!("empty KV window in cache group {g}"));
            }
            let want = n_kv * s.n_rows;
            if v.mask.len() != want || v.mask_swa.as_ref().is_some_and(|m| m.len() != want) {
                return bad(format!("mask size in cache group {g} is not n_kv * n_rows"));
            }
            if v.mask_swa.is_some() != needs_swa[g] {
                return bad(format!(
                    "cache group {g} {} sliding-window layers but a sequence {} mask_swa",
                    if needs_swa[g] { "has" } else { "has no" },
                    if needs_swa[g] { "has no" } else { "has a" },
                ));
            }
        }
    }
    if next_row != n {
        return bad("sequence spans do not cover every token".into());
    }
    if b.output_rows.is_empty() || b.output_rows.iter().any(|&r| r < 0 || r as usize >= n) {
        return bad("output rows empty or out of range".into());
    }
    if b.hidden_rows.iter().any(|&r| r < 0 || r as usize >= n) {
        return bad("hidden rows out of range".into());
    }
    if !b.hidden_rows.is_empty() && hp.n_nextn == 0 {
        return bad("hidden rows asked of a model without an MTP head".into());
    }
    Ok(())
}
