//! `tempo9 synth-gguf`: writes a model file with random weights in the layout
//! llama.cpp's converter produces (tensor names, shapes, metadata; a byte-level
//! BPE vocabulary or a real one copied from a vocab-only GGUF), quantized with
//! ggml's own quantizers. Real model files are too large to carry to a GPU
//! machine; this produces a same-shaped one there, and tiny ones for tests
//! (llama with or without Llama 3 rope scaling, qwen2, and the Qwen3 family:
//! qwen3, qwen3moe, the Qwen3-VL language models qwen3vl and qwen3vlmoe, qwen35,
//! qwen35moe).
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
use tempo9_gguf::{GgmlType, GgufWriter, Value};

mod gemma4;
mod mmproj;
mod mmproj_gemma4;
mod shapes;
mod tensors;
mod vocab;

use shapes::{Preset, SynthArch};
use tensors::{Init, Kind};

/// Arguments of `tempo9 synth-gguf`.
#[derive(Args)]
pub struct SynthArgs {
    /// Architecture (default: the preset's; llama for the plain presets).
    #[arg(long, value_enum)]
    arch: Option<SynthArch>,
    /// Model shape (default: 135m, or the first published preset of `--arch`).
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// Override the number of layers (smaller test models of the same width).
    #[arg(long, value_name = "N")]
    layers: Option<u64>,
    /// Append one multi-token-prediction ("nextn") block, as the converter does
    /// for Qwen3.5 checkpoints (qwen35 / qwen35moe only).
    #[arg(long)]
    mtp: bool,
    /// Copy every `tokenizer.*` key from this GGUF (e.g. llama.cpp's
    /// `models/ggml-vocab-qwen35.gguf`); the vocabulary size becomes its token
    /// count. Default: a synthetic byte-level BPE vocabulary of the preset's size.
    #[arg(long, value_name = "GGUF")]
    vocab: Option<PathBuf>,
    /// Write this file's text as `tokenizer.chat_template` (replaces one from `--vocab`).
    #[arg(long, value_name = "JINJA")]
    template: Option<PathBuf>,
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
    /// Quantization threads (default: all cores; the file does not depend on it).
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Output file.
    #[arg(long, value_name = "PATH")]
    out: PathBuf,
    /// Write this vision projector (`mmproj` file, for `serve --mmproj`) instead
    /// of a language model; the other options are ignored. `qwen3vl-tiny`: the
    /// tiny Qwen3-VL projector of the vision tests, for the qwen3vl-tiny and
    /// qwen3vlmoe-tiny presets; `qwen3-vl-30b-a3b`: the published vision tower,
    /// for the preset of that name; `gemma4-tiny`: the tiny Gemma 4 projector, for
    /// the gemma4-tiny and gemma4moe-tiny presets.
    #[arg(long, value_enum, value_name = "NAME")]
    projector: Option<ProjectorPreset>,
}

/// Projector files `synth-gguf --projector` writes.
#[derive(Clone, Copy, ValueEnum)]
enum ProjectorPreset {
    /// Qwen3-VL merger, ViT of 16 wide × 3 blocks, 4-pixel patches, 128-wide output
    /// with 2 deepstack features.
    Qwen3vlTiny,
    /// Qwen3-VL-30B-A3B's vision tower (27 blocks of 1152, 16-pixel patches,
    /// 2048-wide output, 3 deepstack features), F16, random weights: for speed
    /// tests with the `qwen3-vl-30b-a3b` language model.
    #[value(name = "qwen3-vl-30b-a3b")]
    Qwen3vl30bA3b,
    /// Gemma 4 vision (`gemma4v`), ViT of 32 wide × 2 blocks, 4-pixel patches
    /// pooled 3×3, 128-wide output: for the gemma4-tiny and gemma4moe-tiny presets.
    #[value(name = "gemma4-tiny")]
    Gemma4Tiny,
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
    let src: Vec<f32> = match &p.init {
        Init::Values(v) if v.len() == n => v.clone(),
        Init::Values(v) => {
            return Err(format!("{} values for {n} elements", v.len()));
        }
        &Init::Const(c) => vec![c; n],
        &Init::Uniform(std) => {
            // Uniform on [-a, a] has std a / sqrt(3).
            let amp = std * 3f32.sqrt();
            let mut r = Rng::new(seed, ti, chunk);
            (0..n).map(|_| r.next() * amp).collect()
        }
        &Init::Around(mean, std) => {
            let amp = std * 3f32.sqrt();
            let mut r = Rng::new(seed, ti, chunk);
            (0..n).map(|_| mean + r.next() * amp).collect()
        }
        &Init::NegExp(lo, hi) => {
            let mut r = Rng::new(seed, ti, chunk);
            (0..n)
                .map(|_| -(lo + (r.next() + 1.0) * 0.5 * (hi - lo)).exp())
                .collect()
        }
    };
    quantize_rows(p.dtype, &src, n_per_row as usize).map_err(|e| e.to_string())
}

