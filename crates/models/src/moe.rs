//! Mixture-of-experts feed-forward (Qwen3-MoE, Qwen3.5-MoE): a router picks the
//! top-k experts of each token by softmax probability, their weights are
//! renormalised to sum to one, and the chosen experts' SwiGLU outputs are summed
//! with those weights. GPT-OSS instead picks the top-k router logits (router and
//! experts have biases) and softmaxes those k, with a clamped SwiGLU. Experts are 3-D weights `[n_in, n_out, n_expert]`
//! multiplied per row with ggml's `mul_mat_id`. Written op for op as llama.cpp's
//! `build_moe_ffn` for these models, so the numbers match its.

use tempo9_ggml::Tensor;
use tempo9_gguf::GgufFile;

use crate::layers::Builder;
use crate::weights::{SpecList, WeightId, WeightUse::*};
use crate::{Arch, HParams};

/// GPT-OSS's SwiGLU: `alpha` and the clamp `limit` (llama.cpp's constants).
const SWIGLU_OAI: (f32, f32) = (1.702, 7.0);

/// Bias vectors of GPT-OSS's router and experts.
#[derive(Clone, Copy)]
struct MoeBiases {
    /// `[n_expert]`, added to the router logits.
    router: WeightId,
    /// `[n_ff_exp, n_expert]`.
    gate: WeightId,
    /// `[n_ff_exp, n_expert]`.
    up: WeightId,
    /// `[n_embd, n_expert]`.
    down: WeightId,
}

/// The experts' gate and up projections: two 3-D weights, or one with the gate
/// rows then the up rows of each expert (`ffn_gate_up_exps`, Gemma 4).
#[derive(Clone, Copy)]
enum GateUp {
    Split { gate: WeightId, up: WeightId },
    Fused(WeightId),
}

impl GateUp {
    /// The weight whose type and layout decide how rows are grouped.
    fn first(self) -> WeightId {
        match self {
            GateUp::Split { gate, .. } | GateUp::Fused(gate) => gate,
        }
    }
}

/// Weights of one layer's experts.
pub(crate) struct MoeWeights {
    /// Router: `[n_embd, n_expert]`.
    pub router: WeightId,
    gate_up: GateUp,
    down: WeightId,
    /// Per-expert scale of the down projection's output (`ffn_down_exps.scale`,
    /// `[n_expert]`, Gemma 4).
    down_scale: Option<WeightId>,
    /// GELU-gated experts (Gemma 4) instead of SwiGLU.
    gelu: bool,
    /// Shared expert (Qwen3.5-MoE): gate, up, down and its scalar gate `[n_embd]`.
    shared: Option<[WeightId; 4]>,
    /// GPT-OSS: biases, softmax over the top-k logits, clamped SwiGLU.
    oai: Option<MoeBiases>,
}

impl MoeWeights {
    /// Declares layer `il`'s routed experts (and the shared expert, if the model has one).
    pub fn declare(hp: &HParams, specs: &mut SpecList, il: usize) -> MoeWeights {
        let moe = hp.moe.expect("a MoE model has expert shapes");
        let (e, f, x) = (hp.n_embd, moe.n_ff_exp, moe.n_expert);
        let n = |s: &str| format!("blk.{il}.{s}");
        let shared = (moe.n_ff_shexp > 0).then(|| {
            let fs = moe.n_ff_shexp;
            [
                specs.add(n("ffn_gate_shexp.weight"), &[e, fs], MatMul),
                specs.add(n("ffn_up_shexp.weight"), &[e, fs], MatMul),
                specs.add(n("ffn_down_shexp.weight"), &[fs, e], MatMul),
                specs.add(n("ffn_gate_inp_shexp.weight"), &[e], MatMul),
            ]
        });
        let oai = (hp.arch == Arch::GptOss).then(|| MoeBiases {
            router: specs.add(n("ffn_gate_inp.bias"), &[x], Elementwise),
            gate: specs.add(n("ffn_gate_exps.bias"), &[f, x], Elementwise),
            up: specs.add(n("ffn_up_exps.bias"), &[f, x], Elementwise),
            down: specs.add(n("ffn_down_exps.bias"), &[e, x], Elementwise),
        });
        MoeWeights {
            oai,
            router: specs.add(n("ffn_gate_inp.weight"), &[e, x], MatMul),
            gate_up: GateUp::Split {
                gate: specs.add(n("ffn_gate_exps.weight"), &[e, f, x], Experts),
                up: specs.add(n("ffn_up_exps.weight"), &[e, f, x], Experts),
            },
            down: specs.add(n("ffn_down_exps.weight"), &[f, e, x], Experts),
            down_scale: None,
            gelu: false,
            shared,
        }
    }

