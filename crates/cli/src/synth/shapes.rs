//! Architectures and model shapes of `tempo9 synth-gguf`.

use anyhow::{bail, Result};
use clap::ValueEnum;

/// Architecture of the synthetic model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SynthArch {
    /// Llama (Llama 3, SmolLM2): no biases, normal rotary embedding.
    Llama,
    /// Qwen2 / Qwen2.5: Q/K/V biases, NeoX rotary embedding.
    Qwen2,
    /// Qwen3 dense: per-head Q/K RMS norms, explicit head size, NeoX rotary embedding.
    Qwen3,
    /// Qwen3 MoE (Qwen3-30B-A3B): Qwen3 attention, routed experts, no shared expert.
    Qwen3moe,
    /// Qwen3-VL dense language model: Qwen3 with interleaved M-RoPE and
    /// deepstack inputs (pair it with a projector file for images).
    Qwen3vl,
    /// Qwen3-VL MoE language model: Qwen3 MoE with Qwen3-VL's M-RoPE and
    /// deepstack inputs.
    Qwen3vlmoe,
    /// Qwen3.5 dense hybrid: gated DeltaNet layers with a gated full-attention
    /// layer every `full_attention_interval`, interleaved M-RoPE.
    Qwen35,
    /// Qwen3.5 MoE hybrid (Qwen3.5-35B-A3B): Qwen3.5 layers with routed experts
    /// plus a sigmoid-gated shared expert.
    Qwen35moe,
    /// Mistral 3 (Ministral 3): the Llama layout with YaRN rope scaling and query
    /// temperature scaling.
    Mistral3,
    /// GPT-OSS: alternating sliding-window (128) and full attention with biases and
    /// sinks, YaRN, MXFP4 routed experts with biases.
    #[value(name = "gpt-oss")]
    GptOss,
    /// Gemma 4 (text): sliding-window and full layers of their own head sizes,
    /// KV-sharing layers, per-layer embeddings, soft-capped logits, optional
    /// routed experts beside the dense feed-forward.
    Gemma4,
}

impl SynthArch {
    /// `general.architecture` and the metadata key prefix.
    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Qwen2 => "qwen2",
            SynthArch::Qwen3 => "qwen3",
            SynthArch::Qwen3vl => "qwen3vl",
            SynthArch::Qwen3vlmoe => "qwen3vlmoe",
            SynthArch::Qwen3moe => "qwen3moe",
            SynthArch::Qwen35 => "qwen35",
            SynthArch::Qwen35moe => "qwen35moe",
            SynthArch::Mistral3 => "mistral3",
            SynthArch::GptOss => "gpt-oss",
            SynthArch::Gemma4 => "gemma4",
        }
    }

    /// Qwen3.5 hybrids (DeltaNet + gated attention).
    pub fn is_hybrid(self) -> bool {
        matches!(self, SynthArch::Qwen35 | SynthArch::Qwen35moe)
    }

    /// The preset used when only `--arch` is given.
    pub fn default_preset(self) -> Preset {
        match self {
            SynthArch::Llama | SynthArch::Qwen2 => Preset::S135m,
            SynthArch::Qwen3 => Preset::Qwen3_0_6b,
            SynthArch::Qwen3vl => Preset::Qwen3vlTiny,
            SynthArch::Qwen3vlmoe => Preset::Qwen3vlmoeTiny,
            SynthArch::Qwen3moe => Preset::Qwen3_30bA3b,
            SynthArch::Qwen35 => Preset::Qwen35_0_8b,
            SynthArch::Qwen35moe => Preset::Qwen35_35bA3b,
            SynthArch::Mistral3 => Preset::Ministral3_3b,
            SynthArch::GptOss => Preset::GptOss20b,
            SynthArch::Gemma4 => Preset::Gemma4E2b,
        }
    }
}

