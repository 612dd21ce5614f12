//! `tempo9 synth-gguf`: writes a model file with random weights in the layout
//! llama.cpp's converter produces (tensor names, shapes, metadata, a byte-level
//! BPE vocabulary), quantized with ggml's own quantizers. Real model files are too
//! large to carry to a GPU machine; this produces a same-shaped one there.
//!
//! The numbers are random, so the text is gibberish, but every byte a real model
//! of that shape moves is moved: speed measurements hold, and CPU/GPU comparisons
//! exercise the same kernels. Two deliberate differences from the published
//! models: the output projection is always a tensor of its own (with tied random
//! embeddings the residual stream is dominated by the current token's embedding,
//! and greedy decoding only repeats it), and residual branches are scaled down by
//! 1/sqrt(2 * layers) (GPT-2's initialisation), which keeps a deep random network
//! from collapsing onto one output token.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{bail, Context as _, Result};
use clap::{Args, ValueEnum};
use tempo9_ggml::{quantize_rows, DType};
use tempo9_gguf::{ArrayValue, GgmlType, GgufWriter, Value};

/// Architecture of the synthetic model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SynthArch {
    /// Llama (Llama 3, SmolLM2): no biases, normal rotary embedding.
    Llama,
    /// Qwen2 / Qwen2.5: Q/K/V biases, NeoX rotary embedding.
    Qwen2,
}

/// Model sizes, each the shape of a published model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Preset {
    /// SmolLM2-135M (576 wide, 30 layers, 49152 tokens).
    #[value(name = "135m")]
    S135m,
    /// Qwen2.5-0.5B (896 wide, 24 layers, 151936 tokens).
    #[value(name = "0.5b")]
    S0_5b,
    /// Llama-3.2-1B (2048 wide, 16 layers, 128256 tokens).
    #[value(name = "1b")]
    S1b,
    /// Qwen2.5-7B (3584 wide, 28 layers, 152064 tokens).
    #[value(name = "7b")]
    S7b,
    /// Llama-3.1-8B (4096 wide, 32 layers, 128256 tokens).
    #[value(name = "8b")]
    S8b,
}

/// Shape of a model.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n_embd: u64,
    n_layer: u64,
    n_head: u64,
    n_head_kv: u64,
    n_ff: u64,
    n_vocab: u64,
    rope_base: f32,
}

impl Preset {
    fn shape(self) -> Shape {
        let s = |n_embd, n_layer, n_head, n_head_kv, n_ff, n_vocab, rope_base| Shape {
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            n_vocab,
            rope_base,
        };
        match self {
            Preset::S135m => s(576, 30, 9, 3, 1536, 49152, 100_000.0),
            Preset::S0_5b => s(896, 24, 14, 2, 4864, 151_936, 1_000_000.0),
            Preset::S1b => s(2048, 16, 32, 8, 8192, 128_256, 500_000.0),
            Preset::S7b => s(3584, 28, 28, 4, 18944, 152_064, 1_000_000.0),
            Preset::S8b => s(4096, 32, 32, 8, 14336, 128_256, 500_000.0),
        }
    }
}

/// Arguments of `tempo9 synth-gguf`.
#[derive(Args)]
pub struct SynthArgs {
    /// Architecture.
    #[arg(long, value_enum, default_value_t = SynthArch::Llama)]
    arch: SynthArch,
    /// Model shape.
    #[arg(long, value_enum, default_value_t = Preset::S135m)]
    preset: Preset,
    /// Override the number of layers (smaller test models of the same width).
    #[arg(long, value_name = "N")]
    layers: Option<u64>,
    /// Storage type of the weight matrices (ggml type name: q4_k, q8_0, f16, ...).
    /// Like llama.cpp, the output projection of a k-quant model is q6_k, and rows
    /// that are not whole k-quant blocks fall back to a 32-block type.
    #[arg(long, value_name = "TYPE", default_value = "q4_k")]
    quant: String,
    /// Random seed (same seed and flags, same file).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Draw and quantize at most this many MiB per tensor and repeat them to fill
    /// the rest (fast files for speed tests, where values do not matter).
    #[arg(long, value_name = "MIB")]
    unique_mib: Option<u64>,
    /// Quantization threads (default: all cores).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Output file.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
}

