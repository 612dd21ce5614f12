//! The draft model of speculative decoding's `draft` mode: a second, smaller model
//! with the same vocabulary proposes each speculating request's next tokens by
//! greedy decoding (see [`crate::spec`]; the target model verifies them, so output
//! does not depend on the drafts).
//!
//! The draft keeps its own KV in pages of its own shape, carved from the same KV
//! budget, with its own prefix cache: a request's draft sequence holds the KV of the
//! request's tokens (and of the drafts it proposed last, which stay where the target
//! accepted them). Before drafting, a request's draft sequence drops what the target
//! rejected and catches up on the tokens the target took, then decodes up to `k`
//! tokens; all requests drafting in a step share each of those forward passes.

use std::collections::HashMap;
use std::sync::Arc;

use tempo9_models::{Executor, KvStore, Model, ModelError, SeqSpan, StepBatch, StepOutput};

use super::runner::{view, MaskBuffers};
use crate::pages::{PagePool, SeqId};
use crate::request::RequestId;

/// Most catch-up tokens in one forward pass of the draft model: a long prompt's
/// first drafting catches up in pieces, so its masks and compute buffers stay small.
const CATCH_UP_TOKENS: usize = 512;

/// A second model that proposes drafts (the `draft` speculation mode).
#[derive(Clone)]
pub struct DraftModel(pub Arc<Model>);

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hp = self.0.hparams();
        f.debug_struct("DraftModel")
            .field("arch", &hp.arch.name())
            .field("layers", &hp.n_layer)
            .finish()
    }
}

impl DraftModel {
    /// Checks that the draft can propose tokens for `target`: the same token list
    /// (ids mean the same text), and KV it can page (no recurrent state).
    pub fn check_compatible(&self, target: &Model) -> Result<(), String> {
        let tokens = |m: &Model| {
            m.gguf()
                .metadata()
                .get_str_array("tokenizer.ggml.tokens")
                .ok()
                .flatten()
                .map(<[String]>::to_vec)
        };
        match (tokens(&self.0), tokens(target)) {
            (Some(a), Some(b)) if a == b => {}
            (Some(a), Some(b)) => {
                let first = a.iter().zip(&b).position(|(x, y)| x != y);
                return Err(match first {
                    Some(i) => format!(
                        "the draft model's vocabulary differs from the target's at token {i} ({:?} vs {:?})",
                        a[i], b[i]
                    ),
                    None => format!(
                        "the draft model's vocabulary has {} tokens, the target's {}",
                        a.len(),
                        b.len()
                    ),
                });
            }
            _ => return Err("a model file has no token list (tokenizer.ggml.tokens)".into()),
        }
        if self.0.hparams().ssm.is_some() {
            return Err("a hybrid (recurrent-state) model cannot be a draft model".into());
        }
        Ok(())
    }
}

/// What the draft model holds and runs with.
pub(super) struct Drafter {
    model: Arc<Model>,
    exec: Executor,
    kv: Arc<KvStore>,
    pool: PagePool,
    /// Per request: the tokens whose KV its draft sequence holds.
    written: HashMap<RequestId, Vec<u32>>,
    /// Sliding-window layers of the draft (kept in its one full group) need their
    /// own mask beside the full one.
    full_swa: Option<u32>,
    masks: MaskBuffers,
    n_vocab: usize,
}

