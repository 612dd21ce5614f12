//! The MTP head of speculative decoding's `mtp` mode: the model's own
//! multi-token-prediction block (Qwen3.5's `nextn` layer) proposes each speculating
//! request's next tokens (see [`crate::spec`]; the model verifies them, so output
//! does not depend on the drafts).
//!
//! The head is one attention block whose row at position `p` combines token `p`
//! with the model's final hidden state at `p - 1` and predicts token `p + 1`. It
//! keeps its own KV (one layer, in pages of its own, carved from the KV budget)
//! with its own prefix cache, keyed by tokens like the model's: a position's K/V
//! depends only on its token and the hidden state before it, itself a function of
//! the tokens. Each step hands the head the hidden states of the rows the model
//! computed and kept ([`MtpDrafter::feed`]); before the next step, a speculating
//! request's head catches up on the positions it has not seen, whose last row
//! (the token just sampled) gives the first draft, then decodes up to `k - 1` more
//! from its own hidden states. Draft rows are dropped at the next catch-up.
//!
//! Positions whose preceding hidden state the head never received (a prefix the
//! model took from its cache deeper than the head's own cache) are computed from a
//! zero state: drafts there are poorer, and those pages are not shared.

use std::collections::HashMap;
use std::sync::Arc;

use tempo9_models::{Executor, KvStore, Model, ModelError, SeqSpan, StepBatch, StepOutput};

use super::draft::{argmax, DraftJob, ModelDrafter};
use super::runner::{view, MaskBuffers};
use crate::pages::{PagePool, SeqId};
use crate::request::RequestId;

/// Most catch-up rows in one forward pass of the head: a long prompt catches up in
/// pieces, so masks and compute buffers stay small.
const CATCH_UP_TOKENS: usize = 512;

/// What the MTP head holds and runs with.
pub(super) struct MtpDrafter {
    model: Arc<Model>,
    exec: Executor,
    kv: Arc<KvStore>,
    pool: PagePool,
    seqs: HashMap<RequestId, MtpSeq>,
    /// Hidden states received per request, not yet consumed: (position of the
    /// first, `n_embd` floats per position).
    fed: HashMap<RequestId, (usize, Vec<f32>)>,
    masks: MaskBuffers,
    n_embd: usize,
    n_vocab: usize,
}

/// A request's sequence in the head.
struct MtpSeq {
    /// The tokens whose K/V the head holds as computed from the model's hidden
    /// states (its catch-up positions; draft rows past them are provisional).
    written: Vec<u32>,
    /// The first position computed from a made-up (zero) hidden state, if any:
    /// pages from there on are not shared.
    inexact_from: Option<usize>,
}

/// Rows of one forward pass of the head: per job index, its (position, token,
/// preceding hidden state) rows and whether its last row's pick is a draft.
struct Rows {
    job: usize,
    start: usize,
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    draft: bool,
}

impl MtpDrafter {
    /// Sets up `model`'s MTP head with KV pages for `n_tokens` tokens of
    /// `page_tokens` each.
    pub fn new(
        model: &Arc<Model>,
        threads: usize,
        n_tokens: usize,
        page_tokens: usize,
    ) -> Result<MtpDrafter, ModelError> {
        let n_pages = n_tokens.div_ceil(page_tokens).max(1);
        let hp = model.hparams();
        Ok(MtpDrafter {
            exec: Executor::new(model.device(), threads)?,
            kv: model.new_mtp_kv(n_pages * page_tokens)?,
            pool: PagePool::new(n_pages, page_tokens),
            seqs: HashMap::new(),
            fed: HashMap::new(),
            masks: MaskBuffers::default(),
            n_embd: hp.n_embd,
            n_vocab: hp.n_vocab,
            model: model.clone(),
        })
    }

    /// Takes the model's hidden states of request `id`'s positions `start..`
    /// (`n_embd` floats each), computed and kept in the last step.
    pub fn feed(&mut self, id: RequestId, start: usize, rows: &[f32]) {
        let e = self.n_embd;
        match self.fed.get_mut(&id) {
            Some((first, h)) if *first + h.len() / e == start => h.extend_from_slice(rows),
            // Not where the last ones ended (the model recomputes after a
            // preemption): start over from these.
            _ => {
                self.fed.insert(id, (start, rows.to_vec()));
            }
        }
    }

