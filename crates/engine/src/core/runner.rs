//! Carrying out a step plan: the model's batch (tokens, positions, the cells they
//! write and the windows and masks they attend over, per cache group), the forward
//! pass (with constraint masks computed meanwhile), then committing the KV to the
//! prefix cache and sampling.

use tempo9_models::{
    CellRun, KvView, MaskBuilder, ModelError, RowEmbeds, SeqSpan, StateSnapshot, StepBatch,
    StepOutput,
};

use tempo9_tokenizer::Tokenizer;

use super::checkpoints::Snapshot;
use super::output::{sample_one, take_token};
use super::{EngineCore, Live};
use crate::pages::PageId;
use crate::partial_page;
use crate::request::{FinishReason, RequestId};
use crate::scheduler::{Work, CHUNK_ALIGN, KV_WINDOW_PAD};

/// Attention-mask memory handed from step to step while requests run: a prompt
/// chunk's mask at depth is megabytes (512 rows at 10K cells: 10 MB); built in
/// fresh memory every step (page faults) it took 5 ms of a step on the H200's host,
/// in reused memory 2 ms. Dropped when the engine goes idle, so a long prompt's
/// masks are not kept after it.
#[derive(Default)]
pub(super) struct MaskBuffers(Vec<Vec<u16>>);

impl MaskBuffers {
    /// Buffers kept at most (a step with many decode rows hands back one each).
    const KEEP: usize = 64;

    /// The smallest kept buffer that holds `len` cells, else the largest (it grows).
    pub(super) fn take(&mut self, len: usize) -> Vec<u16> {
        let fits = (0..self.0.len())
            .filter(|&i| self.0[i].capacity() >= len)
            .min_by_key(|&i| self.0[i].capacity());
        let pick = fits.or_else(|| (0..self.0.len()).max_by_key(|&i| self.0[i].capacity()));
        pick.map_or_else(Vec::new, |i| self.0.swap_remove(i))
    }

    /// Keeps the masks of a step that has run.
    pub(super) fn give_back(&mut self, batch: StepBatch) {
        for v in batch.seqs.into_iter().flat_map(|s| s.views) {
            for m in std::iter::once(v.mask).chain(v.mask_swa) {
                if self.0.len() < Self::KEEP {
                    self.0.push(m);
                }
            }
        }
    }
}

/// A sequence's view of one cache group for its rows at positions `start..end`: the
/// cells of `pages` (page `i` holds positions `base + i * ps ..`), padded with masked
/// cells to a multiple of [`KV_WINDOW_PAD`] (capped by the group's `n_cells`: the
/// window's cells must exist; masked cells change no row's numbers on the CPU
/// kernels used for such windows, see tempo9_models' attention plan). `masks`: the
/// sliding limit of the main mask, and of a second, sliding mask. On sliding
/// masks, the row at `pos` also sees the cells up to `through(pos)` (an image
/// decoded non-causally: [`crate::image::Images::sees_through`]), within the step.
#[allow(clippy::too_many_arguments)]
pub(super) fn view(
    n_cells: usize,
    ps: usize,
    pages: &[PageId],
    base: usize,
    (start, end): (usize, usize),
    (limit, swa): (Option<u32>, Option<u32>),
    through: &dyn Fn(usize) -> usize,
    buffers: &mut MaskBuffers,
) -> KvView {
    let n_kv = (end - base).next_multiple_of(KV_WINDOW_PAD).min(n_cells);
    let mut window: Vec<CellRun> = Vec::new();
    for &p in pages {
        let start = p as usize * ps;
        match window.last_mut() {
            Some(r) if r.start + r.len == start => r.len += ps,
            _ => window.push(CellRun { start, len: ps }),
        }
    }
    // Pad to the window size with masked cells (any cells will do).
    let pad = n_kv.saturating_sub(pages.len() * ps);
    if pad > 0 {
        match window.last_mut() {
            Some(r) if r.start + r.len + pad <= n_cells => r.len += pad,
            _ => window.push(CellRun { start: 0, len: pad }),
        }
    }
    let n_rows = end - start;
    let len = n_kv * n_rows;
    let mut mask = MaskBuilder::reusing(buffers.take(len), n_kv, n_rows);
    let mut mask_swa = swa.map(|_| MaskBuilder::reusing(buffers.take(len), n_kv, n_rows));
    for (r, pos) in (start..end).enumerate() {
        let last = through(pos).clamp(pos, end - 1) as i32;
        match limit {
            Some(_) => mask.allow_through_from(r, pos as i32, limit, base as i32, last),
            None => mask.allow_prefix_from(r, pos as i32, limit, base as i32),
        }
        if let Some(m) = mask_swa.as_mut() {
            m.allow_through_from(r, pos as i32, swa, base as i32, last);
        }
    }
    KvView {
        window,
        mask: mask.into_data(),
        mask_swa: mask_swa.map(MaskBuilder::into_data),
    }
}