/// What proposes drafts by running a model: the draft model ([`Drafter`]) or the
/// model's own MTP head (`super::mtp::MtpDrafter`).
pub(super) trait ModelDrafter {
    /// Drafts for each job, in order (empty where it has no room for the job).
    fn propose(&mut self, jobs: &[DraftJob<'_>]) -> Result<Vec<Vec<u32>>, ModelError>;
    /// Forgets request `id` (its committed pages stay cached).
    fn free(&mut self, id: RequestId);
    /// How many of request `id`'s `tokens` the next [`ModelDrafter::propose`]
    /// computes before its first draft (at least the last one).
    fn behind(&self, id: RequestId, tokens: &[u32]) -> usize;
}

/// Tokens to compute for a request whose drafting model has `written` tokens in
/// place (`None`: a new request, `cached` of its tokens in the prefix cache).
pub(super) fn behind(
    written: Option<&[u32]>,
    cached: impl FnOnce() -> usize,
    tokens: &[u32],
) -> usize {
    let n = tokens.len();
    let have = match written {
        Some(w) => w.iter().zip(tokens).take_while(|(a, b)| a == b).count(),
        None => cached(),
    };
    n - have.min(n.saturating_sub(1))
}

/// One request drafting in a step.
pub(super) struct DraftJob<'a> {
    pub id: RequestId,
    /// The request's tokens; the last one is the token the target computes next.
    pub tokens: &'a [u32],
    /// Drafts wanted.
    pub k: usize,
}

impl Drafter {
    /// Sets up the draft model with KV pages for `n_tokens` tokens of `page_tokens`
    /// each, on the draft model's device.
    pub fn new(
        draft: &DraftModel,
        threads: usize,
        n_tokens: usize,
        page_tokens: usize,
    ) -> Result<Drafter, ModelError> {
        let model = draft.0.clone();
        // One group: sliding-window layers keep every token (`swa_full`), so a draft
        // sequence is just a page table.
        let groups = model.cache_groups(true);
        let n_pages = n_tokens.div_ceil(page_tokens).max(1);
        let kv = model.new_kv(&groups, &[n_pages * page_tokens])?;
        let hp = model.hparams();
        let full_swa = groups[0]
            .layers
            .iter()
            .any(|&l| hp.is_swa[l])
            .then_some(hp.swa_window)
            .flatten();
        Ok(Drafter {
            exec: Executor::new(model.device(), threads)?,
            n_vocab: hp.n_vocab,
            model,
            kv,
            pool: PagePool::new(n_pages, page_tokens),
            written: HashMap::new(),
            full_swa,
            masks: MaskBuffers::default(),
        })
    }

    /// Bytes of one token's K and V in the draft model (F16 rows, every layer
    /// that keeps K/V).
    pub fn token_bytes(draft: &DraftModel) -> usize {
        let hp = draft.0.hparams();
        let owners: Vec<usize> = (0..hp.n_layer).filter(|&il| hp.owns_kv(il)).collect();
        hp.cell_bytes(&owners)
    }

    /// Prepares job `j`'s draft sequence: drops the KV of tokens the target did not
    /// take, starts it on the draft's prefix cache if new. Returns the position the
    /// draft computes from (`None`: no room in the draft's pool, no drafts).
    fn start(&mut self, j: &DraftJob<'_>) -> Option<usize> {
        let seq = j.id as SeqId;
        if let Some(w) = self.written.get_mut(&j.id) {
            let common = w.iter().zip(j.tokens).take_while(|(a, b)| a == b).count();
            // At least one token to compute: the last one's logits are needed.
            let keep = common.min(j.tokens.len() - 1);
            if keep < w.len() {
                self.pool.truncate(seq, keep).ok()?;
                w.truncate(keep);
            }
            let n = w.len();
            if self.pool.append_slots(seq, j.tokens.len() - n).is_err() {
                self.free(j.id);
                return None;
            }
            return Some(n);
        }
        let m = self.pool.allocate(seq, j.tokens, 0).ok()?;
        let n = m.n_cached_tokens;
        if self.pool.append_slots(seq, j.tokens.len() - n).is_err() {
            let _ = self.pool.free(seq);
            return None;
        }
        self.written.insert(j.id, j.tokens[..n].to_vec());
        Some(n)
    }