/// How a tensor's random values are drawn.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// Uniform with this standard deviation.
    Uniform(f32),
    /// Every value equal.
    Const(f32),
}

struct Planned {
    dtype: DType,
    init: Init,
}

/// llama.cpp's fallback for rows that are not whole 256-blocks (`llama-quant.cpp`).
fn fallback(t: DType, n_per_row: u64) -> DType {
    if n_per_row.is_multiple_of(t.block_size() as u64) {
        return t;
    }
    let name = match t.name() {
        "q4_K" => "q5_0",
        "q5_K" => "q5_1",
        _ => "q8_0",
    };
    DType::from_name(name).expect("ggml knows its 32-block types")
}

/// The GPT-2 byte-to-character map of byte-level BPE vocabularies.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut out = ['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("small code point")
        };
    }
    out
}

/// A byte-level BPE vocabulary of `n` tokens: the 256 byte tokens, merges of
/// lower-case letter pairs (so text encodes into fewer tokens than bytes), filler
/// tokens, and three control tokens at the end (BOS, EOS, end of turn).
fn vocab(n: u64, arch: SynthArch, w: &mut GgufWriter) -> Result<()> {
    let n = n as usize;
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut merges = Vec::new();
    for a in b'a'..=b'z' {
        for b in b'a'..=b'z' {
            merges.push(format!("{} {}", a as char, b as char));
            tokens.push(format!("{}{}", a as char, b as char));
        }
    }
    let specials = match arch {
        SynthArch::Llama => ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
        SynthArch::Qwen2 => ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    };
    if n < tokens.len() + specials.len() + 1 {
        bail!("vocabulary of {n} tokens is too small");
    }
    while tokens.len() < n - specials.len() {
        tokens.push(format!("[syn{}]", tokens.len()));
    }
    let first_special = tokens.len() as u32;
    tokens.extend(specials.iter().map(|s| s.to_string()));
    let mut types = vec![1i32; n];
    types[first_special as usize..].fill(3);
    let (pre, bos, eos, eot) = match arch {
        SynthArch::Llama => (
            "llama-bpe",
            first_special,
            first_special + 1,
            first_special + 2,
        ),
        SynthArch::Qwen2 => ("qwen2", first_special, first_special + 2, first_special + 2),
    };
    let s = |x: &str| Value::String(x.into());
    w.set("tokenizer.ggml.model", s("gpt2"))
        .set("tokenizer.ggml.pre", s(pre))
        .set(
            "tokenizer.ggml.tokens",
            Value::Array(ArrayValue::String(tokens)),
        )
        .set(
            "tokenizer.ggml.token_type",
            Value::Array(ArrayValue::I32(types)),
        )
        .set(
            "tokenizer.ggml.merges",
            Value::Array(ArrayValue::String(merges)),
        )
        .set("tokenizer.ggml.bos_token_id", Value::U32(bos))
        .set("tokenizer.ggml.eos_token_id", Value::U32(eos))
        .set("tokenizer.ggml.eot_token_id", Value::U32(eot))
        .set(
            "tokenizer.ggml.add_bos_token",
            Value::Bool(arch == SynthArch::Llama),
        );
    Ok(())
}

/// Deterministic per-chunk random numbers (xorshift64*), so the file does not
/// depend on how many threads wrote it.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, tensor: usize, chunk: usize) -> Rng {
        let mut x = seed ^ 0x9E37_79B9_7F4A_7C15;
        for v in [tensor as u64, chunk as u64] {
            x = (x ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x ^= x >> 31;
        }
        Rng(x | 1)
    }
    /// Uniform in [-1, 1).
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let r = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Random values of `n_rows` rows of chunk `chunk` of tensor `ti`, quantized.
fn draw(
    p: &Planned,
    seed: u64,
    ti: usize,
    chunk: usize,
    n_rows: u64,
    n_per_row: u64,
) -> Result<Vec<u8>, String> {
    let n = (n_rows * n_per_row) as usize;
    let src: Vec<f32> = match p.init {
        Init::Const(c) => vec![c; n],
        Init::Uniform(std) => {
            // Uniform on [-a, a] has std a / sqrt(3).
            let amp = std * 3f32.sqrt();
            let mut r = Rng::new(seed, ti, chunk);
            (0..n).map(|_| r.next() * amp).collect()
        }
    };
    quantize_rows(p.dtype, &src, n_per_row as usize).map_err(|e| e.to_string())
}

