//! Hyper-parameters read from GGUF metadata, validated before any graph is built.

use tempo9_ggml::RopeParams;
use tempo9_gguf::GgufFile;

use crate::ModelError;

/// Supported architectures (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (SmolLM2, Llama 2/3 with Llama 3 rope frequency factors, Mistral 7B).
    Llama,
    /// Qwen2 / Qwen2.5: Llama with Q/K/V biases and NeoX rope.
    Qwen2,
    /// Gemma 3: sliding-window layers, QK-norm, sandwich norms, GeGLU.
    Gemma3,
    /// Qwen3: Llama layout with per-head Q/K RMSNorm and NeoX rope, no biases.
    Qwen3,
    /// Qwen3-MoE: Qwen3 attention, routed experts (softmax, top-k, renormalised).
    Qwen3Moe,
    /// Qwen3-VL (dense) language model: Qwen3 with interleaved multi-section
    /// rope and deepstack image features added to the first layers' outputs.
    Qwen3Vl,
    /// Qwen3-VL-MoE language model: Qwen3-MoE with Qwen3-VL's rope and deepstack.
    Qwen3VlMoe,
    /// Qwen3.5: gated-DeltaNet linear-attention layers with a recurrent state,
    /// every n-th layer gated full attention with partial multi-section rope.
    Qwen35,
    /// Qwen3.5-MoE: Qwen3.5 with routed experts plus a gated shared expert.
    Qwen35Moe,
    /// Mistral 3 (Ministral 3, Mistral Small 3.x text): the Llama graph with YaRN
    /// rope scaling and position-dependent query temperature scaling.
    Mistral3,
    /// GPT-OSS: sliding-window (every other layer) and full attention with Q/K/V/O
    /// biases and per-head attention sinks, YaRN, routed experts (MXFP4) with biases,
    /// softmax over the top-k router logits and a clamped SwiGLU.
    GptOss,
    /// Gemma 4 (text): sliding-window and full layers of different head sizes and
    /// rope bases, trailing layers that read an earlier layer's K/V, per-layer token
    /// embeddings (E2B/E4B), final logit soft-capping, and (26B-A4B) routed experts
    /// beside a dense feed-forward.
    Gemma4,
}

impl Arch {
    /// Every supported architecture, in the order error messages list them.
    pub const ALL: [Arch; 12] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Gemma3,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Qwen3Vl,
        Arch::Qwen3VlMoe,
        Arch::Qwen35,
        Arch::Qwen35Moe,
        Arch::Mistral3,
        Arch::GptOss,
        Arch::Gemma4,
    ];

    /// The supported architectures' GGUF names, comma-separated.
    pub fn supported_list() -> String {
        Arch::ALL.map(Arch::name).join(", ")
    }

    /// Parses an architecture name; `None` for architectures Tempo9 does not run yet.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// The GGUF architecture name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen3Vl => "qwen3vl",
            Arch::Qwen3VlMoe => "qwen3vlmoe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Mistral3 => "mistral3",
            Arch::GptOss => "gpt-oss",
            Arch::Gemma4 => "gemma4",
        }
    }

    /// Whether the feed-forward is a mixture of experts.
    pub fn is_moe(self) -> bool {
        matches!(
            self,
            Arch::Qwen3Moe | Arch::Qwen3VlMoe | Arch::Qwen35Moe | Arch::GptOss
        )
    }

    /// Whether image embeddings (from a projector file) can feed it: Qwen3-VL
    /// and Gemma 4.
    pub fn takes_images(self) -> bool {
        matches!(self, Arch::Qwen3Vl | Arch::Qwen3VlMoe | Arch::Gemma4)
    }

    /// Whether some layers are gated-DeltaNet layers with a recurrent state.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }
}

/// Routed experts of a mixture-of-experts feed-forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeParams {
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts each token goes through.
    pub n_expert_used: usize,
    /// Hidden size of one expert.
    pub n_ff_exp: usize,
    /// Hidden size of the shared expert (0: none).
    pub n_ff_shexp: usize,
}