    /// One forward pass of the draft over `rows` (job index, its next tokens, whether
    /// its logits are wanted); cells for the rows were appended in [`Self::start`],
    /// or are appended here for decode rows. Returns each row group's greedy pick.
    fn forward(
        &mut self,
        jobs: &[DraftJob<'_>],
        starts: &mut [usize],
        rows: &[(usize, Vec<u32>, bool)],
    ) -> Result<Vec<u32>, ModelError> {
        let ps = self.pool.page_size();
        let n_cells = self.kv.n_cells(0);
        let mut b = StepBatch {
            kv_slots: vec![Vec::new()],
            ..StepBatch::default()
        };
        for (i, toks, _) in rows {
            let id = jobs[*i].id;
            let seq = id as SeqId;
            let start = starts[*i];
            let end = start + toks.len();
            let held = self.pool.n_tokens(seq).unwrap_or(0);
            if held < end {
                // A decode row: its cell was not appended with the catch-up.
                self.pool
                    .append_slots(seq, end - held)
                    .map_err(|e| ModelError::BadBatch(format!("draft KV: {e}")))?;
            }
            let table = self.pool.page_table(seq).expect("started");
            let row_start = b.tokens.len();
            for (r, &t) in toks.iter().enumerate() {
                let pos = start + r;
                b.tokens.push(t);
                b.positions.push(pos as i32);
                b.kv_slots[0].push(self.pool.cell(table[pos / ps], pos % ps) as i64);
            }
            b.output_rows.push((b.tokens.len() - 1) as i32);
            b.seqs.push(SeqSpan {
                row_start,
                n_rows: toks.len(),
                views: vec![view(
                    n_cells,
                    ps,
                    &table[..end.div_ceil(ps)],
                    0,
                    (start, end),
                    (None, self.full_swa),
                    // Drafts are text: causal.
                    &|c| c,
                    &mut self.masks,
                )],
                ..SeqSpan::default()
            });
            starts[*i] = end;
            self.written
                .get_mut(&id)
                .expect("started")
                .extend_from_slice(toks);
        }
        let out =
            self.model
                .forward_step(&mut self.exec, &self.kv, &b, self.model.greedy_on_device());
        self.masks.give_back(b);
        let picks = match out? {
            StepOutput::Tokens(ids) => ids,
            StepOutput::Logits(l) => l.chunks(self.n_vocab).map(argmax).collect(),
        };
        // Whole pages of the request's own tokens (not drafts) join the draft's
        // prefix cache, for the next request with the same prefix. Not its last
        // token: a step that did not run the request leaves it to compute again (its
        // logits give the first draft), and final pages cannot be truncated.
        for (i, _, _) in rows {
            let id = jobs[*i].id;
            let n = (jobs[*i].tokens.len() - 1).min(starts[*i]);
            let _ = self
                .pool
                .commit_full_pages(id as SeqId, &jobs[*i].tokens[..n]);
        }
        Ok(picks)
    }
}

impl ModelDrafter for Drafter {
    /// Forgets request `id`'s draft sequence (its committed pages stay cached).
    fn free(&mut self, id: RequestId) {
        if self.written.remove(&id).is_some() {
            let _ = self.pool.free(id as SeqId);
        }
    }

    fn behind(&self, id: RequestId, tokens: &[u32]) -> usize {
        behind(
            self.written.get(&id).map(Vec::as_slice),
            || self.pool.lookup_prefix(tokens, 0).n_cached_tokens,
            tokens,
        )
    }

    /// Drafts for each job, in order (empty where the draft's KV pool is full).
    fn propose(&mut self, jobs: &[DraftJob<'_>]) -> Result<Vec<Vec<u32>>, ModelError> {
        let mut drafts = vec![Vec::new(); jobs.len()];
        // Per job: the draft tokens still to compute, as (position, token) rows.
        let mut pending: Vec<Vec<u32>> = Vec::with_capacity(jobs.len());
        let mut starts: Vec<usize> = Vec::with_capacity(jobs.len());
        for j in jobs {
            let from = self.start(j);
            starts.push(from.unwrap_or(0));
            pending.push(from.map_or_else(Vec::new, |n| j.tokens[n..].to_vec()));
        }
        // Catch up on the request's tokens; the last one's logits give the first draft.
        while pending.iter().any(|p| !p.is_empty()) {
            let mut rows: Vec<(usize, Vec<u32>, bool)> = Vec::new();
            let mut budget = CATCH_UP_TOKENS;
            for (i, p) in pending.iter_mut().enumerate() {
                if p.is_empty() || budget == 0 {
                    continue;
                }
                let n = p.len().min(budget);
                budget -= n;
                let last = n == p.len();
                rows.push((i, p.drain(..n).collect(), last));
            }
            let picks = self.forward(jobs, &mut starts, &rows)?;
            for ((i, _, last), t) in rows.iter().zip(picks) {
                if *last && jobs[*i].k > 0 {
                    drafts[*i].push(t);
                }
            }
        }
        // Then decode: each draft is the next row's input.
        for depth in 1..jobs.iter().map(|j| j.k).max().unwrap_or(0) {
            let rows: Vec<(usize, Vec<u32>, bool)> = (0..jobs.len())
                .filter(|&i| drafts[i].len() == depth && jobs[i].k > depth)
                .map(|i| (i, vec![drafts[i][depth - 1]], true))
                .collect();
            if rows.is_empty() {
                break;
            }
            let picks = self.forward(jobs, &mut starts, &rows)?;
            for ((i, _, _), t) in rows.iter().zip(picks) {
                drafts[*i].push(t);
            }
        }
        Ok(drafts)
    }
}

/// The highest logit's index (the first of ties).
pub(super) fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (t, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = t;
        }
    }
    best as u32
}