impl EngineCore {
    /// The step's batch, in `work`'s order: decodes first (they share matmuls),
    /// then prompt chunks. Each sequence gets a view of every cache group: the full
    /// group's from position 0, the sliding group's from the first page its first
    /// row sees.
    pub(super) fn assemble(&mut self, work: &[Work], snapshots: &[Snapshot]) -> StepBatch {
        let ps = self.cache.page_size();
        let hp = self.model.hparams();
        // Sliding layers kept in the full group (`swa_full`, or one group) need the
        // sliding mask beside the full one.
        let full_swa = self.groups[0]
            .layers
            .iter()
            .any(|&l| hp.is_swa[l])
            .then_some(hp.swa_window)
            .flatten();
        let sliding = self.cache.sliding().map(|s| s.window() as u32);
        let mut b = StepBatch {
            kv_slots: vec![Vec::new(); self.groups.len()],
            flash_decode: self.config.flash_decode,
            ..StepBatch::default()
        };
        // Requests verifying drafts on a hybrid model so far (their scratch slots).
        let mut verifying = 0;
        // Per row, its (temporal, row, column) rope position, and image rows'
        // embeddings: kept only when the step has an image row.
        let mut multi: Vec<[i32; 3]> = Vec::new();
        let mut embeds = RowEmbeds::default();
        for w in work {
            let s = &self.running[self.running_index(w.id).expect("planned requests run")];
            b.batch_invariant |= self.config.deterministic || s.deterministic;
            let table = self
                .cache
                .page_table(w.id)
                .expect("running requests hold pages");
            let n_known = s.tokens.len();
            // A decode verifying drafts (see crate::spec): each row is a span of its
            // own, attending over the window it would see decoded alone, so its
            // numbers are exactly those of decoding it without drafts.
            let pieces: Vec<(usize, usize)> = if w.end > n_known {
                (w.start..w.end).map(|p| (p, p + 1)).collect()
            } else {
                vec![(w.start, w.end)]
            };
            let state_slot = self.cache.state_slot(w.id);
            // On a hybrid model, a verifying request's rows carry one state through
            // (continuing spans), and the state after each row but the last goes to
            // a scratch slot, for rolling back rejected drafts.
            let scratch = (w.end > n_known && state_slot.is_some()).then(|| {
                verifying += 1;
                verifying - 1
            });
            let n_pieces = pieces.len();
            // The MTP head drafts from the hidden states of every row it computes.
            if self.feeds_mtp(s) {
                let first = b.tokens.len() as i32;
                b.hidden_rows
                    .extend(first..first + (w.end - w.start) as i32);
            }
            for (j, (start, end)) in pieces.into_iter().enumerate() {
                let row_start = b.tokens.len();
                let full = &table[..end.div_ceil(ps)];
                let mut views = vec![view(
                    self.kv.n_cells(0),
                    ps,
                    full,
                    0,
                    (start, end),
                    (None, full_swa),
                    &|c| s.images.sees_through(c),
                    &mut self.mask_buffers,
                )];
                if let Some(slot) = state_slot {
                    // The recurrent group: the sequence's state slot.
                    views.push(KvView {
                        window: vec![CellRun {
                            start: slot as usize,
                            len: 1,
                        }],
                        mask: Vec::new(),
                        mask_swa: None,
                    });
                }
                if let Some(window) = sliding {
                    let g = self
                        .cache
                        .sliding_window(w.id, start, end)
                        .expect("sliding group");
                    views.push(view(
                        self.kv.n_cells(1),
                        ps,
                        &g.pages,
                        g.base,
                        (start, end),
                        (Some(window), None),
                        &|c| s.images.sees_through(c),
                        &mut self.mask_buffers,
                    ));
                }
                for pos in start..end {
                    let r = pos - w.start;
                    let image = s.images.at_cell(pos);
                    b.tokens.push(match (image, s.tokens.get(pos)) {
                        // The row's input is the image's embedding; its id (a
                        // prefix-cache key) is not a token.
                        (Some(_), _) => 0,
                        (None, Some(&t)) => t,
                        (None, None) => s.draft[pos - n_known],
                    });
                    let rope = s.images.position(pos);
                    b.positions.push(rope[0]);
                    multi.push(rope);
                    if let Some((img, k)) = image {
                        let e = img
                            .embeds
                            .as_ref()
                            .expect("the scheduler plans image rows once encoded");
                        embeds.rows.push((b.tokens.len() - 1) as i32);
                        embeds
                            .values
                            .extend_from_slice(&e.data[k * e.n_embd..(k + 1) * e.n_embd]);
                    }
                    b.kv_slots[0].push(w.cells.full[r] as i64);
                    if sliding.is_some() {
                        b.kv_slots[1].push(w.cells.sliding[r] as i64);
                    }
                    if let Some(slot) = state_slot {
                        b.kv_slots[1].push(slot as i64);
                    }
                }
                // Logits of the last known token's row and of every draft's.
                if end >= n_known {
                    b.output_rows.push((b.tokens.len() - 1) as i32);
                }
                b.seqs.push(SeqSpan {
                    row_start,
                    n_rows: end - start,
                    views,
                    tiled_prompt: s.images.run_len(start, s.n_prompt) >= CHUNK_ALIGN
                        && start < s.n_prompt,
                    state_snapshot: match scratch {
                        Some(i) => (j + 1 < n_pieces).then(|| StateSnapshot {
                            slot: self.spec_states.slot(i, j),
                            back: 0,
                        }),
                        None => snapshots
                            .iter()
                            .find(|x| x.id == w.id)
                            .map(|x| StateSnapshot {
                                slot: x.slot,
                                back: x.back,
                            }),
                    },
                    continues: scratch.is_some() && j > 0,
                });
            }
        }
        if b.output_rows.is_empty() {
            // Only partial prompt chunks: compute one row's logits and ignore them.
            b.output_rows.push(0);
        }
        if !embeds.rows.is_empty() {
            // M-RoPE models: four sections, section-major: temporal, row,
            // column, 0 (others take the temporal position alone).
            if hp.rope_sections.is_some() {
                let n = multi.len();
                let mut pm = Vec::with_capacity(4 * n);
                for sec in 0..3 {
                    pm.extend(multi.iter().map(|p| p[sec]));
                }
                pm.resize(4 * n, 0);
                b.positions_multi = Some(pm);
            }
            b.embeds = Some(embeds);
        }
        b
    }