/// Shape of the gated-DeltaNet layers (GGUF `ssm.*` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SsmParams {
    /// Causal convolution width (`ssm.conv_kernel`).
    pub d_conv: usize,
    /// Key (= value) head dimension (`ssm.state_size`).
    pub d_state: usize,
    /// Key heads (`ssm.group_count`).
    pub n_k_heads: usize,
    /// Value heads (`ssm.time_step_rank`); a multiple of the key heads.
    pub n_v_heads: usize,
}

impl SsmParams {
    /// Value width, `n_v_heads * d_state` (`ssm.inner_size`).
    pub fn d_inner(&self) -> usize {
        self.n_v_heads * self.d_state
    }

    /// Channels through the convolution: Q, K and V.
    pub fn conv_channels(&self) -> usize {
        2 * self.n_k_heads * self.d_state + self.d_inner()
    }

    /// Floats of one layer's convolution state (the last `d_conv - 1` inputs).
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.conv_channels()
    }

    /// Floats of one layer's delta-rule state (`d_state^2` per value head).
    pub fn ssm_state_len(&self) -> usize {
        self.d_state * self.d_state * self.n_v_heads
    }
}

/// Position-dependent query scaling (Llama 4's attention temperature, Mistral 3):
/// queries at position `p` are multiplied by `1 + scale * ln(floor(p / floor) + 1)`,
/// 1 below `floor`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemp {
    /// `attention.temperature_scale` (HF `llama_4_scaling_beta`).
    pub scale: f32,
    /// Positions per step of the logarithm: YaRN's original context length.
    pub floor: u32,
}

impl AttnTemp {
    /// The query scale at position `pos`, computed as llama.cpp does
    /// (`llm_graph_input_attn_temp::set_input`: F32 floor, F64 logarithm).
    pub fn at(&self, pos: i32) -> f32 {
        let steps = (pos as f32 / self.floor as f32).floor();
        ((f64::from(steps) + 1.0).ln() * f64::from(self.scale) + 1.0) as f32
    }
}

/// The YaRN part of the rope parameters.
struct Yarn {
    ext_factor: f32,
    attn_factor: f32,
    beta_fast: f32,
    beta_slow: f32,
}

/// YaRN's parameters as llama.cpp derives them (`llama_context`'s constructor):
/// with YaRN scaling the extrapolation mix is 1 and the magnitude factor is
/// `mscale(factor, 1) / mscale(factor, yarn_log_multiplier)` (or `mscale(factor, 1)`
/// without a multiplier), divided by the `1 + 0.1 ln(factor)` ggml's rope applies
/// itself, times `rope.scaling.attn_factor`. The beta keys and the multiplier are
/// read only for the architectures whose llama.cpp loader reads them.
fn yarn_params(
    md: &tempo9_gguf::Metadata,
    key: &dyn Fn(&str) -> String,
    arch: Arch,
    is_yarn: bool,
    freq_scale: f32,
) -> Result<Yarn, ModelError> {
    let arch_keys = matches!(arch, Arch::Mistral3);
    let opt = |k: &str, default: f32| -> Result<f32, ModelError> {
        Ok(match arch_keys {
            true => md.get_f32(&key(k))?.unwrap_or(default),
            false => default,
        })
    };
    let beta_fast = opt("rope.scaling.yarn_beta_fast", 32.0)?;
    let beta_slow = opt("rope.scaling.yarn_beta_slow", 1.0)?;
    let log_mul = opt("rope.scaling.yarn_log_multiplier", 0.0)?;
    let rope_attn = md.get_f32(&key("rope.scaling.attn_factor"))?.unwrap_or(1.0);
    let mut y = Yarn {
        ext_factor: 0.0,
        attn_factor: 1.0,
        beta_fast,
        beta_slow,
    };
    if is_yarn {
        let mscale = |scale: f32, m: f32| match scale <= 1.0 {
            true => 1.0,
            false => 0.1 * m * scale.ln() + 1.0,
        };
        let factor = 1.0 / freq_scale;
        y.ext_factor = 1.0;
        y.attn_factor = match log_mul != 0.0 {
            true => mscale(factor, 1.0) / mscale(factor, log_mul),
            false => mscale(factor, 1.0),
        };
        y.attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
    }
    y.attn_factor *= rope_attn;
    Ok(y)
}

