//! `tempo9`: the command line of the Tempo9 inference engine.
//!
//! Generated text goes to stdout; logs, progress and timings go to stderr.

mod bench;
mod chat;
mod check;
mod device;
mod serve;
mod streams;
mod synth;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use tempo9_engine::{
    default_threads, DraftModel, EngineConfig, Policy, SpecConfig, SpecMode, SsdConfig,
};
use tempo9_ggml::DeviceKind;
use tempo9_models::{LoadOptions, Model};

/// Tempo9: a local LLM inference engine for many agents sharing one runtime.
#[derive(Parser)]
#[command(
    name = "tempo9",
    // The source tree in the version: benchmarks check that the binary they run was
    // built from their checkout (a shared target dir can hold another tree's build).
    version = concat!(env!("CARGO_PKG_VERSION"), " (built from ", env!("CARGO_MANIFEST_DIR"), ")"),
    about,
    after_help = "Without a command, `tempo9 --gguf PATH …` serves (see `tempo9 serve --help`)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the OpenAI, Anthropic and Ollama HTTP APIs (the default command).
    Serve(Box<serve::ServeArgs>),
    /// Generate from a prompt (or chat interactively when no prompt is given).
    Run(chat::RunArgs),
    /// Measure prompt processing and generation speed (JSON on stdout).
    Bench(bench::BenchArgs),
    /// Write a model file with random weights of a given shape and type.
    SynthGguf(synth::SynthArgs),
    /// Compare greedy generations on the chosen device with the CPU's (JSON on stdout).
    CheckDevice(check::CheckArgs),
    /// Print the CPU kernel set of this build: the fingerprint that exact-parity
    /// fixtures are recorded and selected by (JSON on stdout).
    Kernels,
}