/// Values per parallel work item (bounds memory: threads × this × 4 bytes).
const CHUNK_VALUES: u64 = 1 << 20;

/// Runs `tempo9 synth-gguf`.
pub fn run(a: SynthArgs) -> Result<()> {
    let quant =
        DType::from_name(&a.quant).with_context(|| format!("unknown ggml type '{}'", a.quant))?;
    let mut sh = a.preset.shape();
    if let Some(l) = a.layers {
        if l == 0 {
            bail!("--layers must be at least 1");
        }
        sh.n_layer = l;
    }
    let arch = match a.arch {
        SynthArch::Llama => "llama",
        SynthArch::Qwen2 => "qwen2",
    };
    let head_dim = sh.n_embd / sh.n_head;
    let (e, q_dim, kv_dim) = (sh.n_embd, sh.n_head * head_dim, sh.n_head_kv * head_dim);
    let is_k = matches!(quant.name(), "q2_K" | "q3_K" | "q4_K" | "q5_K");
    let out_type = if is_k { DType::Q6_K } else { quant };

    let mut w = GgufWriter::new();
    let k = |x: &str| format!("{arch}.{x}");
    w.set("general.architecture", Value::String(arch.into()))
        .set(
            "general.name",
            Value::String(format!("synthetic {arch} {:?} {}", a.preset, quant.name())),
        )
        .set("general.quantization_version", Value::U32(2))
        .set(&k("context_length"), Value::U32(131_072))
        .set(&k("embedding_length"), Value::U32(e as u32))
        .set(&k("block_count"), Value::U32(sh.n_layer as u32))
        .set(&k("feed_forward_length"), Value::U32(sh.n_ff as u32))
        .set(&k("attention.head_count"), Value::U32(sh.n_head as u32))
        .set(
            &k("attention.head_count_kv"),
            Value::U32(sh.n_head_kv as u32),
        )
        .set(&k("rope.dimension_count"), Value::U32(head_dim as u32))
        .set(&k("rope.freq_base"), Value::F32(sh.rope_base))
        .set(&k("attention.layer_norm_rms_epsilon"), Value::F32(1e-5))
        .set(&k("vocab_size"), Value::U32(sh.n_vocab as u32));
    vocab(sh.n_vocab, a.arch, &mut w)?;

    // Scales keep activations O(1) through the layers (inputs of unit RMS times
    // weights of variance 1/fan_in), and make logits spread over a few units so
    // greedy choices are not near-ties.
    let unit = |fan_in: u64| Init::Uniform(1.0 / (fan_in as f32).sqrt());
    let branch_scale = 1.0 / (2.0 * sh.n_layer as f32).sqrt();
    let branch = |fan_in: u64| Init::Uniform(branch_scale / (fan_in as f32).sqrt());
    let mut plan: Vec<Planned> = Vec::new();
    let mut add = |w: &mut GgufWriter, name: &str, shape: &[u64], t: DType, init| -> Result<()> {
        let t = fallback(t, shape[0]);
        let gt = GgmlType::from_u32(t.raw()).context("ggml type unknown to the GGUF crate")?;
        w.add_tensor(name, shape, gt)?;
        plan.push(Planned { dtype: t, init });
        Ok(())
    };
    let f32t = DType::F32;
    add(
        &mut w,
        "token_embd.weight",
        &[e, sh.n_vocab],
        quant,
        Init::Uniform(1.0),
    )?;
    for i in 0..sh.n_layer {
        let n = |s: &str| format!("blk.{i}.{s}");
        add(&mut w, &n("attn_norm.weight"), &[e], f32t, Init::Const(1.0))?;
        add(&mut w, &n("attn_q.weight"), &[e, q_dim], quant, unit(e))?;
        add(&mut w, &n("attn_k.weight"), &[e, kv_dim], quant, unit(e))?;
        add(&mut w, &n("attn_v.weight"), &[e, kv_dim], quant, unit(e))?;
        if a.arch == SynthArch::Qwen2 {
            add(
                &mut w,
                &n("attn_q.bias"),
                &[q_dim],
                f32t,
                Init::Uniform(0.1),
            )?;
            add(
                &mut w,
                &n("attn_k.bias"),
                &[kv_dim],
                f32t,
                Init::Uniform(0.1),
            )?;
            add(
                &mut w,
                &n("attn_v.bias"),
                &[kv_dim],
                f32t,
                Init::Uniform(0.1),
            )?;
        }
        add(
            &mut w,
            &n("attn_output.weight"),
            &[q_dim, e],
            quant,
            branch(q_dim),
        )?;
        add(&mut w, &n("ffn_norm.weight"), &[e], f32t, Init::Const(1.0))?;
        add(&mut w, &n("ffn_gate.weight"), &[e, sh.n_ff], quant, unit(e))?;
        add(&mut w, &n("ffn_up.weight"), &[e, sh.n_ff], quant, unit(e))?;
        add(
            &mut w,
            &n("ffn_down.weight"),
            &[sh.n_ff, e],
            quant,
            branch(sh.n_ff),
        )?;
    }
    add(&mut w, "output_norm.weight", &[e], f32t, Init::Const(1.0))?;
    let logit_scale = Init::Uniform(4.0 / (e as f32).sqrt());
    add(
        &mut w,
        "output.weight",
        &[e, sh.n_vocab],
        out_type,
        logit_scale,
    )?;

    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(4, |n| n.get()))
        .max(1);
    let total: u64 = w.tensors().iter().map(|t| t.n_bytes).sum();
    let t0 = std::time::Instant::now();
    let file =
        std::fs::File::create(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let mut out = BufWriter::with_capacity(1 << 22, file);
    let seed = a.seed;
    let unique_limit = a.unique_mib.map(|m| m << 20);
    w.write(&mut out, |ti, decl, out| {
        let p = &plan[ti];
        let n_per_row = decl.shape[0];
        let rows: u64 = decl.shape[1..].iter().product();
        let rows_per_chunk = (CHUNK_VALUES / n_per_row).max(1);
        let chunks: Vec<u64> = (0..rows)
            .step_by(rows_per_chunk as usize)
            .map(|r| rows_per_chunk.min(rows - r))
            .collect();
        // With --unique-mib, only the first chunks are drawn and quantized; the rest
        // of the tensor repeats them (whole rows, so the file stays valid).
        let chunk_bytes = p.dtype.row_size(n_per_row as i64) as u64 * rows_per_chunk;
        let n_unique = match unique_limit {
            Some(l) => (l.div_ceil(chunk_bytes).max(1) as usize).min(chunks.len()),
            None => chunks.len(),
        };
        let mut unique: Vec<Vec<u8>> = Vec::new();
        for (ci, &n_rows) in chunks.iter().enumerate() {
            if ci < n_unique && ci % threads == 0 {
                // Quantize the next wave of chunks in parallel (all threads busy on
                // every tensor, memory bounded by threads * CHUNK_VALUES floats).
                let wave: Vec<(usize, u64)> = (ci..(ci + threads).min(n_unique))
                    .map(|c| (c, chunks[c]))
                    .collect();
                let done: Vec<Result<Vec<u8>, String>> = std::thread::scope(|s| {
                    let hs: Vec<_> = wave
                        .iter()
                        .map(|&(c, n)| s.spawn(move || draw(p, seed, ti, c, n, n_per_row)))
                        .collect();
                    hs.into_iter()
                        .map(|h| h.join().expect("quantizer thread panicked"))
                        .collect()
                });
                for d in done {
                    unique.push(d.map_err(std::io::Error::other)?);
                }
            }
            let src = &unique[ci % n_unique];
            let len = (src.len() as u64 / chunks[ci % n_unique] * n_rows) as usize;
            out.write_all(&src[..len])?;
        }
        Ok(())
    })
    .with_context(|| format!("writing {}", a.out.display()))?;
    out.flush()?;
    eprintln!(
        "wrote {} ({:.2} GB of tensors, {} layers, {}) in {:.1} s",
        a.out.display(),
        total as f64 / 1e9,
        sh.n_layer,
        quant.name(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_match_gpt2() {
        let c = byte_chars();
        assert_eq!(c[b'A' as usize], 'A');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        let mut all: Vec<char> = c.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}