/// Model shape and numerics shared by all architectures.
#[derive(Debug, Clone)]
pub struct HParams {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding matrix).
    pub n_vocab: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when < `n_head`).
    pub n_head_kv: usize,
    /// Per-head key dimension.
    pub head_dim: usize,
    /// Per-head value dimension.
    pub head_dim_v: usize,
    /// Feed-forward hidden size.
    pub n_ff: usize,
    /// RMS-norm epsilon.
    pub rms_eps: f32,
    /// Trained context length.
    pub n_ctx_train: usize,
    /// Rotary embedding of full-attention layers.
    pub rope: RopeParams,
    /// Rotary embedding of sliding-window layers (same as `rope` when there are none).
    pub rope_swa: RopeParams,
    /// Sliding-window size in tokens, if the model has sliding-window layers.
    pub swa_window: Option<u32>,
    /// Per layer: whether it uses the sliding window.
    pub is_swa: Vec<bool>,
    /// Attention logit scale.
    pub attn_scale: f32,
    /// Rope sections of multi-section rope (Qwen3.5); None for plain rope.
    pub rope_sections: Option<[i32; 4]>,
    /// Routed experts, for mixture-of-experts models.
    pub moe: Option<MoeParams>,
    /// Gated-DeltaNet shape, for hybrid models.
    pub ssm: Option<SsmParams>,
    /// Per layer: key/value heads (Gemma 4's full layers may have fewer than its
    /// sliding ones; `n_head_kv` is layer 0's).
    pub n_head_kv_arr: Vec<usize>,
    /// Per-head key and value dimension of sliding-window layers (Gemma 4's differ
    /// from the full layers' `head_dim`; equal to it elsewhere).
    pub head_dim_swa: usize,
    /// Per layer: feed-forward hidden size (Gemma 4's double-wide MLP in KV-sharing
    /// layers; `n_ff` elsewhere).
    pub n_ff_arr: Vec<usize>,
    /// Per layer: the layer whose K/V it attends over, itself for layers that keep
    /// their own; a Gemma 4 KV-sharing layer names an earlier layer of its kind and
    /// owns no cells.
    pub kv_source: Vec<usize>,
    /// Width of one layer's per-layer token embedding (Gemma 4 E2B/E4B); 0: none.
    pub n_embd_per_layer: usize,
    /// `final_logit_softcapping`: logits become `c * tanh(logits / c)`.
    pub final_softcap: Option<f32>,
    /// Per layer: whether it is a gated-DeltaNet layer with a recurrent state.
    pub is_recurrent: Vec<bool>,
    /// Trailing multi-token-prediction blocks in the file (loaded by name, not run).
    pub n_nextn: usize,
    /// Position-dependent query scaling (Mistral 3), if the file asks for it.
    pub attn_temp: Option<AttnTemp>,
    /// Deepstack inputs (Qwen3-VL): an image token's input embedding carries
    /// this many more `n_embd`-wide features, added to the outputs of layers
    /// `0..n_deepstack`.
    pub n_deepstack: usize,
}

impl HParams {
    /// Width of one input embedding at an image position: the token-embedding
    /// width plus the deepstack features.
    pub fn n_embd_inp(&self) -> usize {
        self.n_embd * (1 + self.n_deepstack)
    }
}

