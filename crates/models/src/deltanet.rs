//! Gated-DeltaNet linear attention (Qwen3.5's recurrent layers): a short causal
//! convolution over Q/K/V, then the gated delta rule, whose state is a
//! `d_state × d_state` matrix per value head. Both states live in the layer's
//! [`crate::GroupKind::Recurrent`] pools, one slot per sequence: a step reads the
//! slot of each of its sequences, runs their tokens through, and writes the new
//! states back into the same slots.
//!
//! ggml's convolution and delta-rule ops take `n_seqs` sequences of equal length
//! at once. A step's sequences are run as [`StateOp`]s: runs of consecutive
//! sequences with the same number of rows (all decode rows of a step are usually
//! one op; a prompt chunk is its own). Each sequence's numbers are those of the
//! sequence alone: the kernels walk each sequence and head on its own, token by
//! token, whatever else the op holds.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::weights::{SpecList, WeightId, WeightUse::*};
use crate::{GroupKind, HParams, StepBatch};

/// Weights of one gated-DeltaNet layer (llama.cpp's converter names).
pub(crate) struct DeltaNet {
    /// Q, K and V projection: `[n_embd, conv_channels]`.
    qkv: WeightId,
    /// Output gate `z`: `[n_embd, d_inner]`.
    gate: WeightId,
    /// Convolution kernel: `[d_conv, conv_channels]`, F32.
    conv: WeightId,
    /// Decay time-step bias per value head.
    dt_bias: WeightId,
    /// `-exp(A_log)` per value head.
    a: WeightId,
    /// Per-head update strength projection: `[n_embd, n_v_heads]`.
    beta: WeightId,
    /// Per-head decay projection: `[n_embd, n_v_heads]`.
    alpha: WeightId,
    /// Gated RMSNorm scale over a head: `[d_state]`.
    norm: WeightId,
    /// Output projection: `[d_inner, n_embd]`.
    out: WeightId,
}

impl DeltaNet {
    /// Declares layer `il`'s weights.
    pub fn declare(hp: &HParams, _file: &GgufFile, specs: &mut SpecList, il: usize) -> DeltaNet {
        let ssm = hp.ssm.expect("a hybrid model has DeltaNet shapes");
        let (e, c, inner, hv) = (hp.n_embd, ssm.conv_channels(), ssm.d_inner(), ssm.n_v_heads);
        let n = |s: &str| format!("blk.{il}.{s}");
        DeltaNet {
            qkv: specs.add(n("attn_qkv.weight"), &[e, c], MatMul),
            gate: specs.add(n("attn_gate.weight"), &[e, inner], MatMul),
            conv: specs.add(n("ssm_conv1d.weight"), &[ssm.d_conv, c], Elementwise),
            dt_bias: specs.add(n("ssm_dt.bias"), &[hv], Elementwise),
            a: specs.add(n("ssm_a"), &[hv], Elementwise),
            beta: specs.add(n("ssm_beta.weight"), &[e, hv], MatMul),
            alpha: specs.add(n("ssm_alpha.weight"), &[e, hv], MatMul),
            norm: specs.add(n("ssm_norm.weight"), &[ssm.d_state], Elementwise),
            out: specs.add(n("ssm_out.weight"), &[inner, e], MatMul),
        }
    }
}

/// Consecutive sequences of a step with the same number of rows, run through the
/// convolution and delta rule as one batch of sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StateOp {
    /// First token row.
    pub row_start: usize,
    /// Rows of each sequence.
    pub n_rows: usize,
    /// Each sequence's state slot, in row order.
    pub slots: Vec<i32>,
    /// Mid-chunk states to keep: (sequence index in the op, rows back from the
    /// chunk's end, slot written). See [`crate::SeqSpan::state_snapshot`].
    pub snaps: Vec<(usize, usize, i32)>,
}

