//! Hyper-parameters read from GGUF metadata, validated before any graph is built.

use tempo9_ggml::RopeParams;
use tempo9_gguf::GgufFile;

use crate::ModelError;

/// Supported architectures (`general.architecture`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama family (SmolLM2, Llama 2/3 without rope scaling).
    Llama,
    /// Qwen2 / Qwen2.5: Llama with Q/K/V biases and NeoX rope.
    Qwen2,
    /// Gemma 3: sliding-window layers, QK-norm, sandwich norms, GeGLU.
    Gemma3,
}

impl Arch {
    /// Parses an architecture name; `None` for architectures Tempo9 does not run yet.
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "llama" => Some(Arch::Llama),
            "qwen2" => Some(Arch::Qwen2),
            "gemma3" => Some(Arch::Gemma3),
            _ => None,
        }
    }

    /// The GGUF architecture name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Gemma3 => "gemma3",
        }
    }
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
        let n_layer = req_u32("block_count")?;
        let n_head = req_u32("attention.head_count")?;
        let n_head_kv = md
            .get_u32(&key("attention.head_count_kv"))?
            .map_or(n_head, |v| v as usize);
        let n_ff = req_u32("feed_forward_length")?;
        let n_ctx_train = req_u32("context_length")?;
        let bad = |what: String| Err(ModelError::BadHParams(what));
        if n_embd == 0 || n_layer == 0 || n_head == 0 || n_head_kv == 0 || n_ff == 0 {
            return bad("zero-sized dimension".into());
        }
        if n_layer > 4096 || n_embd > 1 << 20 || n_ff > 1 << 22 || n_head > 4096 {
            return bad(format!("implausible sizes: n_layer {n_layer}, n_embd {n_embd}, n_ff {n_ff}, n_head {n_head}"));
        }
        if n_head % n_head_kv != 0 {
            return bad(format!(
                "head_count {n_head} not a multiple of head_count_kv {n_head_kv}"
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
        let rms_eps = md
            .get_f32(&key("attention.layer_norm_rms_epsilon"))?
            .unwrap_or(1e-5);
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
            "linear" if factor > 0.0 => 1.0 / factor,
            "linear" => 1.0,
            other => {
                return Err(ModelError::Unsupported(format!(
                    "rope scaling type {other}"
                )))
            }
        };
        let mode = match arch {
            Arch::Llama => 0,
            Arch::Qwen2 | Arch::Gemma3 => 2,
        };
        let rope = RopeParams {
            n_dims: n_rot as i32,
            mode,
            n_ctx_orig: n_ctx_train as i32,
            freq_base,
            freq_scale,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
        };
        let mut rope_swa = rope;
        let mut swa_window = None;
        let mut is_swa = vec![false; n_layer];
        let mut attn_scale = 1.0 / (head_dim as f32).sqrt();
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
        let n_vocab = f
            .tensor("token_embd.weight")
            .map(|t| t.shape.get(1).copied().unwrap_or(0) as usize)
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        if n_vocab == 0 {
            return bad("empty vocabulary".into());
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
        })
    }

    /// K row width of one token in one layer (all KV heads).
    pub fn n_embd_k(&self) -> usize {
        self.head_dim * self.n_head_kv
    }

    /// V row width of one token in one layer (all KV heads).
    pub fn n_embd_v(&self) -> usize {
        self.head_dim_v * self.n_head_kv
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