    /// Runs the model; meanwhile a worker thread computes the constraint masks of
    /// the requests that sample in this step.
    pub(super) fn forward(
        &mut self,
        work: &[Work],
        batch: &StepBatch,
    ) -> Result<StepOutput, ModelError> {
        self.init_states()?;
        let sampling: Vec<RequestId> = work
            .iter()
            .filter(|w| {
                self.running_index(w.id)
                    .is_some_and(|i| w.end >= self.running[i].tokens.len())
            })
            .map(|w| w.id)
            .collect();
        // On a GPU, greedy picks made there save downloading the logits.
        let greedy = self.model.greedy_on_device()
            && self
                .running
                .iter()
                .all(|s| s.plain_greedy() || !sampling.contains(&s.id));
        let EngineCore {
            model,
            exec,
            kv,
            running,
            step_hidden,
            ..
        } = self;
        let constrained: Vec<&mut Live> = running
            .iter_mut()
            .filter(|s| s.constraint.is_some() && sampling.contains(&s.id) && !greedy)
            .collect();
        let (out, hidden) = if constrained.is_empty() {
            model.forward_hidden(exec, kv, batch, greedy)?
        } else {
            std::thread::scope(|sc| {
                let masks = sc.spawn(move || {
                    for s in constrained {
                        let left = s.max_tokens.saturating_sub(s.usage.completion_tokens);
                        let c = s.constraint.as_mut().expect("filtered");
                        s.mask = Some(c.compute_mask_within(left));
                    }
                });
                let out = model.forward_hidden(exec, kv, batch, greedy);
                masks.join().expect("mask worker panicked");
                out
            })?
        };
        *step_hidden = hidden;
        Ok(out)
    }