/// Model sizes: the shapes of published models, and tiny test shapes. Presets
/// named after a model imply its architecture; the plain sizes (135m ... 8b) take
/// `--arch llama|qwen2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// SmolLM2-135M (576 wide, 30 layers, 49152 tokens).
    #[value(name = "135m")]
    S135m,
    /// Qwen2.5-0.5B (896 wide, 24 layers, 151936 tokens).
    #[value(name = "0.5b")]
    S0_5b,
    /// Llama-3.2-1B's size (2048 wide, 16 layers, 128256 tokens) without its rope
    /// scaling (see llama-3.2-1b).
    #[value(name = "1b")]
    S1b,
    /// Qwen2.5-7B (3584 wide, 28 layers, 152064 tokens).
    #[value(name = "7b")]
    S7b,
    /// Llama-3.1-8B's size (4096 wide, 32 layers, 128256 tokens) without its rope
    /// scaling (see llama-3.1-8b).
    #[value(name = "8b")]
    S8b,
    /// Qwen3-0.6B (qwen3: 1024 wide, 28 layers, 16/8 heads of 128).
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
    /// Qwen3-30B-A3B (qwen3moe: 2048 wide, 48 layers, 128 experts of 768, 8 used).
    #[value(name = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
    /// Qwen3.5-0.8B (qwen35: 1024 wide, 24 layers, DeltaNet 16/16 heads of 128).
    #[value(name = "qwen3.5-0.8b")]
    Qwen35_0_8b,
    /// Qwen3.5-2B (qwen35: 2048 wide, 24 layers, DeltaNet 16/16 heads of 128).
    #[value(name = "qwen3.5-2b")]
    Qwen35_2b,
    /// Qwen3.5-4B (qwen35: 2560 wide, 32 layers, DeltaNet 16/32 heads of 128).
    #[value(name = "qwen3.5-4b")]
    Qwen35_4b,
    /// Qwen3.5-9B (qwen35: 4096 wide, 32 layers, DeltaNet 16/32 heads of 128).
    #[value(name = "qwen3.5-9b")]
    Qwen35_9b,
    /// Qwen3.5-27B (qwen35: 5120 wide, 64 layers, DeltaNet 16/48 heads of 128).
    #[value(name = "qwen3.5-27b")]
    Qwen35_27b,
    /// Qwen3.5-35B-A3B (qwen35moe: 2048 wide, 40 layers, 256 experts of 512, 8
    /// used, shared expert of 512, DeltaNet 16/32 heads of 128).
    #[value(name = "qwen3.5-35b-a3b")]
    Qwen35_35bA3b,
    /// Llama-3.2-1B (llama: 2048 wide, 16 layers, 32/8 heads of 64, Llama 3 rope
    /// scaling by 32 written as `rope_freqs.weight`, 128256 tokens).
    #[value(name = "llama-3.2-1b")]
    Llama32_1b,
    /// Llama-3.1-8B (llama: 4096 wide, 32 layers, 32/8 heads of 128, Llama 3 rope
    /// scaling by 8 written as `rope_freqs.weight`, 128256 tokens).
    #[value(name = "llama-3.1-8b")]
    Llama31_8b,
    /// Test shape, llama with Llama 3 rope scaling (Llama 3.2's: factor 32, low/high
    /// frequency factors 1/4, 8192 original positions): 128 wide, 4 layers, 4/2
    /// heads of 32, 128256 tokens.
    #[value(name = "llama3-tiny")]
    Llama3Tiny,
    /// Mistral-7B-v0.3 (llama: 4096 wide, 32 layers, 32/8 heads of 128, 32768
    /// tokens, rope base 1e6, no rope scaling).
    #[value(name = "mistral-7b-v0.3")]
    Mistral7bV03,
    /// Ministral-3-3B (mistral3: 3072 wide, 26 layers, 32/8 heads of 128, YaRN by
    /// 16 over 16384 original positions, query temperature 0.1, 131072 tokens).
    #[value(name = "ministral-3-3b")]
    Ministral3_3b,
    /// Test shape, mistral3: 128 wide, 4 layers, 4/2 heads of 64, YaRN by 16 over
    /// 256 original positions (so that YaRN and the query temperature, which starts
    /// at the original length, both act within the test prompts), 131072 tokens.
    #[value(name = "mistral3-tiny")]
    Mistral3Tiny,
    /// GPT-OSS-20B (gpt-oss: 2880 wide, 24 layers, 64/8 heads of 64, sliding window
    /// 128 on even layers, YaRN by 32 over 4096, 32 MXFP4 experts of 2880, 4 used,
    /// 201088 tokens).
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
    /// Test shape, gpt-oss: 128 wide, 4 layers, 4/2 heads of 64, window 128, 8
    /// experts of 64 (MXFP4), 2 used, 201088 tokens.
    #[value(name = "gpt-oss-tiny")]
    GptOssTiny,
    /// Gemma-4-E2B (gemma4: 1536 wide, 35 layers, a full layer after every 4
    /// sliding ones (window 512), 8 query heads, 1 KV head of 256 (sliding) or 512
    /// (full), the last 20 layers sharing KV, per-layer embeddings of 256,
    /// double-wide MLP (6144, 12288 in KV-sharing layers), tied output).
    #[value(name = "gemma-4-e2b")]
    Gemma4E2b,
    /// Gemma-4-31B (gemma4: 5376 wide, 60 layers, a full layer after every 5
    /// sliding ones (window 1024), 32 query heads, 16 KV heads of 256 (sliding) or
    /// 4 of 512 with K = V (full), MLP 21504, tied output).
    #[value(name = "gemma-4-31b")]
    Gemma4_31b,
    /// Gemma-4-26B-A4B (gemma4: 2816 wide, 30 layers, a full layer after every 5
    /// sliding ones (window 1024), 16 query heads, 8 KV heads of 256 (sliding) or 2
    /// of 512 with K = V (full), dense MLP 2112 beside 128 experts of 704, 8 used).
    #[value(name = "gemma-4-26b-a4b")]
    Gemma4_26bA4b,
    /// Test shape, gemma4 dense: 128 wide, 6 layers (full at 2 and 5, window 128),
    /// 4 query heads, 2 KV heads of 32 (sliding) or 1 of 64 (full), the last 3
    /// layers sharing KV, per-layer embeddings of 32, double-wide MLP (256/512),
    /// 262144 tokens.
    #[value(name = "gemma4-tiny")]
    Gemma4Tiny,
    /// Test shape, gemma4 MoE: gemma4-tiny's attention with K = V on full layers,
    /// no KV sharing or per-layer embeddings, dense MLP 128 beside 8 experts of 64,
    /// 2 used.
    #[value(name = "gemma4moe-tiny")]
    Gemma4moeTiny,
    /// Test shape, qwen3: 128 wide, 4 layers, 4/2 heads of 64, 151936 tokens.
    #[value(name = "qwen3-tiny")]
    Qwen3Tiny,
    /// Test shape, qwen3moe: qwen3-tiny with 8 experts of 64, 2 used.
    #[value(name = "qwen3moe-tiny")]
    Qwen3moeTiny,
    /// Test shape, qwen3vl: qwen3-tiny's shape with Qwen3-VL's rope base (5e6),
    /// M-RoPE sections and 2 deepstack inputs.
    #[value(name = "qwen3vl-tiny")]
    Qwen3vlTiny,
    /// Test shape, qwen3vlmoe: qwen3vl-tiny with 8 experts of 64, 2 used.
    #[value(name = "qwen3vlmoe-tiny")]
    Qwen3vlmoeTiny,
    /// Qwen3-VL-30B-A3B's language model (qwen3vlmoe): Qwen3-30B-A3B's shape
    /// with rope base 5e6 and 3 deepstack inputs; pair it with
    /// `--projector qwen3-vl-30b-a3b`.
    #[value(name = "qwen3-vl-30b-a3b")]
    Qwen3vl30bA3b,
    /// Test shape, qwen35: 128 wide, 8 layers (full attention at 3 and 7), 4/2
    /// heads of 64, DeltaNet 2 K heads and 4 V heads of 32.
    #[value(name = "qwen35-tiny")]
    Qwen35Tiny,
    /// Test shape, qwen35moe: qwen35-tiny with 8 experts of 64, 2 used, and a
    /// shared expert of 64.
    #[value(name = "qwen35moe-tiny")]
    Qwen35moeTiny,
}