impl HParams {
    /// Reads and validates hyper-parameters of a supported architecture.
    pub fn from_gguf(f: &GgufFile) -> Result<HParams, ModelError> {
        let name = f.architecture()?;
        let arch =
            Arch::from_name(name).ok_or_else(|| ModelError::UnsupportedArch(name.to_string()))?;
        let md = f.metadata();
        let key = |k: &str| format!("{name}.{k}");
        let req_u32 = |k: &str| -> Result<usize, ModelError> {
            md.get_u32(&key(k))?
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingKey(key(k)))
        };
        let n_embd = req_u32("embedding_length")?;
        let n_block = req_u32("block_count")?;
        let n_nextn = md.get_u32(&key("nextn_predict_layers"))?.unwrap_or(0) as usize;
        if n_nextn >= n_block {
            return Err(ModelError::BadHParams(format!(
                "{n_nextn} next-token-prediction blocks of {n_block}"
            )));
        }
        let n_layer = n_block - n_nextn;
        let n_head = req_u32("attention.head_count")?;
        // Key/value heads and feed-forward widths may be given per layer (Gemma 4).
        let n_head_kv_arr = per_layer(md, &key("attention.head_count_kv"), n_block)?
            .map_or(vec![n_head; n_layer], |v| v[..n_layer].to_vec());
        let n_head_kv = n_head_kv_arr[0];
        let n_ff_key = key("feed_forward_length");
        let n_ff_arr = per_layer(md, &n_ff_key, n_block)?.map(|v| v[..n_layer].to_vec());
        // MoE files may have no dense feed-forward size.
        let n_ff = match (&n_ff_arr, arch.is_moe()) {
            (Some(v), _) => v[0],
            (None, true) => 0,
            (None, false) => return Err(ModelError::MissingKey(n_ff_key)),
        };
        let n_ff_arr = n_ff_arr.unwrap_or_else(|| vec![n_ff; n_layer]);
        let n_ctx_train = req_u32("context_length")?;
        let bad = |what: String| Err(ModelError::BadHParams(what));
        if n_embd == 0
            || n_layer == 0
            || n_head == 0
            || n_head_kv == 0
            || (n_ff == 0 && !arch.is_moe())
        {
            return bad("zero-sized dimension".into());
        }
        if n_layer > 4096 || n_embd > 1 << 20 || n_ff > 1 << 22 || n_head > 4096 {
            return bad(format!("implausible sizes: n_layer {n_layer}, n_embd {n_embd}, n_ff {n_ff}, n_head {n_head}"));
        }
        if let Some(&h) = n_head_kv_arr.iter().find(|&&h| h == 0 || n_head % h != 0) {
            return bad(format!(
                "head_count {n_head} not a multiple of head_count_kv {h}"
            ));
        }
        let head_dim = md
            .get_u32(&key("attention.key_length"))?
            .map_or(n_embd / n_head, |v| v as usize);
        let head_dim_v = md
            .get_u32(&key("attention.value_length"))?
            .map_or(head_dim, |v| v as usize);
        if head_dim == 0 || head_dim_v == 0 || head_dim % 2 != 0 || head_dim > 1024 {
            return bad(format!("head dimension {head_dim}/{head_dim_v}"));
        }
        let rms_eps = match arch {
            // llama.cpp requires the key for these.
            Arch::Qwen3 | Arch::Qwen3Moe | Arch::Qwen35 | Arch::Qwen35Moe | Arch::Gemma4 => md
                .get_f32(&key("attention.layer_norm_rms_epsilon"))?
                .ok_or_else(|| ModelError::MissingKey(key("attention.layer_norm_rms_epsilon")))?,
            _ => md
                .get_f32(&key("attention.layer_norm_rms_epsilon"))?
                .unwrap_or(1e-5),
        };
        let n_rot = md
            .get_u32(&key("rope.dimension_count"))?
            .map_or(head_dim, |v| v as usize);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return bad(format!(
                "rope.dimension_count {n_rot} with head dim {head_dim}"
            ));
        }
        let freq_base = md.get_f32(&key("rope.freq_base"))?.unwrap_or(10_000.0);
        let scaling = md.get_str(&key("rope.scaling.type"))?.unwrap_or("none");
        let factor = md.get_f32(&key("rope.scaling.factor"))?.unwrap_or(0.0);
        let freq_scale = match scaling {
            "none" => 1.0,
            "linear" | "yarn" if factor > 0.0 => 1.0 / factor,
            "linear" | "yarn" => 1.0,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling type {other}"
                )))
            }
        };
        // YaRN's original context (llama.cpp: n_ctx_orig_yarn).
        let n_ctx_orig = md
            .get_u32(&key("rope.scaling.original_context_length"))?
            .map_or(n_ctx_train, |v| v as usize);
        if n_ctx_orig == 0 {
            return bad("rope.scaling.original_context_length is 0".into());
        }
        let yarn = yarn_params(md, &key, arch, scaling == "yarn", freq_scale)?;
        let mode = match arch {
            Arch::Llama | Arch::Mistral3 => 0,
            Arch::Qwen2
            | Arch::Gemma3
            | Arch::Gemma4
            | Arch::Qwen3
            | Arch::Qwen3Moe
            | Arch::GptOss => 2,
            // GGML_ROPE_TYPE_IMROPE: interleaved multi-section rope.
            Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Vl | Arch::Qwen3VlMoe => 40,
        };
        let rope = RopeParams {
            n_dims: n_rot as i32,
            mode,
            n_ctx_orig: n_ctx_orig as i32,
            freq_base,
            freq_scale,
            ext_factor: yarn.ext_factor,
            attn_factor: yarn.attn_factor,
            beta_fast: yarn.beta_fast,
            beta_slow: yarn.beta_slow,
        };
        let mut rope_swa = rope;
        let mut swa_window = None;
        let mut is_swa = vec![false; n_layer];
        let mut attn_scale = 1.0 / (head_dim as f32).sqrt();
        if arch == Arch::GptOss {
            // Every other layer slides (llama.cpp: load_swa_pattern(ml, 2)), with the
            // full layers' rope unless the file gives the sliding layers a base.
            let w = req_u32("attention.sliding_window")?;
            if w == 0 {
                return bad("attention.sliding_window is 0".into());
            }
            swa_window = Some(w as u32);
            let pattern = md
                .get_u32(&key("attention.sliding_window_pattern"))?
                .unwrap_or(2) as usize;
            for (il, s) in is_swa.iter_mut().enumerate() {
                *s = pattern == 0 || il % pattern < pattern - 1;
            }
            if let Some(b) = md.get_f32(&key("rope.freq_base_swa"))? {
                rope_swa.freq_base = b;
            }
            attn_scale = 1.0 / (n_rot as f32).sqrt();
        }
        if arch == Arch::Gemma3 {
            if let Some(w) = md
                .get_u32(&key("attention.sliding_window"))?
                .filter(|&w| w > 0)
            {
                swa_window = Some(w);
                // Every 6th layer attends globally unless the file gives the pattern.
                let pattern = md
                    .get_u32(&key("attention.sliding_window_pattern"))?
                    .unwrap_or(6) as usize;
                for (il, s) in is_swa.iter_mut().enumerate() {
                    *s = pattern == 0 || il % pattern < pattern - 1;
                }
                rope_swa.freq_base = md.get_f32(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
                rope_swa.freq_scale = 1.0;
            }
            // Gemma 3 27B scales by n_embd / n_head; the smaller ones by the head dim.
            if n_layer == 62 {
                attn_scale = 1.0 / ((n_embd / n_head) as f32).sqrt();
            }
        }
        let mut head_dim_swa = head_dim;
        let mut kv_source: Vec<usize> = (0..n_layer).collect();
        let mut n_embd_per_layer = 0;
        let mut final_softcap = None;
        if arch == Arch::Gemma4 {
            let g = gemma4_layout(md, &key, n_layer, n_block)?;
            is_swa = g.is_swa;
            kv_source = g.kv_source;
            swa_window = Some(g.window);
            head_dim_swa = g.head_dim_swa;
            rope_swa.freq_base = g.rope_base_swa;
            rope_swa.freq_scale = 1.0;
            rope_swa.n_dims = g.n_rot_swa as i32;
            n_embd_per_layer = g.n_embd_per_layer;
            final_softcap = g.final_softcap;
            // Queries and keys are RMS-normed; attention runs unscaled.
            attn_scale = 1.0;
        }
        // Multi-section rope: Qwen3.5 and Qwen3-VL (not Gemma 4, whose images
        // take plain consecutive positions).
        let rope_sections =
            match arch.is_hybrid() || matches!(arch, Arch::Qwen3Vl | Arch::Qwen3VlMoe) {
                true => {
                    let key_s = key("rope.dimension_sections");
                    let v = md
                        .get_i32_array(&key_s)?
                        .map(|v| v.to_vec())
                        .or(md
                            .get_u32_array(&key_s)?
                            .map(|v| v.iter().map(|&x| x as i32).collect()))
                        .ok_or_else(|| ModelError::MissingKey(key_s.clone()))?;
                    if v.len() < 3 || v.len() > 4 || v.iter().any(|&x| x < 0) {
                        return bad(format!("{key_s} {v:?}: want 3 or 4 sections"));
                    }
                    let mut s = [0i32; 4];
                    s[..v.len()].copy_from_slice(&v);
                    Some(s)
                }
                false => None,
            };
        let has_experts =
            arch.is_moe() || (arch == Arch::Gemma4 && md.get_u32(&key("expert_count"))?.is_some());
        let moe = match has_experts {
            true => {
                let n_expert = req_u32("expert_count")?;
                let n_expert_used = req_u32("expert_used_count")?;
                if n_expert == 0
                    || n_expert_used == 0
                    || n_expert_used > n_expert
                    || n_expert > 4096
                {
                    return bad(format!(
                        "{n_expert_used} experts used of {n_expert} (expert_count, expert_used_count)"
                    ));
                }
                let n_ff_exp = md
                    .get_u32(&key("expert_feed_forward_length"))?
                    .map_or(n_ff / n_expert_used, |v| v as usize);
                let n_ff_shexp = match arch {
                    Arch::Qwen35Moe => md
                        .get_u32(&key("expert_shared_feed_forward_length"))?
                        .map_or(n_ff, |v| v as usize),
                    _ => 0,
                };
                if n_ff_exp == 0 {
                    return bad("expert_feed_forward_length is 0".into());
                }
                Some(MoeParams {
                    n_expert,
                    n_expert_used,
                    n_ff_exp,
                    n_ff_shexp,
                })
            }
            false => None,
        };
        let mut is_recurrent = vec![false; n_layer];
        let ssm = match arch.is_hybrid() {
            true => {
                let ssm = SsmParams {
                    d_conv: req_u32("ssm.conv_kernel")?,
                    d_state: req_u32("ssm.state_size")?,
                    n_k_heads: req_u32("ssm.group_count")?,
                    n_v_heads: req_u32("ssm.time_step_rank")?,
                };
                let inner = req_u32("ssm.inner_size")?;
                if ssm.d_conv < 2
                    || ssm.d_conv > 64
                    || ssm.d_state == 0
                    || ssm.d_state > 1024
                    || ssm.n_k_heads == 0
                    || !ssm.n_v_heads.is_multiple_of(ssm.n_k_heads)
                    || inner != ssm.d_inner()
                {
                    return bad(format!(
                        "gated-DeltaNet shape {ssm:?} with ssm.inner_size {inner}: want conv_kernel >= 2, value heads a multiple of key heads, inner_size = time_step_rank * state_size"
                    ));
                }
                let key_r = key("attention.recurrent_layers");
                if let Some(flags) = md.get_bool_array(&key_r).ok().flatten() {
                    if flags.len() != n_block {
                        return bad(format!(
                            "{key_r} has {} entries for {n_block} blocks",
                            flags.len()
                        ));
                    }
                    is_recurrent.copy_from_slice(&flags[..n_layer]);
                } else if let Some(flags) = md.get_u32_array(&key_r).ok().flatten() {
                    if flags.len() != n_block {
                        return bad(format!(
                            "{key_r} has {} entries for {n_block} blocks",
                            flags.len()
                        ));
                    }
                    for (r, &f) in is_recurrent.iter_mut().zip(flags) {
                        *r = f != 0;
                    }
                } else {
                    let interval =
                        md.get_u32(&key("full_attention_interval"))?.unwrap_or(4) as usize;
                    if interval == 0 {
                        return bad("full_attention_interval is 0".into());
                    }
                    for (il, r) in is_recurrent.iter_mut().enumerate() {
                        *r = (il + 1) % interval != 0;
                    }
                }
                if is_recurrent.iter().all(|&r| r) {
                    return bad("no full-attention layer (a hybrid model needs one)".into());
                }
                Some(ssm)
            }
            false => None,
        };
        let attn_temp = match arch {
            Arch::Mistral3 => md
                .get_f32(&key("attention.temperature_scale"))?
                .filter(|&s| s != 0.0)
                .map(|scale| AttnTemp {
                    scale,
                    floor: n_ctx_orig as u32,
                }),
            _ => None,
        };
        let n_vocab = f
            .tensor("token_embd.weight")
            .map(|t| t.shape.get(1).copied().unwrap_or(0) as usize)
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        if n_vocab == 0 {
            return bad("empty vocabulary".into());
        }
        let n_deepstack = match arch {
            Arch::Qwen3Vl | Arch::Qwen3VlMoe => {
                md.get_u32(&key("n_deepstack_layers"))?.unwrap_or(0) as usize
            }
            _ => 0,
        };
        if n_deepstack >= n_layer {
            return bad(format!("{n_deepstack} deepstack layers of {n_layer}"));
        }
        Ok(HParams {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_ff,
            rms_eps,
            n_ctx_train,
            rope,
            rope_swa,
            swa_window,
            is_swa,
            attn_scale,
            rope_sections,
            moe,
            ssm,
            is_recurrent,
            n_nextn,
            attn_temp,
            n_deepstack,
            n_head_kv_arr,
            head_dim_swa,
            n_ff_arr,
            kv_source,
            n_embd_per_layer,
            final_softcap,
        })
    }

    /// K row width of one token in one layer (all KV heads) of layer 0's shape
    /// (every layer's unless [`HParams::n_embd_k_of`] says otherwise).
    pub fn n_embd_k(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// V row width of one token in one layer of layer 0's shape.
    pub fn n_embd_v(&self) -> usize {
        self.head_dim_v * self.n_head_kv
    }

    /// Per-head key dimension of layer `il`.
    pub fn head_dim_of(&self, il: usize) -> usize {
        match self.is_swa[il] && self.arch == Arch::Gemma4 {
            true => self.head_dim_swa,
            false => self.head_dim,
        }
    }

    /// Per-head value dimension of layer `il`.
    pub fn head_dim_v_of(&self, il: usize) -> usize {
        match self.is_swa[il] && self.arch == Arch::Gemma4 {
            true => self.head_dim_swa,
            false => self.head_dim_v,
        }
    }

    /// Key/value heads of layer `il`.
    pub fn n_head_kv_of(&self, il: usize) -> usize {
        self.n_head_kv_arr[il]
    }

    /// K row width of one token in layer `il`.
    pub fn n_embd_k_of(&self, il: usize) -> usize {
        self.head_dim_of(il) * self.n_head_kv_of(il)
    }

    /// V row width of one token in layer `il`.
    pub fn n_embd_v_of(&self, il: usize) -> usize {
        self.head_dim_v_of(il) * self.n_head_kv_of(il)
    }

    /// Whether layer `il` keeps K/V of its own (not a KV-sharing layer).
    pub fn owns_kv(&self, il: usize) -> bool {
        self.kv_source[il] == il
    }

    /// Bytes of one cell (one token's F16 K and V rows) over `layers`.
    pub fn cell_bytes(&self, layers: &[usize]) -> usize {
        layers
            .iter()
            .map(|&il| (self.n_embd_k_of(il) + self.n_embd_v_of(il)) * 2)
            .sum()
    }

    /// Rope parameters of layer `il`.
    pub fn rope_for(&self, il: usize) -> &RopeParams {
        if self.is_swa[il] {
            &self.rope_swa
        } else {
            &self.rope
        }
    }
}