    /// Sets up the state slots of sequences started since the last step: zeros for
    /// one computed from its first token, a checkpoint's copy for a prefix hit.
    fn init_states(&mut self) -> Result<(), ModelError> {
        let Some(g) = self.recurrent_group() else {
            return Ok(());
        };
        for init in self.cache.take_state_inits() {
            let to = init.slot as usize;
            match init.from {
                Some(from) => self.kv.copy_cells(g, from as usize, to, 1)?,
                None => self.kv.clear_cells(g, to, 1)?,
            }
        }
        Ok(())
    }

    /// Commits the step's KV, samples for every request whose tokens are all
    /// computed, sends events and ends finished requests.
    pub(super) fn after_step(&mut self, work: &[Work], out: &mut StepOutput) {
        let n_vocab = self.model.hparams().n_vocab;
        let answer_checkpoints = self.config.answer_state_checkpoints;
        // Output rows follow the batch order.
        let mut row = 0;
        let mut finished: Vec<(RequestId, FinishReason)> = Vec::new();
        // Requests verifying drafts on a hybrid model so far, as in `assemble`.
        let mut verifying = 0;
        let recurrent = self.recurrent_group();
        // Where the next request's hidden states begin in `step_hidden`.
        let mut hidden_at = 0;
        let n_embd = self.model.hparams().n_embd;
        let hidden = std::mem::take(&mut self.step_hidden);
        for w in work {
            let i = self.running_index(w.id).expect("planned requests run");
            let s = &mut self.running[i];
            let drafted = w.end.saturating_sub(s.tokens.len());
            let mut ended = None;
            if drafted > 0 {
                let v = verify(
                    s,
                    drafted,
                    row,
                    out,
                    n_vocab,
                    &self.tok,
                    self.limits.max_context,
                );
                row += drafted + 1;
                self.stats.generated_tokens_total += v.generated as u64;
                self.stats.draft_tokens_total += drafted as u64;
                self.stats.accepted_draft_tokens_total += v.accepted as u64;
                // The KV of rows whose input was a rejected draft is dropped.
                s.n_computed = w.start + v.valid_rows;
                self.cache
                    .truncate(s.id, s.n_computed)
                    .expect("cells were appended");
                ended = v.finish;
                // A hybrid model's state goes back to after the last valid row.
                if let (Some(g), Some(slot)) = (recurrent, self.cache.state_slot(s.id)) {
                    let i = verifying;
                    verifying += 1;
                    if v.valid_rows <= drafted {
                        let from = self.spec_states.slot(i, v.valid_rows - 1);
                        if let Err(e) = self.kv.copy_cells(g, from as usize, slot as usize, 1) {
                            tracing::error!(error = %e, "rolling back a recurrent state failed");
                            ended = Some(FinishReason::Error(e.to_string()));
                        }
                    }
                }
            } else {
                s.n_computed = w.end;
            }
            if self.mtp.is_some() && s.spec.is_some() {
                // The MTP head takes the hidden states of the rows that stay.
                let valid = s.n_computed - w.start;
                let rows = &hidden[hidden_at..hidden_at + valid * n_embd];
                hidden_at += (w.end - w.start) * n_embd;
                if let Some(m) = self.mtp.as_mut() {
                    m.feed(s.id, w.start, rows);
                }
            }
            // A hybrid model reuses a prefix only where its state was checkpointed:
            // without answer checkpoints, pages an answer filled would only shadow
            // the exactly computed twins of a later prompt that repeats the answer.
            let committed = if self.cache.recurrent().is_some() && !answer_checkpoints {
                s.n_computed.min(s.n_prompt)
            } else {
                s.n_computed
            };
            self.cache
                .commit(s.id, &s.tokens[..committed])
                .expect("cells were appended");
            if w.end == s.n_prompt {
                // A later prompt is likely to fork at or after this one's end.
                let ps = self.cache.page_size();
                self.cache.add_checkpoint(s.id, s.n_prompt / ps * ps);
            }
            if w.end == s.n_prompt && s.usage.preemptions == 0 {
                // Its prompt was computed in pieces starting at multiples of
                // ROW_GROUP: the rows in whole blocks are exact (see partial_page).
                s.exact_cells = partial_page::exact_cells(s.n_prompt);
            }
            if drafted == 0 {
                if w.end < s.tokens.len() {
                    continue;
                }
                ended = match out {
                    StepOutput::Logits(logits) => {
                        let l = &mut logits[row * n_vocab..(row + 1) * n_vocab];
                        sample_one(s, l, &self.tok, self.limits.max_context)
                    }
                    StepOutput::Tokens(ids) => take_token(
                        s,
                        ids[row],
                        None,
                        Vec::new(),
                        &self.tok,
                        self.limits.max_context,
                    ),
                };
                row += 1;
                self.stats.generated_tokens_total += 1;
            }
            if let Some(reason) = ended {
                finished.push((s.id, reason));
            } else if s.tx.is_closed() {
                finished.push((s.id, FinishReason::Cancelled));
            }
        }
        // Before a finished request frees its state slot.
        self.take_state_checkpoints(work);
        for (id, reason) in finished {
            let i = self.running_index(id).expect("still running");
            let s = self.running.remove(i);
            self.end(s, reason);
        }
    }
}