/// Routed experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Moe {
    /// `expert_count`.
    pub n_expert: u64,
    /// `expert_used_count`.
    pub n_used: u64,
    /// `expert_feed_forward_length`.
    pub n_ff_exp: u64,
    /// `expert_shared_feed_forward_length` (qwen35moe's shared expert).
    pub n_ff_shexp: Option<u64>,
}

/// What Gemma 4 adds to a shape (HF `text_config`). The shape's `head_dim` and
/// `n_head_kv` are the sliding layers' (HF `head_dim`, `num_key_value_heads`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gemma4 {
    /// `global_head_dim`: the full layers' head size.
    pub head_dim_full: u64,
    /// `num_global_key_value_heads`: the full layers' KV heads.
    pub n_head_kv_full: u64,
    /// A full layer after every `period - 1` sliding ones (`layer_types`).
    pub period: u64,
    /// `num_kv_shared_layers`: trailing layers that read earlier layers' K/V.
    pub n_shared: u64,
    /// `hidden_size_per_layer_input` (0: no per-layer embeddings).
    pub n_embd_per_layer: u64,
    /// `use_double_wide_mlp`: KV-sharing layers' MLP twice as wide.
    pub double_wide: bool,
    /// `attention_k_eq_v`: full layers have no V projection (V = K).
    pub k_eq_v: bool,
    /// The sliding layers' rope base.
    pub rope_base_swa: f32,
    /// The full layers' `partial_rotary_factor` (proportional rope).
    pub partial_rotary_full: f32,
    /// `final_logit_softcapping`.
    pub softcap: f32,
}