    /// Prepares job `j`'s sequence: drops its draft rows and anything the request
    /// no longer holds, starts it on the head's prefix cache if new. Returns the
    /// first position to compute (`None`: no room in the head's pool, no drafts).
    fn start(&mut self, j: &DraftJob<'_>) -> Option<usize> {
        let seq = j.id as SeqId;
        let n = j.tokens.len();
        if let Some(s) = self.seqs.get_mut(&j.id) {
            let common = s.written.iter().zip(j.tokens).take_while(|(a, b)| a == b);
            // At least one row to compute: the last one gives the first draft.
            let keep = common.count().min(n - 1);
            s.written.truncate(keep);
            // Rows from `keep` on are computed again.
            if s.inexact_from.is_some_and(|p| p >= keep) {
                s.inexact_from = None;
            }
            if self.pool.truncate(seq, keep).is_err()
                || self.pool.append_slots(seq, n - keep).is_err()
            {
                self.free(j.id);
                return None;
            }
            return Some(keep);
        }
        let m = self.pool.allocate(seq, j.tokens, 0).ok()?;
        let from = m.n_cached_tokens.min(n - 1);
        if self.pool.truncate(seq, from).is_err() || self.pool.append_slots(seq, n - from).is_err()
        {
            let _ = self.pool.free(seq);
            return None;
        }
        self.seqs.insert(
            j.id,
            MtpSeq {
                written: j.tokens[..from].to_vec(),
                inexact_from: None,
            },
        );
        Some(from)
    }