/// A per-layer integer key: `n_block` values from an array, or one value for
/// every layer; `None` when absent.
fn per_layer(
    md: &tempo9_gguf::Metadata,
    k: &str,
    n_block: usize,
) -> Result<Option<Vec<usize>>, ModelError> {
    if let Ok(v) = md.get_u32(k) {
        return Ok(v.map(|v| vec![v as usize; n_block]));
    }
    if let Some(arr) = md.get_array(k)? {
        let v: Vec<usize> = match (md.get_u32_array(k), md.get_i32_array(k)) {
            (Ok(Some(v)), _) => v.iter().map(|&x| x as usize).collect(),
            (_, Ok(Some(v))) if v.iter().all(|&x| x >= 0) => {
                v.iter().map(|&x| x as usize).collect()
            }
            _ => {
                return Err(ModelError::BadHParams(format!(
                    "{k}: an array of {arr:?} entries, want unsigned integers"
                )))
            }
        };
        if v.len() != n_block {
            return Err(ModelError::BadHParams(format!(
                "{k} has {} entries for {n_block} blocks",
                v.len()
            )));
        }
        return Ok(Some(v));
    }
    Err(ModelError::BadHParams(format!(
        "{k}: want an integer or an array of them"
    )))
}

/// Gemma 4's layer layout, read as llama.cpp's loader reads it.
struct Gemma4Layout {
    is_swa: Vec<bool>,
    kv_source: Vec<usize>,
    window: u32,
    head_dim_swa: usize,
    n_rot_swa: usize,
    rope_base_swa: f32,
    n_embd_per_layer: usize,
    final_softcap: Option<f32>,
}