impl Gemma4 {
    /// Whether layer `i` is a full-attention layer.
    pub fn is_full(&self, i: u64) -> bool {
        (i + 1).is_multiple_of(self.period)
    }
}

/// Gated DeltaNet layers of the Qwen3.5 hybrids.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gdn {
    /// `ssm.conv_kernel` (causal depthwise conv taps).
    pub d_conv: u64,
    /// `ssm.state_size` = key and value head size (16, 32, 64 or 128 for ggml's
    /// CUDA kernel).
    pub d_state: u64,
    /// `ssm.group_count` = K heads.
    pub n_k_heads: u64,
    /// `ssm.time_step_rank` = V heads (a multiple of the K heads).
    pub n_v_heads: u64,
    /// `full_attention_interval`: layer i has full attention iff (i + 1) % this == 0.
    pub interval: u64,
}

impl Gdn {
    /// `ssm.inner_size` = V heads × head size.
    pub fn value_dim(&self) -> u64 {
        self.n_v_heads * self.d_state
    }
    /// Q and K projection widths together.
    pub fn key_dim(&self) -> u64 {
        self.n_k_heads * self.d_state
    }
    /// Channels of the causal conv: [q ; k ; v].
    pub fn conv_dim(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }
    /// Whether trunk layer `i` is a DeltaNet layer.
    pub fn is_recurrent(&self, i: u64) -> bool {
        !(i + 1).is_multiple_of(self.interval)
    }
}

/// Rotary scaling of a checkpoint (HF `rope_scaling`), as the converter writes it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1+ (`rope_type: llama3`): no metadata keys; per-pair frequency
    /// divisors in a `rope_freqs.weight` tensor (`conversion/llama.py`).
    Llama3 {
        /// `factor`: the divisor of the slowest pairs.
        factor: f32,
        /// `low_freq_factor`.
        low_freq_factor: f32,
        /// `high_freq_factor`.
        high_freq_factor: f32,
        /// `original_max_position_embeddings`.
        orig_ctx: u32,
    },
    /// YaRN (`rope_type: yarn`): metadata keys only.
    Yarn(Yarn),
}

/// YaRN as the converter writes it (`rope.scaling.*` keys; Mistral 3 adds the
/// log multiplier and the query temperature).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    /// `rope.scaling.factor`.
    pub factor: f32,
    /// `rope.scaling.original_context_length`.
    pub orig_ctx: u32,
    /// `rope.scaling.yarn_beta_fast` / `yarn_beta_slow`.
    pub beta: (f32, f32),
    /// `rope.scaling.yarn_log_multiplier` (HF `mscale_all_dim`).
    pub log_mul: f32,
    /// `attention.temperature_scale` (HF `llama_4_scaling_beta`).
    pub temp_scale: f32,
}