/// The state ops of `batch` for its recurrent cache group (none without one).
///
/// Spans that continue the previous one ([`crate::SeqSpan::continues`]) join its
/// sequence: one state walks through all their rows, and each span's snapshot
/// counts its rows back from the end of the joined sequence.
pub(crate) fn plan(batch: &StepBatch, groups: &[GroupKind]) -> Vec<StateOp> {
    let Some(g) = groups.iter().position(|k| *k == GroupKind::Recurrent) else {
        return Vec::new();
    };
    // The step's recurrent sequences, continuing spans joined.
    struct Chain {
        row_start: usize,
        n_rows: usize,
        slot: i32,
        /// (rows back from the chain's end, slot written).
        snaps: Vec<(usize, i32)>,
    }
    let mut chains: Vec<Chain> = Vec::new();
    for s in &batch.seqs {
        let slot = s.views[g].window[0].start as i32;
        match chains.last_mut() {
            Some(c) if s.continues => {
                for snap in &mut c.snaps {
                    snap.0 += s.n_rows;
                }
                c.n_rows += s.n_rows;
            }
            _ => chains.push(Chain {
                row_start: s.row_start,
                n_rows: s.n_rows,
                slot,
                snaps: Vec::new(),
            }),
        }
        if let Some(snap) = s.state_snapshot {
            let c = chains.last_mut().expect("pushed above");
            c.snaps.push((snap.back, snap.slot as i32));
        }
    }
    let mut ops: Vec<StateOp> = Vec::new();
    for c in chains {
        match ops.last_mut() {
            Some(op) if op.n_rows == c.n_rows => op.slots.push(c.slot),
            _ => ops.push(StateOp {
                row_start: c.row_start,
                n_rows: c.n_rows,
                slots: vec![c.slot],
                snaps: Vec::new(),
            }),
        }
        let op = ops.last_mut().expect("pushed above");
        let i = op.slots.len() - 1;
        op.snaps
            .extend(c.snaps.into_iter().map(|(back, slot)| (i, back, slot)));
    }
    ops
}

/// One state op's graph input: its sequences' slots (I32), and for its snapshots
/// (sequence index in the op, rows back) with their inputs: the snapshot rows to
/// gather and the slots they go to (I32).
#[derive(Clone)]
pub(crate) struct StateInputs<'a> {
    pub row_start: usize,
    pub n_rows: usize,
    pub slots: Tensor<'a>,
    pub snaps: Vec<(usize, usize)>,
    pub snap_io: Option<(Tensor<'a>, Tensor<'a>)>,
}

/// `x / sqrt(sum(x^2) + eps)` over dim 0, written as llama.cpp writes it (an RMS
/// norm with a scaled epsilon, then a scale), so it rounds the same way.
fn l2_norm<'a>(b: &Builder<'a>, x: Tensor<'a>) -> Tensor<'a> {
    let n = x.ne()[0] as f32;
    b.ctx
        .scale(b.ctx.rms_norm(x, b.hp.rms_eps / n), 1.0 / n.sqrt())
}