    /// Declares Gemma 4's routed experts of layer `il`: GELU-gated, gate and up
    /// fused in one weight when the file has it (the converter's layout), a
    /// per-expert output scale; the router is applied by the caller (its input is
    /// normalised differently, see `arch::gemma4`).
    pub fn declare_gemma4(
        hp: &HParams,
        file: &GgufFile,
        specs: &mut SpecList,
        il: usize,
    ) -> MoeWeights {
        let moe = hp.moe.expect("a MoE model has expert shapes");
        let (e, f, x) = (hp.n_embd, moe.n_ff_exp, moe.n_expert);
        let n = |s: &str| format!("blk.{il}.{s}");
        let gate_up = match file.tensor(&n("ffn_gate_up_exps.weight")) {
            Some(_) => {
                GateUp::Fused(specs.add(n("ffn_gate_up_exps.weight"), &[e, 2 * f, x], Experts))
            }
            None => GateUp::Split {
                gate: specs.add(n("ffn_gate_exps.weight"), &[e, f, x], Experts),
                up: specs.add(n("ffn_up_exps.weight"), &[e, f, x], Experts),
            },
        };
        MoeWeights {
            oai: None,
            router: specs.add(n("ffn_gate_inp.weight"), &[e, x], MatMul),
            gate_up,
            down: specs.add(n("ffn_down_exps.weight"), &[f, e, x], Experts),
            down_scale: file
                .tensor(&n("ffn_down_exps.scale"))
                .map(|_| specs.add(n("ffn_down_exps.scale"), &[x], Elementwise)),
            gelu: true,
            shared: None,
        }
    }
}