impl RopeScaling {
    /// Llama 3.1's and 3.2's rope scaling by `factor`.
    fn llama3(factor: f32) -> Option<RopeScaling> {
        Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            orig_ctx: 8192,
        })
    }
}

/// Shape of a model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Architecture.
    pub arch: SynthArch,
    /// `embedding_length`.
    pub n_embd: u64,
    /// Trunk layers (without MTP blocks).
    pub n_layer: u64,
    /// Query heads.
    pub n_head: u64,
    /// Key/value heads.
    pub n_head_kv: u64,
    /// Attention head size (`n_embd / n_head` unless the model says otherwise).
    pub head_dim: u64,
    /// Dense FFN width (`feed_forward_length`; 0 = not written).
    pub n_ff: u64,
    /// Vocabulary size of the synthetic vocabulary (`--vocab` replaces it).
    pub n_vocab: u64,
    /// `rope.freq_base`.
    pub rope_base: f32,
    /// Rotated dimensions per head (Qwen3.5: a quarter of the head).
    pub n_rot: u64,
    /// `context_length`.
    pub n_ctx: u32,
    /// `attention.layer_norm_rms_epsilon`.
    pub rms_eps: f32,
    /// Routed experts instead of a dense FFN.
    pub moe: Option<Moe>,
    /// DeltaNet layers (Qwen3.5 hybrids).
    pub gdn: Option<Gdn>,
    /// Rotary scaling.
    pub rope_scaling: Option<RopeScaling>,
    /// `attention.sliding_window` (GPT-OSS).
    pub swa_window: Option<u32>,
    /// Whether the HF config names `head_dim` (the converter then writes
    /// `attention.key_length` / `value_length`).
    pub explicit_head_dim: bool,
    /// Gemma 4's layout.
    pub gemma4: Option<Gemma4>,
    /// Deepstack inputs of a Qwen3-VL language model (`n_deepstack_layers`):
    /// the deepstack features of the projector it pairs with.
    pub n_deepstack: u64,
}

impl Preset {
    /// The architecture this preset implies (`None`: a plain llama/qwen2 shape).
    pub fn arch(self) -> Option<SynthArch> {
        use Preset::*;
        match self {
            S135m | S0_5b | S1b | S7b | S8b => None,
            Llama32_1b | Llama31_8b | Llama3Tiny | Mistral7bV03 => Some(SynthArch::Llama),
            Ministral3_3b | Mistral3Tiny => Some(SynthArch::Mistral3),
            GptOss20b | GptOssTiny => Some(SynthArch::GptOss),
            Gemma4E2b | Gemma4_31b | Gemma4_26bA4b | Gemma4Tiny | Gemma4moeTiny => {
                Some(SynthArch::Gemma4)
            }
            Qwen3_0_6b | Qwen3Tiny => Some(SynthArch::Qwen3),
            Qwen3_30bA3b | Qwen3moeTiny => Some(SynthArch::Qwen3moe),
            Qwen3vlTiny => Some(SynthArch::Qwen3vl),
            Qwen3vlmoeTiny | Qwen3vl30bA3b => Some(SynthArch::Qwen3vlmoe),
            Qwen35_0_8b | Qwen35_2b | Qwen35_4b | Qwen35_9b | Qwen35_27b | Qwen35Tiny => {
                Some(SynthArch::Qwen35)
            }
            Qwen35_35bA3b | Qwen35moeTiny => Some(SynthArch::Qwen35moe),
        }
    }