/// Values per parallel work item (bounds memory: threads × this × 4 bytes).
const CHUNK_VALUES: u64 = 1 << 20;

/// Runs `tempo9 synth-gguf`.
pub fn run(a: SynthArgs) -> Result<()> {
    if let Some(p) = a.projector {
        let write = || -> std::io::Result<()> {
            let mut f = std::io::BufWriter::new(std::fs::File::create(&a.out)?);
            match p {
                ProjectorPreset::Qwen3vlTiny => mmproj::write_qwen3vl(&mmproj::TINY, &mut f)?,
                ProjectorPreset::Qwen3vl30bA3b => {
                    mmproj::write_qwen3vl(&mmproj::QWEN3_VL_30B_A3B, &mut f)?
                }
                ProjectorPreset::Gemma4Tiny => {
                    std::io::Write::write_all(&mut f, &mmproj_gemma4::tiny_gemma4v())?
                }
            }
            std::io::Write::flush(&mut f)
        };
        return write().with_context(|| format!("writing {}", a.out.display()));
    }
    let quant =
        DType::from_name(&a.quant).with_context(|| format!("unknown ggml type '{}'", a.quant))?;
    let mut sh = shapes::resolve(a.arch, a.preset)?;
    if let Some(l) = a.layers {
        if l == 0 {
            bail!("--layers must be at least 1");
        }
        sh.n_layer = l;
    }
    if sh.gemma4.is_some() {
        gemma4::check(&sh).map_err(anyhow::Error::msg)?;
    }
    if a.mtp && !sh.arch.is_hybrid() {
        bail!("--mtp: llama.cpp's converter writes MTP blocks only for qwen35 and qwen35moe");
    }
    let arch = sh.arch.name();
    let is_k = matches!(quant.name(), "q2_K" | "q3_K" | "q4_K" | "q5_K");
    let out_type = if is_k { DType::Q6_K } else { quant };

    let vocab_file = a.vocab.as_deref().map(vocab::from_file).transpose()?;
    let n_vocab = vocab_file.as_ref().map_or(sh.n_vocab, |v| v.1);
    let preset = a.preset.unwrap_or(sh.arch.default_preset());
    let preset = preset.to_possible_value().expect("no skipped presets");

    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String(arch.into()))
        .set(
            "general.name",
            Value::String(format!(
                "synthetic {arch} {} {}",
                preset.get_name(),
                quant.name()
            )),
        )
        .set("general.quantization_version", Value::U32(2));
    tensors::metadata(&sh, a.mtp, n_vocab, &mut w);
    match vocab_file {
        Some((keys, _)) => {
            for (k, v) in keys {
                w.set(&k, v);
            }
        }
        None => vocab::synthetic(n_vocab, sh.arch, &mut w)?,
    }
    if let Some(t) = &a.template {
        let text =
            std::fs::read_to_string(t).with_context(|| format!("reading {}", t.display()))?;
        w.set("tokenizer.chat_template", Value::String(text));
    }

    let mut plan: Vec<Planned> = Vec::new();
    for t in tensors::tensors(&sh, a.mtp, n_vocab) {
        let dtype = match t.kind {
            Kind::Weight => fallback(quant, t.shape[0]),
            Kind::Output => fallback(out_type, t.shape[0]),
            Kind::F32 => DType::F32,
            Kind::Mxfp4 => DType::from_name("mxfp4").context("ggml has no mxfp4")?,
        };
        let gt = GgmlType::from_u32(dtype.raw()).context("ggml type unknown to the GGUF crate")?;
        w.add_tensor(&t.name, &t.shape, gt)?;
        plan.push(Planned {
            dtype,
            init: t.init,
        });
    }

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