/// Options shared by every command that loads a model.
#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Path of the GGUF model file.
    #[arg(long, value_name = "PATH")]
    pub gguf: PathBuf,
    /// CPU threads for compute (default: all available cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Per-request context limit in tokens, prompt plus output (default: the
    /// model's trained context). Reserves no memory.
    #[arg(long, value_name = "TOKENS")]
    pub ctx: Option<usize>,
    /// KV cache memory for all requests together, e.g. `2G`, `512M` (default: a
    /// quarter of system memory; on a GPU at most its free memory after the weights,
    /// less 1 GiB or 1/16 of it for compute buffers). On the CPU it is committed only
    /// as tokens arrive; on a GPU it is allocated at start.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub kv_budget: Option<usize>,
    /// Tokens per KV page (16, 32, 64, 128 or 256); the prefix cache shares whole pages.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub kv_page_tokens: usize,
    /// Directory of the SSD tier for KV pages: cached prefix pages evicted from RAM
    /// are written there and read back on a later prefix hit (default:
    /// `$XDG_CACHE_HOME/tempo9/kv`, else `~/.cache/tempo9/kv`).
    #[arg(long, value_name = "DIR")]
    pub kv_ssd_dir: Option<PathBuf>,
    /// Disk space of the SSD tier, e.g. `8G`; least recently used pages are removed
    /// beyond it (default: min(16 GiB, a quarter of the free space)).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub kv_ssd_budget: Option<usize>,
    /// Turn the SSD tier off: pages evicted from RAM are dropped and recomputed.
    #[arg(long, conflicts_with_all = ["kv_ssd_dir", "kv_ssd_budget", "kv_persist"])]
    pub no_kv_ssd: bool,
    /// Keep the SSD tier and its index across restarts (under a subdirectory named
    /// after the model file and KV layout), and write the RAM prefix cache to it on
    /// shutdown, so a restarted server serves known prefixes from disk.
    #[arg(long)]
    pub kv_persist: bool,
    /// Most tokens computed in one step; long prompts are prefilled in chunks of
    /// this size while other requests keep decoding (default: 512; 2048 for a
    /// mixture-of-experts model on a GPU, whose steps read nearly every expert
    /// whatever their size).
    #[arg(long, value_name = "N")]
    pub step_tokens: Option<usize>,
    /// Most prompt tokens in one step while a single request runs and no other
    /// waits but for the prefix it is computing (default: `--step-tokens` on the
    /// CPU, 2048 on a GPU, where larger chunks prefill a long prompt faster).
    #[arg(long, value_name = "N")]
    pub solo_step_tokens: Option<usize>,
    /// While requests are decoding, shrink prompt chunks (down to 64 tokens) so a
    /// step takes about this many milliseconds: bounds the delay a long prompt adds
    /// between other streams' tokens on slow hardware. 0 = always full chunks.
    #[arg(long, value_name = "MS", default_value_t = 500)]
    pub itl_target_ms: u64,
    /// Most requests running at once (more wait in the queue).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_running: usize,
    /// Scheduling policy: `fcfs`, `priority` (lower request priority first) or
    /// `shortest` (earliest estimated prompt completion first: least prompt left
    /// among requests arriving together, aged by waiting time so none starves).
    #[arg(long, value_name = "NAME", default_value = "fcfs", value_parser = parse_policy)]
    pub policy: Policy,
    /// Batch-invariant numbers: every request's tokens and log-probabilities are the
    /// same whatever other requests share its steps. Costs single-stream decode
    /// speed on CPUs where ggml repacks few weight types (up to half on AVX2 for
    /// Q5_0/Q8_0 weights); off, batching may reorder near-tied greedy choices.
    #[arg(long)]
    pub deterministic: bool,
    /// Speculative decoding: draft up to N tokens per decoding request and step and
    /// verify them in the step (0 = off). Greedy output is unchanged (bit for bit with
    /// `--deterministic` on the CPU); sampled output keeps its distribution. On hybrid
    /// models (Qwen3.5) each request verifying drafts holds N scratch recurrent
    /// states during a step (out of `--kv-budget`). Requests may opt out
    /// (`"speculation": false`), or pass a predicted output (OpenAI `prediction`),
    /// which then drafts first.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub speculation_k: usize,
    /// Where drafts come from with `--speculation-k`: `ngram` (prompt lookup: the
    /// tokens that followed the latest earlier occurrence of the context's last 2-4
    /// tokens; no extra weights) or `draft` (a smaller model with the same
    /// vocabulary, `--draft-gguf`, decodes them; its KV takes a share of
    /// `--kv-budget`) or `mtp` (the model's own multi-token-prediction head, Qwen3.5's
    /// `nextn` block, drafts from the model's hidden states; its one layer of KV takes
    /// a share of `--kv-budget`).
    #[arg(long, value_name = "MODE", default_value = "ngram", value_parser = parse_spec_mode)]
    pub speculation: SpecMode,
    /// The draft model of `--speculation draft`: a GGUF file with the same
    /// vocabulary as the model (e.g. Qwen2.5-Coder-0.5B for the 1.5B), loaded on the
    /// same device.
    #[arg(long, value_name = "PATH")]
    pub draft_gguf: Option<PathBuf>,
    /// No request drafts while more than this many requests decode (a large batch
    /// already keeps the device busy).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub speculation_max_batch: usize,
    /// Draft `--speculation-k` tokens whenever drafts are found (llama.cpp's way).
    /// By default each step's depth is planned per request from how often its
    /// drafts were accepted and what a verification row measurably costs on this
    /// device: deep where rows are cheap and drafts hold, none where they do not pay.
    #[arg(long)]
    pub speculation_fixed_depth: bool,
    /// Keep every token's K/V in sliding-window layers too (as llama.cpp's
    /// `--swa-full`). By default those layers (Gemma 3, GPT-OSS) hold only the pages
    /// their window sees, which for Gemma 3 cuts KV memory at long contexts by about
    /// the share of sliding layers (5 of 6).
    #[arg(long)]
    pub swa_full: bool,
    /// Decode rows attend through flash attention at any depth, as llama.cpp's do
    /// (with `--swa-full` and llama.cpp's thread count, its numbers bit for bit
    /// where ggml's kernels allow: how the model matrix compares Gemma 4's
    /// random-weight files). By default the CPU attends past a few hundred cells
    /// through matrix multiplications, which is faster there and rounds differently.
    #[arg(long)]
    pub flash_decode: bool,
    /// Sliding-window layers keep, for a cached prefix, the window before every
    /// multiple of this many tokens (llama.cpp spaces its context checkpoints the
    /// same), so a prompt that forks from a cached one reuses it up to the last such
    /// point. Prompt and conversation ends, and junctions where two prompts already
    /// parted, are always kept. 0 = only those: least memory.
    #[arg(long, value_name = "TOKENS", default_value_t = 8192)]
    pub swa_checkpoint: usize,
    /// Hybrid models (Qwen3.5: recurrent-state layers) checkpoint a long prompt's
    /// state every this many tokens (a multiple of --page-tokens), so a prompt that
    /// parts from a cached one anywhere recomputes fewer than 1.25 times this many tokens. Prompt
    /// ends and the points where prompts part are always checkpointed. Each
    /// checkpoint costs one state slot (tempo9_kv_state_slot_bytes); 0 = only those.
    #[arg(long, value_name = "TOKENS", default_value_t = 2048)]
    pub state_checkpoint: usize,
    /// Hybrid models also checkpoint the state after each page an answer fills, so
    /// an agent's next turn skips recomputing the answer; that state is the one
    /// decoding computed, so the next turn's numbers are no longer bit-identical to
    /// computing its prompt from scratch. Off: the answer is recomputed once as part
    /// of the next prompt.
    #[arg(long)]
    pub answer_state_checkpoints: bool,
    #[command(flatten)]
    pub device: device::DeviceArgs,
}