    /// The shape for `arch` (which must agree with [`Preset::arch`]).
    pub fn shape(self, arch: SynthArch) -> Shape {
        use Preset::*;
        // Llama/Qwen2 shapes: head size n_embd / n_head, full rotation, eps 1e-5.
        let plain = |n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, rope_base| Shape {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim: n_embd / n_head,
            n_ff,
            n_vocab,
            rope_base,
            n_rot: n_embd / n_head,
            n_ctx: 131_072,
            rms_eps: 1e-5,
            moe: None,
            gdn: None,
            rope_scaling: None,
            swa_window: None,
            explicit_head_dim: false,
            gemma4: None,
            n_deepstack: 0,
        };
        // Qwen3 (HF config.json): rope_theta 1e6, rms_norm_eps 1e-6, 40960 positions.
        let qwen3 = |n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab| Shape {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            rope_base: 1e6,
            n_rot: head_dim,
            n_ctx: 40_960,
            rms_eps: 1e-6,
            moe: None,
            gdn: None,
            rope_scaling: None,
            swa_window: None,
            explicit_head_dim: true,
            gemma4: None,
            n_deepstack: 0,
        };
        // Qwen3.5: rope_theta 1e7, partial_rotary_factor 0.25, 262144 positions,
        // conv kernel 4, a full-attention layer every 4.
        let qwen35 = |n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_vocab, gdn| Shape {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_vocab,
            rope_base: 1e7,
            n_rot: head_dim / 4,
            n_ctx: 262_144,
            rms_eps: 1e-6,
            moe: None,
            gdn: Some(gdn),
            rope_scaling: None,
            swa_window: None,
            explicit_head_dim: true,
            gemma4: None,
            n_deepstack: 0,
        };
        let gdn = |d_state, n_k_heads, n_v_heads| Gdn {
            d_conv: 4,
            d_state,
            n_k_heads,
            n_v_heads,
            interval: 4,
        };
        let moe = |n_expert, n_used, n_ff_exp, n_ff_shexp| {
            Some(Moe {
                n_expert,
                n_used,
                n_ff_exp,
                n_ff_shexp,
            })
        };
        // GPT-OSS (HF config): head_dim 64, rope_theta 150000, 131072 positions,
        // YaRN factor 32 over 4096 (beta 32/1), sliding_window 128,
        // intermediate_size = the experts' width, 201088 tokens.
        let gpt_oss = |n_embd, n_layer, n_head, n_head_kv, moe: Option<Moe>| Shape {
            head_dim: 64,
            n_rot: 64,
            n_ff: moe.map_or(0, |m| m.n_ff_exp),
            n_vocab: 201_088,
            n_ctx: 131_072,
            moe,
            rope_scaling: Some(RopeScaling::Yarn(Yarn {
                factor: 32.0,
                orig_ctx: 4096,
                beta: (32.0, 1.0),
                log_mul: 0.0,
                temp_scale: 0.0,
            })),
            swa_window: Some(128),
            explicit_head_dim: true,
            gemma4: None,
            n_deepstack: 0,
            ..plain(n_embd, n_layer, n_head, n_head_kv, 0, 201_088, 150_000.0)
        };
        // Gemma 4 (HF text_config): rms_norm_eps 1e-6, rope 1e6 on full layers
        // (proportional, a quarter of each head) and 1e4 on sliding ones, final
        // logits soft-capped at 30, 262144 tokens.
        #[allow(clippy::too_many_arguments)]
        let gemma4 = |n_embd,
                      n_layer,
                      n_head,
                      (kv_swa, hd_swa),
                      (kv_full, hd_full),
                      n_ff,
                      window,
                      g: Gemma4| Shape {
            arch,
            n_embd,
            n_layer,
            n_head,
            n_head_kv: kv_swa,
            head_dim: hd_swa,
            n_ff,
            n_vocab: 262_144,
            rope_base: 1e6,
            n_rot: hd_full,
            n_ctx: 262_144,
            rms_eps: 1e-6,
            moe: None,
            gdn: None,
            rope_scaling: None,
            swa_window: Some(window),
            explicit_head_dim: true,
            n_deepstack: 0,
            gemma4: Some(Gemma4 {
                head_dim_full: hd_full,
                n_head_kv_full: kv_full,
                ..g
            }),
        };
        let g4 = |period, n_shared, n_embd_per_layer, double_wide, k_eq_v| Gemma4 {
            head_dim_full: 0,
            n_head_kv_full: 0,
            period,
            n_shared,
            n_embd_per_layer,
            double_wide,
            k_eq_v,
            rope_base_swa: 10_000.0,
            partial_rotary_full: 0.25,
            softcap: 30.0,
        };
        match self {
            Gemma4E2b => Shape {
                n_ctx: 131_072,
                ..gemma4(
                    1536,
                    35,
                    8,
                    (1, 256),
                    (1, 512),
                    6144,
                    512,
                    g4(5, 20, 256, true, false),
                )
            },
            Gemma4_31b => gemma4(
                5376,
                60,
                32,
                (16, 256),
                (4, 512),
                21504,
                1024,
                g4(6, 0, 0, false, true),
            ),
            Gemma4_26bA4b => Shape {
                moe: moe(128, 8, 704, None),
                ..gemma4(
                    2816,
                    30,
                    16,
                    (8, 256),
                    (2, 512),
                    2112,
                    1024,
                    g4(6, 0, 0, false, true),
                )
            },
            Gemma4Tiny => Shape {
                n_ctx: 131_072,
                ..gemma4(
                    128,
                    6,
                    4,
                    (2, 32),
                    (1, 64),
                    256,
                    128,
                    g4(3, 3, 32, true, false),
                )
            },
            Gemma4moeTiny => Shape {
                moe: moe(8, 2, 64, None),
                ..gemma4(
                    128,
                    6,
                    4,
                    (2, 32),
                    (1, 64),
                    128,
                    128,
                    g4(3, 0, 0, false, true),
                )
            },
            S135m => plain(576, 30, 9, 3, 1536, 49152, 100_000.0),
            S0_5b => plain(896, 24, 14, 2, 4864, 151_936, 1_000_000.0),
            S1b => plain(2048, 16, 32, 8, 8192, 128_256, 500_000.0),
            S7b => plain(3584, 28, 28, 4, 18944, 152_064, 1_000_000.0),
            S8b => plain(4096, 32, 32, 8, 14336, 128_256, 500_000.0),
            // Llama 3.2's config names head_dim (64), 3.1's does not.
            Llama32_1b => Shape {
                rope_scaling: RopeScaling::llama3(32.0),
                explicit_head_dim: true,
                ..plain(2048, 16, 32, 8, 8192, 128_256, 500_000.0)
            },
            Llama31_8b => Shape {
                rope_scaling: RopeScaling::llama3(8.0),
                ..plain(4096, 32, 32, 8, 14336, 128_256, 500_000.0)
            },
            Llama3Tiny => Shape {
                rope_scaling: RopeScaling::llama3(32.0),
                explicit_head_dim: true,
                ..plain(128, 4, 4, 2, 384, 128_256, 500_000.0)
            },
            // HF config: rope_theta 1e6, max_position_embeddings 32768.
            Mistral7bV03 => Shape {
                n_ctx: 32_768,
                ..plain(4096, 32, 32, 8, 14336, 32_768, 1_000_000.0)
            },
            // HF config (text_config): head_dim 128, rope_theta 1e6, 262144
            // positions, YaRN factor 16 over 16384, beta 32/1, mscale_all_dim 1,
            // llama_4_scaling_beta 0.1.
            Ministral3_3b => Shape {
                head_dim: 128,
                n_rot: 128,
                n_ctx: 262_144,
                rope_scaling: Some(RopeScaling::Yarn(Yarn {
                    factor: 16.0,
                    orig_ctx: 16_384,
                    beta: (32.0, 1.0),
                    log_mul: 1.0,
                    temp_scale: 0.1,
                })),
                explicit_head_dim: true,
                ..plain(3072, 26, 32, 8, 9216, 131_072, 1_000_000.0)
            },
            Mistral3Tiny => Shape {
                head_dim: 64,
                n_rot: 64,
                n_ctx: 4096,
                rope_scaling: Some(RopeScaling::Yarn(Yarn {
                    factor: 16.0,
                    orig_ctx: 256,
                    beta: (32.0, 1.0),
                    log_mul: 1.0,
                    temp_scale: 0.1,
                })),
                explicit_head_dim: true,
                ..plain(128, 4, 4, 2, 384, 131_072, 1_000_000.0)
            },
            GptOss20b => gpt_oss(2880, 24, 64, 8, moe(32, 4, 2880, None)),
            GptOssTiny => gpt_oss(128, 4, 4, 2, moe(8, 2, 64, None)),
            Qwen3_0_6b => qwen3(1024, 28, 16, 8, 128, 3072, 151_936),
            // intermediate_size 6144 is written as feed_forward_length but unused.
            Qwen3_30bA3b => Shape {
                moe: moe(128, 8, 768, None),
                ..qwen3(2048, 48, 32, 4, 128, 6144, 151_936)
            },
            Qwen35_0_8b => qwen35(1024, 24, 8, 2, 256, 3584, 248_320, gdn(128, 16, 16)),
            Qwen35_2b => qwen35(2048, 24, 8, 2, 256, 6144, 248_320, gdn(128, 16, 16)),
            Qwen35_4b => qwen35(2560, 32, 16, 4, 256, 9216, 248_320, gdn(128, 16, 32)),
            Qwen35_9b => qwen35(4096, 32, 16, 4, 256, 12288, 248_320, gdn(128, 16, 32)),
            Qwen35_27b => qwen35(5120, 64, 24, 4, 256, 17408, 248_320, gdn(128, 16, 48)),
            Qwen35_35bA3b => Shape {
                moe: moe(256, 8, 512, Some(512)),
                ..qwen35(2048, 40, 16, 2, 256, 0, 248_320, gdn(128, 16, 32))
            },
            Qwen3Tiny => qwen3(128, 4, 4, 2, 64, 384, 151_936),
            // HF Qwen3-VL text_config: rope_theta 5e6, 262144 positions.
            Qwen3vlTiny => Shape {
                rope_base: 5e6,
                n_ctx: 262_144,
                n_deepstack: 2,
                ..qwen3(128, 4, 4, 2, 64, 384, 151_936)
            },
            Qwen3vlmoeTiny => Shape {
                rope_base: 5e6,
                n_ctx: 262_144,
                n_deepstack: 2,
                moe: moe(8, 2, 64, None),
                ..qwen3(128, 4, 4, 2, 64, 384, 151_936)
            },
            // HF Qwen3-VL-30B-A3B text_config: Qwen3-30B-A3B's layers, rope_theta
            // 5e6, 262144 positions; vision_config deepstack_visual_indexes [8, 16, 24].
            Qwen3vl30bA3b => Shape {
                rope_base: 5e6,
                n_ctx: 262_144,
                n_deepstack: 3,
                moe: moe(128, 8, 768, None),
                ..qwen3(2048, 48, 32, 4, 128, 6144, 151_936)
            },
            Qwen3moeTiny => Shape {
                moe: moe(8, 2, 64, None),
                ..qwen3(128, 4, 4, 2, 64, 384, 151_936)
            },
            Qwen35Tiny => qwen35(128, 8, 4, 2, 64, 384, 151_936, gdn(32, 2, 4)),
            Qwen35moeTiny => Shape {
                moe: moe(8, 2, 64, Some(64)),
                ..qwen35(128, 8, 4, 2, 64, 0, 151_936, gdn(32, 2, 4))
            },
        }
    }
}

