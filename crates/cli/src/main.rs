//! `tempo9`: the command line of the Tempo9 inference engine.
//!
//! Generated text goes to stdout; logs, progress and timings go to stderr.

mod bench;
mod chat;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::{Args, Parser, Subcommand};
use tempo9_engine::{default_threads, EngineConfig};
use tempo9_ggml::Device;
use tempo9_models::{LoadOptions, Model};

/// Tempo9: a local LLM inference engine for many agents sharing one runtime.
#[derive(Parser)]
#[command(name = "tempo9", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate from a prompt (or chat interactively when no prompt is given).
    Run(chat::RunArgs),
    /// Measure prompt processing and generation speed (JSON on stdout).
    Bench(bench::BenchArgs),
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
    /// KV cache capacity in tokens, summed over concurrent sequences.
    #[arg(long, value_name = "TOKENS", default_value_t = 8192)]
    pub kv_tokens: usize,
}

impl ModelArgs {
    /// Engine settings from the flags.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            threads: self.threads.unwrap_or_else(default_threads),
            kv_cells: self.kv_tokens.max(1),
            // One conversation at a time: it gets the whole cache.
            max_seqs: 1,
            ..EngineConfig::default()
        }
    }
}

/// Loads a model on the CPU, with a progress bar when stderr is a terminal.
pub fn load_model(path: &Path) -> Result<Arc<Model>> {
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
            device: Device::cpu(),
            progress: Some(&mut progress),
            repack: true,
        },
    )
    .with_context(|| format!("loading {}", path.display()))?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    tracing::info!(
        ms = t0.elapsed().as_millis() as u64,
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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(a) => chat::run(a),
        Command::Bench(a) => bench::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