/// Parses a byte size with an optional binary suffix: `1048576`, `512M`, `2G`, `1.5GiB`.
fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("not a size: {s}"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1u64,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("unknown size unit '{u}' in {s}")),
    };
    Ok((n * mult as f64) as usize)
}

fn parse_policy(s: &str) -> std::result::Result<Policy, String> {
    Policy::parse(s).ok_or_else(|| format!("unknown policy '{s}' (fcfs, priority, shortest)"))
}

fn parse_spec_mode(s: &str) -> std::result::Result<SpecMode, String> {
    SpecMode::parse(s)
        .ok_or_else(|| format!("unknown speculation mode `{s}` (known: ngram, draft, mtp)"))
}

/// Default `--solo-step-tokens` on a GPU: a prompt prefilled alone in 2048-token
/// steps rather than 512 costs less host time per token (each step builds a graph
/// and a mask at the prompt's depth) and runs its matmuls better: a 10K-token prompt
/// took 1.08 s instead of 1.16 s on the H200 (llama.cpp's batch is 2048 tokens too).
/// Only alone: with several prompts in flight, 2048-token steps made the short ones
/// finish at a long step's end (agents' follow-up TTFT p50 up from ~0.3 to ~0.45 s
/// there).
const SOLO_STEP_TOKENS_GPU: usize = 2048;

/// Default `--step-tokens`.
const STEP_TOKENS: usize = 512;

/// Default `--step-tokens` for a mixture-of-experts model on a GPU. A step of 512
/// prompt tokens routes ~16 tokens to each of 256 experts (top-8), so it reads
/// nearly every expert as a 2048-token step does: on the H200, Qwen3.5-35B-A3B
/// shape at a 10K-token depth, 125-140 ms per 512-token step against 245-265 ms per
/// 2048. Prompts that arrive together then finish sooner in larger steps, though a
/// decoding stream waits longer for each: agents-10k round-1 TTFT p50 0.45 -> 0.38x
/// llama.cpp's, agents-1.5k p95 0.18 -> 0.14x (2026-12-03, interleaved). For a dense
/// model 512 stays better (the solo note above).
const STEP_TOKENS_GPU_MOE: usize = 2048;