/// Resolves `--arch` and `--preset` into a shape: a preset of a named model implies
/// its architecture, the plain presets take llama or qwen2.
pub fn resolve(arch: Option<SynthArch>, preset: Option<Preset>) -> Result<Shape> {
    let (arch, preset) = match (arch, preset) {
        (a, Some(p)) => match (a, p.arch()) {
            (Some(a), Some(pa)) if a != pa => bail!(
                "preset {} is a {} model, not {}",
                p.to_possible_value()
                    .expect("no skipped presets")
                    .get_name(),
                pa.name(),
                a.name()
            ),
            (Some(a), None) if !matches!(a, SynthArch::Llama | SynthArch::Qwen2) => bail!(
                "preset {} is a llama/qwen2 shape; for --arch {} use its presets \
                 (e.g. {})",
                p.to_possible_value()
                    .expect("no skipped presets")
                    .get_name(),
                a.name(),
                a.default_preset()
                    .to_possible_value()
                    .expect("no skipped presets")
                    .get_name()
            ),
            (a, pa) => (pa.or(a).unwrap_or(SynthArch::Llama), p),
        },
        (Some(a), None) => (a, a.default_preset()),
        (None, None) => (SynthArch::Llama, Preset::S135m),
    };
    Ok(preset.shape(arch))
}