impl<'a> Builder<'a> {
    /// The experts' output for `x` (`[n_embd, n_tokens]`), plus the sigmoid-gated
    /// shared expert when the layer has one. On the CPU the routed experts run per
    /// row group as [`Builder::linear`] groups rows (each prompt chunk on its own,
    /// decode rows together): `mul_mat_id` picks its kernels by how many rows go to
    /// each expert, so a sequence's numbers then depend on its step's other rows no
    /// more than a dense layer's do.
    pub fn moe_ffn(&mut self, l: &MoeWeights, x: Tensor<'a>) -> Tensor<'a> {
        let logits = self.linear(l.router, x, l.oai.map(|b| b.router)); // [n_expert, n_t]
        self.moe_ffn_with_logits(l, x, logits)
    }

    /// [`Builder::moe_ffn`] with the router logits `[n_expert, n_tokens]` given.
    pub fn moe_ffn_with_logits(
        &mut self,
        l: &MoeWeights,
        x: Tensor<'a>,
        logits: Tensor<'a>,
    ) -> Tensor<'a> {
        let ctx = self.ctx;
        let n_t = x.ne()[1] as usize;
        let first = l.gate_up.first();
        let groups = self.row_groups(n_t, self.w.is_repacked(first), self.wt(first).dtype());
        let rows = |t: Tensor<'a>, start: usize, n: usize| match n == n_t {
            true => t,
            false => ctx.view(t, &[t.ne()[0], n as i64], &[t.nb()[1]], start * t.nb()[1]),
        };
        let mut parts: Vec<Tensor<'a>> = Vec::with_capacity(groups.len());
        for &(start, n) in &groups {
            parts.push(self.routed(l, rows(x, start, n), rows(logits, start, n)));
        }
        let out = self.concat_all(parts, 1);
        let Some([sg, su, sd, sgate]) = l.shared else {
            return out;
        };
        let sh = self.gated_ffn(x, sg, su, sd, false);
        let gate = ctx.sigmoid(self.linear(sgate, x, None)); // [1, n_t]
        ctx.add(out, ctx.mul(sh, gate))
    }

    /// The routed experts' weighted sum for rows `x` with router logits `logits`.
    fn routed(&mut self, l: &MoeWeights, x: Tensor<'a>, logits: Tensor<'a>) -> Tensor<'a> {
        let (ctx, hp) = (self.ctx, self.hp);
        let moe = hp.moe.expect("a MoE model has expert shapes");
        let (n_embd, n_t) = (x.ne()[0], x.ne()[1]);
        let (n_exp, k) = (moe.n_expert as i64, moe.n_expert_used as i64);
        let (sel, w) = match l.oai {
            // GPT-OSS: the top-k logits, softmaxed among themselves.
            Some(_) => {
                let sel = ctx.argsort_top_k(logits, moe.n_expert_used); // [k, n_t]
                let w = ctx.get_rows(ctx.reshape(logits, &[1, n_exp, n_t]), sel);
                let w = ctx.soft_max(ctx.reshape(w, &[k, n_t]));
                (sel, ctx.reshape(w, &[1, k, n_t]))
            }
            None => {
                let probs = ctx.soft_max(logits);
                let sel = ctx.argsort_top_k(probs, moe.n_expert_used); // [k, n_t]
                let w = ctx.get_rows(ctx.reshape(probs, &[1, n_exp, n_t]), sel); // [1, k, n_t]
                let w = ctx.reshape(w, &[k, n_t]);
                // 2^-14, the smallest normal F16, as llama.cpp clamps it.
                let sum = ctx.clamp(ctx.sum_rows(w), 2f32.powi(-14), f32::INFINITY);
                (sel, ctx.reshape(ctx.div(w, sum), &[1, k, n_t]))
            }
        };
        // Routing ops into the graph now, in llama.cpp's order: the CUDA backend
        // fuses softmax, top-k, gather and renormalisation into one kernel only
        // when they are consecutive nodes.
        self.graph.expand(w);
        let x3 = ctx.reshape(x, &[n_embd, 1, n_t]);
        let bias = |t: Tensor<'a>, b: Option<WeightId>| match b {
            Some(b) => ctx.add_id(t, self.wt(b), sel),
            None => t,
        };
        let (gate, up) = match l.gate_up {
            GateUp::Split { gate, up } => {
                let up = ctx.mul_mat_id(self.wt(up), x3, sel); // [n_ff_exp, k, n_t]
                let up = bias(up, l.oai.map(|b| b.up));
                let gate = ctx.mul_mat_id(self.wt(gate), x3, sel);
                (bias(gate, l.oai.map(|b| b.gate)), up)
            }
            GateUp::Fused(w) => {
                let gu = ctx.mul_mat_id(self.wt(w), x3, sel); // [2 n_ff_exp, k, n_t]
                let (ne, nb) = (gu.ne(), gu.nb());
                let half =
                    |off: usize| ctx.view(gu, &[ne[0] / 2, ne[1], ne[2]], &[nb[1], nb[2]], off);
                (half(0), half(ne[0] as usize / 2 * nb[0]))
            }
        };
        let act = match (l.oai, l.gelu) {
            (Some(_), _) => ctx.swiglu_oai(gate, up, SWIGLU_OAI.0, SWIGLU_OAI.1),
            (None, true) => ctx.geglu_split(gate, up),
            (None, false) => ctx.swiglu_split(gate, up),
        };
        let mut down = ctx.mul_mat_id(self.wt(l.down), act, sel); // [n_embd, k, n_t]
        if let Some(s) = l.down_scale {
            // Each row's chosen experts' scales, [1, k, n_t].
            let s = ctx.reshape(self.wt(s), &[1, n_exp, 1]);
            let s = ctx.get_rows(ctx.repeat_4d(s, [1, n_exp, n_t, 1]), sel);
            down = ctx.mul(down, s);
        }
        let e = ctx.mul(bias(down, l.oai.map(|b| b.down)), w); // [n_embd, k, n_t]
                                                               // Sum over the chosen experts in order, as llama.cpp adds them.
        let nb = e.nb();
        // The weighted outputs, then every expert's view, then the adds (the order
        // the CUDA backend fuses into one add).
        self.graph.expand(e);
        let views: Vec<Tensor<'a>> = (0..k)
            .map(|j| {
                let v = ctx.view(e, &[n_embd, n_t], &[nb[2]], j as usize * nb[1]);
                self.graph.expand(v);
                v
            })
            .collect();
        let mut out = views[0];
        for &v in &views[1..] {
            out = ctx.add(out, v);
        }
        if k == 1 {
            out = ctx.cont(out);
        }
        out
    }
}