impl ModelArgs {
    /// Engine settings from the flags, with defaults for `model`'s device.
    pub fn engine_config(&self, model: &Model) -> Result<EngineConfig> {
        let on_cpu = model.device().kind() == DeviceKind::Cpu;
        let step_tokens = self
            .step_tokens
            .unwrap_or(if !on_cpu && model.hparams().moe.is_some() {
                STEP_TOKENS_GPU_MOE
            } else {
                STEP_TOKENS
            });
        let draft_model = match (&self.draft_gguf, self.speculation) {
            (Some(p), SpecMode::Draft) => Some(DraftModel(load_model(p, &self.device)?)),
            (None, SpecMode::Draft) if self.speculation_k > 0 => {
                anyhow::bail!("--speculation draft needs --draft-gguf")
            }
            (Some(_), _) => anyhow::bail!("--draft-gguf is for --speculation draft"),
            (None, _) => None,
        };
        Ok(EngineConfig {
            draft_model,
            threads: self.threads.unwrap_or_else(default_threads),
            kv_budget_bytes: self.kv_budget,
            page_tokens: self.kv_page_tokens,
            max_running: self.max_running,
            step_tokens,
            solo_step_tokens: self.solo_step_tokens.unwrap_or(if on_cpu {
                step_tokens
            } else {
                SOLO_STEP_TOKENS_GPU
            }),
            itl_target: (self.itl_target_ms > 0)
                .then(|| std::time::Duration::from_millis(self.itl_target_ms)),
            max_context: self.ctx,
            policy: self.policy,
            ssd: self.ssd_config(),
            deterministic: self.deterministic,
            swa_full: self.swa_full,
            flash_decode: self.flash_decode,
            window_checkpoint_tokens: self.swa_checkpoint,
            state_checkpoint_tokens: self.state_checkpoint,
            answer_state_checkpoints: self.answer_state_checkpoints,
            speculation: (self.speculation_k > 0).then_some(SpecConfig {
                mode: self.speculation,
                k: self.speculation_k.min(tempo9_engine::spec::MAX_DRAFT),
                max_batch: self.speculation_max_batch,
                fixed_depth: self.speculation_fixed_depth,
            }),
            ..EngineConfig::default()
        })
    }

    /// The SSD tier's settings: on unless `--no-kv-ssd`.
    fn ssd_config(&self) -> Option<SsdConfig> {
        if self.no_kv_ssd {
            return None;
        }
        let dir = self
            .kv_ssd_dir
            .clone()
            .unwrap_or_else(tempo9_engine::ssd::default_dir);
        let mut cfg = SsdConfig::new(dir);
        if let Some(b) = self.kv_ssd_budget {
            cfg.budget_bytes = b as u64;
        }
        cfg.persist = self.kv_persist;
        Some(cfg)
    }
}

/// Loads a model on the device `dev` chooses, with a progress bar when stderr is a
/// terminal.
pub fn load_model(path: &Path, dev: &device::DeviceArgs) -> Result<Arc<Model>> {
    let device = dev.select()?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "loading {msg} [{bar:30}] {bytes}/{total_bytes}",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        b.set_message(
            path.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
        );
        b
    });
    let mut progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let t0 = std::time::Instant::now();
    let model = Model::load(
        path,
        LoadOptions {
            device,
            progress: Some(&mut progress),
            repack: true,
            offload: dev.offload(),
        },
    )
    .with_context(|| format!("loading {}", path.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    tracing::info!(
        ms = t0.elapsed().as_millis() as u64,
        device = %device.name(),
        placement = ?model.weight_placement(),
        "loaded {}",
        path.display()
    );
    Ok(Arc::new(model))
}

fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TEMPO9_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .init();
    tempo9_ggml::init_logging();
    let cli = match serve::serve_by_default(std::env::args_os().collect()) {
        Ok(args) => Cli::parse_from(args),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    };
    let result = match cli.command {
        Command::Serve(a) => serve::run(*a),
        Command::Run(a) => chat::run(a),
        Command::Bench(a) => bench::run(a),
        Command::SynthGguf(a) => synth::run(a),
        Command::CheckDevice(a) => check::run(a),
        Command::Kernels => {
            let k = tempo9_ggml::KernelSet::current();
            println!(
                "{}",
                serde_json::json!({
                    "short_name": k.short_name(),
                    "fingerprint": k.fingerprint(),
                    "arch": k.arch,
                    "features": k.features,
                })
            );
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