    /// Shares the whole pages of each job's caught-up positions computed from the
    /// model's hidden states (not the last token's row: the next catch-up
    /// recomputes it if the step does not run the request, and final pages cannot
    /// be truncated).
    fn commit(&mut self, jobs: &[DraftJob<'_>]) {
        for j in jobs {
            let Some(s) = self.seqs.get(&j.id) else {
                continue;
            };
            let n = (j.tokens.len() - 1)
                .min(s.written.len())
                .min(s.inexact_from.unwrap_or(usize::MAX));
            let _ = self.pool.commit_full_pages(j.id as SeqId, &j.tokens[..n]);
        }
    }

    /// One forward pass of the head over `pass`; cells were appended in
    /// [`Self::start`] for catch-up rows, and are appended here for draft rows.
    /// Returns each row group's greedy pick and the head's hidden state there.
    fn forward(
        &mut self,
        jobs: &[DraftJob<'_>],
        pass: &[Rows],
    ) -> Result<(Vec<u32>, Vec<f32>), ModelError> {
        let ps = self.pool.page_size();
        let n_cells = self.kv.n_cells(0);
        let mut b = StepBatch {
            kv_slots: vec![Vec::new()],
            ..StepBatch::default()
        };
        let mut h_in = Vec::new();
        for r in pass {
            let seq = jobs[r.job].id as SeqId;
            let end = r.start + r.tokens.len();
            let held = self.pool.n_tokens(seq).unwrap_or(0);
            if held < end {
                // A draft row: its cell was not appended with the catch-up.
                self.pool
                    .append_slots(seq, end - held)
                    .map_err(|e| ModelError::BadBatch(format!("MTP KV: {e}")))?;
            }
            let table = self.pool.page_table(seq).expect("started");
            let row_start = b.tokens.len();
            for (k, &t) in r.tokens.iter().enumerate() {
                let pos = r.start + k;
                b.tokens.push(t);
                b.positions.push(pos as i32);
                b.kv_slots[0].push(self.pool.cell(table[pos / ps], pos % ps) as i64);
            }
            b.output_rows.push((b.tokens.len() - 1) as i32);
            b.seqs.push(SeqSpan {
                row_start,
                n_rows: r.tokens.len(),
                views: vec![view(
                    n_cells,
                    ps,
                    &table[..end.div_ceil(ps)],
                    0,
                    (r.start, end),
                    (None, None),
                    // Drafts are text: causal.
                    &|c| c,
                    &mut self.masks,
                )],
                ..SeqSpan::default()
            });
            h_in.extend_from_slice(&r.hidden);
        }
        b.hidden_rows = b.output_rows.clone();
        let greedy = self.model.greedy_on_device();
        let out = self
            .model
            .mtp_forward(&mut self.exec, &self.kv, &b, &h_in, greedy);
        self.masks.give_back(b);
        let (out, hidden) = out?;
        let picks = match out {
            StepOutput::Tokens(ids) => ids,
            StepOutput::Logits(l) => l.chunks(self.n_vocab).map(argmax).collect(),
        };
        Ok((picks, hidden))
    }
}

impl ModelDrafter for MtpDrafter {
    /// Forgets request `id` (its committed pages stay cached).
    fn free(&mut self, id: RequestId) {
        self.fed.remove(&id);
        if self.seqs.remove(&id).is_some() {
            let _ = self.pool.free(id as SeqId);
        }
    }

    fn behind(&self, id: RequestId, tokens: &[u32]) -> usize {
        super::draft::behind(
            self.seqs.get(&id).map(|s| s.written.as_slice()),
            || self.pool.lookup_prefix(tokens, 0).n_cached_tokens,
            tokens,
        )
    }

    /// Drafts for each job, in order (empty where the head's KV pool is full).
    fn propose(&mut self, jobs: &[DraftJob<'_>]) -> Result<Vec<Vec<u32>>, ModelError> {
        let e = self.n_embd;
        let mut drafts = vec![Vec::new(); jobs.len()];
        // Catch-up rows per job: positions it has not seen up to its last token.
        let mut pending: Vec<Rows> = Vec::new();
        for (i, j) in jobs.iter().enumerate() {
            let Some(from) = self.start(j) else {
                continue;
            };
            let n = j.tokens.len();
            let fed = self.fed.remove(&j.id);
            let mut hidden = vec![0f32; (n - from) * e];
            let mut made_up = None;
            for p in from..n {
                // Position p's row takes the hidden state of position p - 1.
                let got = p.checked_sub(1).and_then(|q| {
                    let (first, h) = fed.as_ref()?;
                    let r = q.checked_sub(*first)?;
                    h.get(r * e..(r + 1) * e)
                });
                match got {
                    Some(h) => hidden[(p - from) * e..(p - from + 1) * e].copy_from_slice(h),
                    None if p > 0 => made_up = made_up.or(Some(p)),
                    None => {}
                }
            }
            if let Some(p) = made_up {
                let s = self.seqs.get_mut(&j.id).expect("started");
                s.inexact_from = Some(s.inexact_from.map_or(p, |q| q.min(p)));
            }
            pending.push(Rows {
                job: i,
                start: from,
                tokens: j.tokens[from..].to_vec(),
                hidden,
                draft: j.k > 0,
            });
        }
        // Catch up; each job's last row gives its first draft.
        let mut last_h: HashMap<usize, Vec<f32>> = HashMap::new();
        while !pending.is_empty() {
            let mut pass = Vec::new();
            let mut budget = CATCH_UP_TOKENS;
            let mut rest = Vec::new();
            for mut r in pending {
                if budget == 0 {
                    rest.push(r);
                    continue;
                }
                let n = r.tokens.len().min(budget);
                budget -= n;
                if n < r.tokens.len() {
                    let tail = Rows {
                        job: r.job,
                        start: r.start + n,
                        tokens: r.tokens.split_off(n),
                        hidden: r.hidden.split_off(n * e),
                        draft: r.draft,
                    };
                    r.draft = false;
                    rest.push(tail);
                }
                pass.push(r);
            }
            let (picks, hidden) = self.forward(jobs, &pass)?;
            for (k, r) in pass.iter().enumerate() {
                if r.draft {
                    drafts[r.job].push(picks[k]);
                    last_h.insert(r.job, hidden[k * e..(k + 1) * e].to_vec());
                }
                let s = self.seqs.get_mut(&jobs[r.job].id).expect("started");
                s.written.extend_from_slice(&r.tokens);
            }
            pending = rest;
        }
        self.commit(jobs);
        // Then decode from the head's own hidden states.
        for depth in 1..jobs.iter().map(|j| j.k).max().unwrap_or(0) {
            let pass: Vec<Rows> = (0..jobs.len())
                .filter(|&i| drafts[i].len() == depth && jobs[i].k > depth)
                .map(|i| Rows {
                    job: i,
                    start: jobs[i].tokens.len() + depth - 1,
                    tokens: vec![drafts[i][depth - 1]],
                    hidden: last_h.remove(&i).expect("drafted"),
                    draft: true,
                })
                .collect();
            if pass.is_empty() {
                break;
            }
            let (picks, hidden) = self.forward(jobs, &pass)?;
            for (k, r) in pass.iter().enumerate() {
                drafts[r.job].push(picks[k]);
                last_h.insert(r.job, hidden[k * e..(k + 1) * e].to_vec());
            }
        }
        Ok(drafts)
    }
}