/// What verifying a request's drafts gave (see [`verify`]).
struct Verified {
    /// Rows whose input token was right (the last known token's and each accepted
    /// draft's): their KV stays.
    valid_rows: usize,
    /// Drafts accepted.
    accepted: usize,
    /// Tokens taken (accepted drafts and the token sampled after them).
    generated: usize,
    /// Why the request ended, if it did.
    finish: Option<FinishReason>,
}

/// Samples `s`'s rows `first_row..=first_row + drafted` of `out` in order against
/// its drafts (see [`crate::spec`]): each row's token is taken as decoding without
/// drafts would take it (sampler, constraint, stop conditions); the next row counts
/// while its draft equals the token taken.
fn verify(
    s: &mut Live,
    drafted: usize,
    first_row: usize,
    out: &mut StepOutput,
    n_vocab: usize,
    tok: &Tokenizer,
    max_context: usize,
) -> Verified {
    let draft = std::mem::take(&mut s.draft);
    let mut v = Verified {
        valid_rows: 0,
        accepted: 0,
        generated: 0,
        finish: None,
    };
    for j in 0..=drafted {
        v.valid_rows = j + 1;
        if j > 0 {
            // The constraint's mask after the token just taken (the first row's was
            // computed during the forward pass).
            if let Some(c) = s.constraint.as_mut() {
                let left = s.max_tokens.saturating_sub(s.usage.completion_tokens);
                s.mask = Some(c.compute_mask_within(left));
            }
        }
        let row = first_row + j;
        let finish = match out {
            StepOutput::Logits(logits) => sample_one(
                s,
                &mut logits[row * n_vocab..(row + 1) * n_vocab],
                tok,
                max_context,
            ),
            StepOutput::Tokens(ids) => take_token(s, ids[row], None, Vec::new(), tok, max_context),
        };
        v.generated += 1;
        if finish.is_some() {
            v.finish = finish;
            break;
        }
        // The next row counts only while this row's draft is the token taken.
        if draft.get(j).filter(|_| j < drafted) != s.tokens.last() {
            break;
        }
        v.accepted += 1;
    }
    if let Some(d) = s.spec.as_mut() {
        d.update(drafted, v.accepted);
    }
    s.usage.draft_tokens += drafted;
    s.usage.accepted_draft_tokens += v.accepted;
    v
}