impl<'a> Builder<'a> {
    /// A gated-DeltaNet layer on the normed input `h` (`[n_embd, n_tokens]`):
    /// reads and updates each sequence's states in layer `il`'s pools. Returns
    /// `[n_embd, n_tokens]`.
    pub fn delta_net(&mut self, il: usize, l: &DeltaNet, h: Tensor<'a>) -> Tensor<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let ssm = hp.ssm.expect("a hybrid model has DeltaNet shapes");
        let (s, hk, hv) = (
            ssm.d_state as i64,
            ssm.n_k_heads as i64,
            ssm.n_v_heads as i64,
        );
        let (c, k_conv) = (ssm.conv_channels() as i64, ssm.d_conv as i64);
        let n_t = self.inp.n_tokens as i64;
        let qkv = self.linear(l.qkv, h, None); // [c, n_t]
        let z = self.linear(l.gate, h, None); // [d_inner, n_t]
        let beta = ctx.sigmoid(self.linear(l.beta, h, None)); // [hv, n_t]
        let alpha = self.linear(l.alpha, h, None);
        let g = ctx.mul(
            ctx.softplus(ctx.add(alpha, self.wt(l.dt_bias))),
            self.wt(l.a),
        );
        let (conv_pool, ssm_pool) = (self.kv.k(il), self.kv.v(il));
        let f32b = 4usize;
        let ops = self.inp.states.clone();
        let mut outs = Vec::with_capacity(ops.len());
        for op in &ops {
            let (t, n) = (op.n_rows as i64, op.slots.ne()[0]);
            let rows = |x: Tensor<'a>, shape: &[i64]| {
                let nb1 = x.nb()[1];
                let v = ctx.view(x, &[x.ne()[0], t * n], &[nb1], op.row_start * nb1);
                ctx.reshape(v, shape)
            };
            let qkv_op = {
                let nb1 = qkv.nb()[1];
                ctx.view(
                    qkv,
                    &[c, t, n],
                    &[nb1, nb1 * t as usize],
                    op.row_start * nb1,
                )
            };
            // Convolution over the previous d_conv - 1 inputs and this chunk's.
            let conv_state = ctx.reshape(ctx.get_rows(conv_pool, op.slots), &[k_conv - 1, c, n]);
            let conv_in = ctx.concat(conv_state, ctx.transpose(qkv_op), 0); // [k-1+t, c, n]
            let last = ctx.view(
                conv_in,
                &[k_conv - 1, c, n],
                &[conv_in.nb()[1], conv_in.nb()[2]],
                t as usize * f32b,
            );
            let last = ctx.reshape(ctx.cont(last), &[(k_conv - 1) * c, n]);
            let w = ctx.set_rows(conv_pool, last, op.slots);
            self.graph.expand(w);
            // Snapshots' convolution states: the d_conv - 1 inputs before their row.
            if let Some((_, snap_slots)) = op.snap_io {
                let parts = op
                    .snaps
                    .iter()
                    .map(|&(i, back)| {
                        let v = ctx.view(
                            conv_in,
                            &[k_conv - 1, c],
                            &[conv_in.nb()[1]],
                            i * conv_in.nb()[2] + (t as usize - back) * f32b,
                        );
                        ctx.reshape(ctx.cont(v), &[(k_conv - 1) * c, 1])
                    })
                    .collect();
                let rows = self.concat_all(parts, 1);
                self.graph.expand(ctx.set_rows(conv_pool, rows, snap_slots));
            }
            let conv = ctx.silu(ctx.ssm_conv(conv_in, self.wt(l.conv))); // [c, t, n]
            let nb1 = conv.nb()[1];
            let head = |heads: i64, offset: i64| {
                ctx.view(
                    conv,
                    &[s, heads, t, n],
                    &[s as usize * f32b, nb1, nb1 * t as usize],
                    offset as usize * f32b,
                )
            };
            let q = l2_norm(self, head(hk, 0));
            let k = l2_norm(self, head(hk, hk * s));
            let v = head(hv, 2 * hk * s);
            let state = ctx.reshape(ctx.get_rows(ssm_pool, op.slots), &[s, s, hv, n]);
            // States kept per sequence: one more than the deepest snapshot.
            let n_snap = op.snaps.iter().map(|s| s.1 + 1).max().unwrap_or(1);
            let res = ctx.gated_delta_net(
                q,
                k,
                v,
                rows(g, &[1, hv, t, n]),
                rows(beta, &[1, hv, t, n]),
                state,
                n_snap,
            );
            let out_len = (s * hv * t * n) as usize;
            let new_state = ctx.view(
                res,
                &[s * s * hv, n],
                &[(s * s * hv) as usize * f32b],
                out_len * f32b,
            );
            let w = ctx.set_rows(ssm_pool, new_state, op.slots);
            self.graph.expand(w);
            // Snapshots' delta-rule states: rows `back * n + i` of the snapshots.
            if let Some((snap_rows, snap_slots)) = op.snap_io {
                let all = ctx.view(
                    res,
                    &[s * s * hv, n * n_snap as i64],
                    &[(s * s * hv) as usize * f32b],
                    out_len * f32b,
                );
                let picked = ctx.get_rows(all, snap_rows);
                self.graph
                    .expand(ctx.set_rows(ssm_pool, picked, snap_slots));
            }
            outs.push(ctx.view(res, &[s * hv, t * n], &[(s * hv) as usize * f32b], 0));
        }
        let o = self.concat_all(outs, 1); // [s * hv, n_t]
        let o = ctx.reshape(o, &[s, hv, n_t]);
        let y = ctx.mul(
            self.rms_norm(o, l.norm),
            ctx.silu(ctx.reshape(z, &[s, hv, n_t])),
        );
        let y = ctx.reshape(y, &[s * hv, n_t]);
        self.linear(l.out, y, None)
    }
}