/// Reads Gemma 4's keys: the per-layer sliding pattern (a bool array), the
/// sliding layers' head size and rotated dimensions, and the trailing
/// `attention.shared_kv_layers` layers, which read the K/V of the last layer of
/// their kind before them (llama.cpp: the last full layer that keeps K/V for a
/// full layer, the one before it for a sliding one, so those two must be a
/// sliding then a full layer).
fn gemma4_layout(
    md: &tempo9_gguf::Metadata,
    key: &dyn Fn(&str) -> String,
    n_layer: usize,
    n_block: usize,
) -> Result<Gemma4Layout, ModelError> {
    let bad = |s: String| Err(ModelError::BadHParams(s));
    let req = |k: &str| -> Result<usize, ModelError> {
        md.get_u32(&key(k))?
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingKey(key(k)))
    };
    let pat_key = key("attention.sliding_window_pattern");
    let pattern = md
        .get_bool_array(&pat_key)?
        .ok_or_else(|| ModelError::MissingKey(pat_key.clone()))?;
    if pattern.len() != n_block {
        return bad(format!(
            "{pat_key} has {} entries for {n_block} blocks",
            pattern.len()
        ));
    }
    let is_swa = pattern[..n_layer].to_vec();
    let window = req("attention.sliding_window")?;
    let head_dim_swa = req("attention.key_length_swa")?;
    let v_swa = req("attention.value_length_swa")?;
    if head_dim_swa != v_swa || head_dim_swa == 0 || head_dim_swa % 2 != 0 || head_dim_swa > 1024 {
        return bad(format!(
            "sliding head dimension {head_dim_swa}/{v_swa}: want equal, even, at most 1024"
        ));
    }
    if window == 0 {
        return bad("attention.sliding_window is 0".into());
    }
    let n_rot_swa = md
        .get_u32(&key("rope.dimension_count_swa"))?
        .map_or(head_dim_swa, |v| v as usize);
    if n_rot_swa > head_dim_swa || n_rot_swa % 2 != 0 {
        return bad(format!(
            "rope.dimension_count_swa {n_rot_swa} with head dim {head_dim_swa}"
        ));
    }
    let n_shared = md.get_u32(&key("attention.shared_kv_layers"))?.unwrap_or(0) as usize;
    let first_shared = n_layer.saturating_sub(n_shared);
    let mut kv_source: Vec<usize> = (0..n_layer).collect();
    if n_shared > 0 {
        if first_shared < 2 || !is_swa[first_shared - 2] || is_swa[first_shared - 1] {
            return bad(format!(
                "{n_shared} KV-sharing layers of {n_layer}: the two layers before them must \
                 be a sliding then a full layer"
            ));
        }
        for (il, src) in kv_source.iter_mut().enumerate().skip(first_shared) {
            *src = first_shared - if is_swa[il] { 2 } else { 1 };
        }
    }
    Ok(Gemma4Layout {
        is_swa,
        kv_source,
        window: window as u32,
        head_dim_swa,
        n_rot_swa,
        rope_base_swa: md.get_f32(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0),
        n_embd_per_layer: md
            .get_u32(&key("embedding_length_per_layer_input"))?
            .unwrap_or(0) as usize,
        final_softcap: md
            .get_f32(&key("final_logit_softcapping"))?
            .filter(|&c| c != 0.0),
    })
}
