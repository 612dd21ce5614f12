//! `tempo9 [serve]`: the HTTP server (OpenAI, Anthropic and Ollama APIs).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use clap::Args;
use tempo9_engine::Engine;
use tempo9_server::{ollama_store, AppState, ServerConfig};
use tempo9_tokenizer::Tokenizer;

use crate::ModelArgs;

/// Arguments of `tempo9 serve` (also the default command).
#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Serve a model downloaded by Ollama, by its name (`qwen2.5-coder:0.5b`,
    /// `user/name:tag`); found under `$OLLAMA_MODELS` or `~/.ollama/models`.
    /// Replaces `--gguf`, and becomes the model's name in the APIs.
    #[arg(long = "model", value_name = "NAME[:TAG]")]
    pub ollama_model: Option<String>,
    /// Address to listen on (loopback by default; `0.0.0.0` for every interface).
    /// Requests are answered only when their `Host` header is an IP address,
    /// `localhost`, this value, or a name given with `--allowed-host` (403
    /// otherwise: DNS-rebinding protection).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1")]
    pub host: String,
    /// Also answer requests whose `Host` header names NAME (repeatable), e.g.
    /// the machine's DNS name when serving on `0.0.0.0`; `*` accepts any name
    /// (only behind a proxy that checks it).
    #[arg(long, value_name = "NAME")]
    pub allowed_host: Vec<String>,
    /// Let web pages of this origin (`http://host:port`) call the API from a
    /// browser (CORS; repeatable; `*` for any). Off by default: requests
    /// carrying a foreign `Origin` are refused (403) and preflights fail.
    #[arg(long, value_name = "ORIGIN")]
    pub cors_origin: Vec<String>,
    /// Port to listen on (Ollama uses 11434; Tempo9 sits next to it).
    #[arg(long, value_name = "PORT", default_value_t = 11435)]
    pub port: u16,
    /// Require this key from clients (`Authorization: Bearer KEY` or `x-api-key: KEY`,
    /// compared in constant time); `/health` and the status page `/` stay open
    /// (`/v1/status` needs the key). Prefer the `TEMPO9_API_KEY` environment
    /// variable: a flag's value is visible to every user in `ps`.
    #[arg(
        long,
        value_name = "KEY",
        env = "TEMPO9_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// Render chats with this Jinja chat template instead of the model's (as
    /// llama-server's flag); tool-call and reasoning syntax follow it too.
    #[arg(long, value_name = "PATH")]
    pub chat_template_file: Option<PathBuf>,
    /// Name of the model in the APIs (default: `--model`'s name or the GGUF file stem).
    #[arg(long, value_name = "NAME")]
    pub served_name: Option<String>,
    /// Another name clients may use for the model (repeatable).
    #[arg(long, value_name = "NAME")]
    pub alias: Vec<String>,
    /// Answer requests whatever model they name, even the name of another local
    /// model (an Ollama store entry or a GGUF file beside `--gguf`), which is a
    /// 404 by default.
    #[arg(long, conflicts_with = "strict_model_names")]
    pub any_model: bool,
    /// Answer only requests naming the served model or an `--alias` (404 for
    /// others). By default a request naming an unknown model (an agent's own
    /// `claude-…`, `gpt-…`) is answered by the served model, logged once per name.
    #[arg(long)]
    pub strict_model_names: bool,
    /// Largest request body, e.g. `32M` (413 above).
    #[arg(long, value_name = "SIZE", default_value = "32M", value_parser = parse_bytes)]
    pub max_body: usize,
    /// Cap on tokens generated per request, whatever it asks for (default: the
    /// context limit; a request that names no limit gets at most 16384).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Most generation requests in flight in the server, from reading their
    /// body to their last token (429, Anthropic 529, with `Retry-After`, above).
    #[arg(long, value_name = "N", default_value_t = tempo9_server::DEFAULT_MAX_CONCURRENT)]
    pub max_concurrent: usize,
    /// Most tokens of the generation requests in flight together, each counted as its
    /// prompt plus its output budget (429, Anthropic 529, with `Retry-After`, above).
    /// Bounds the KV memory that admitted requests can claim; a request's output
    /// budget shrinks to fit the limit, and a prompt longer than it gets a 400.
    /// Default: no limit
    #[arg(long, value_name = "N")]
    pub max_total_tokens: Option<usize>,
    /// Most requests waiting in the engine's queue (429, Anthropic 529, above).
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub max_waiting: usize,
    /// Most open client connections; more wait to be accepted.
    #[arg(long, value_name = "N", default_value_t = 512)]
    pub max_connections: usize,
    /// Seconds a client has to send a request's head; also how long an idle
    /// keep-alive connection stays open.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub header_timeout: u64,
    /// Seconds a client has to send a request's body (408 after).
    #[arg(long, value_name = "SECS", default_value_t = 60)]
    pub body_timeout: u64,
    /// Drop system-prompt lines starting with this text before templating, so
    /// per-request values there do not defeat prefix caching (repeatable; the
    /// default covers Claude Code's billing header).
    #[arg(
        long,
        value_name = "TEXT",
        default_value = "x-anthropic-billing-header:"
    )]
    pub strip_system_line: Vec<String>,
    /// Show the first 200 characters of each request's prompt on the status page
    /// (`GET /` and `/v1/status`). Off by default: prompts may be private, and the
    /// page is readable by anyone who can reach the server (and has the API key,
    /// when one is set).
    #[arg(long)]
    pub status_prompts: bool,
    /// Vision projector of a vision-language model (`mmproj-*.gguf`, as llama.cpp's
    /// converter writes it beside the model): requests may then carry images
    /// (OpenAI `image_url` data URLs, Anthropic `image` blocks, Ollama `images`).
    /// Checked against the model at start. Without it, images get a 400.
    #[arg(long, value_name = "PATH")]
    pub mmproj: Option<PathBuf>,
    /// Where the vision encoder runs: cpu, cuda, or same (the language model's
    /// device). Default: a compute unit other than the language model's when there
    /// is one (the CPU beside a GPU model), so encoding an image does not hold up
    /// other requests' decode steps. Encodes run on a thread of their own either way.
    #[arg(long, value_enum, value_name = "DEVICE", requires = "mmproj")]
    pub vision_device: Option<crate::device::VisionDevice>,
    /// Encode images inside the engine's step, as llama.cpp does, instead of on
    /// the encoder's own thread: every running request's decode then waits for
    /// each encode. For measuring what the default saves.
    #[arg(long, requires = "mmproj")]
    pub vision_inline: bool,
    /// Percent of the GPU's SMs the vision encoder may use when it runs on the
    /// language model's GPU (a CUDA green context, with the library from
    /// scripts/gpu/build-cuda.sh), so that decode steps keep the other SMs while an
    /// image encodes; 100 lets it use every SM. Ignored on other devices.
    #[arg(long, value_name = "PERCENT", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=100), requires = "mmproj")]
    pub vision_sm_share: u32,
}

fn parse_bytes(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("not a size: {s}"))?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        u => return Err(format!("unknown size unit '{u}' in {s}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size too large: {s}"))
}

/// Serving is the default command: arguments that start with an option other
/// than `--help` / `--version` get `serve` inserted in front, so
/// `tempo9 --gguf PATH` means `tempo9 serve --gguf PATH`. Then `--model` is
/// expanded (see [`expand_model_arg`]).
pub fn serve_by_default(mut args: Vec<OsString>) -> Result<Vec<OsString>> {
    let first = args.get(1).map(|a| a.to_string_lossy().into_owned());
    if let Some(f) = first {
        let meta = ["-h", "--help", "-V", "--version"];
        if f.starts_with('-') && !meta.contains(&f.as_str()) {
            args.insert(1, "serve".into());
        }
    }
    if args.get(1).is_some_and(|a| a == "serve") {
        return expand_model_arg(args);
    }
    Ok(args)
}

/// `--model NAME[:TAG]` names an Ollama model, but `--gguf` (shared with `run`
/// and `bench`) is a required path: the name is resolved before clap parses, and
/// `--gguf BLOB` is added when absent. Other arguments pass unchanged.
pub fn expand_model_arg(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let mut name = None;
    let mut has_gguf = false;
    let mut it = args.iter().map(|a| a.to_string_lossy());
    while let Some(s) = it.next() {
        if s == "--model" {
            name = it.next().map(|n| n.into_owned());
        } else if let Some(n) = s.strip_prefix("--model=") {
            name = Some(n.to_string());
        } else if s == "--gguf" || s.starts_with("--gguf=") {
            has_gguf = true;
        }
    }
    let mut out = args;
    if let (Some(n), false) = (name, has_gguf) {
        let m = ollama_store::resolve(&ollama_store::default_root(), &n)?;
        out.push("--gguf".into());
        out.push(m.gguf.into_os_string());
    }
    Ok(out)
}

/// Loads the model, starts the engine and serves until Ctrl-C / SIGTERM.
pub fn run(a: ServeArgs) -> Result<()> {
    let gguf = a.model.gguf.clone();
    let resolved = a
        .ollama_model
        .as_ref()
        .map(|n| ollama_store::resolve(&ollama_store::default_root(), n))
        .transpose()?;
    let digest = resolved.as_ref().map(|m| m.digest.clone());
    let name = a
        .served_name
        .clone()
        .or(resolved.map(|m| m.name))
        .unwrap_or_else(|| {
            gguf.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "tempo9".into())
        });
    let chat_template = a
        .chat_template_file
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .transpose()?;
    let model = crate::load_model(&gguf, &a.model.device)?;
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).context("building the tokenizer")?);
    let mut engine_cfg = a.model.engine_config(&model)?;
    engine_cfg.max_waiting = a.max_waiting.max(1);
    if let Some(path) = &a.mmproj {
        engine_cfg.vision = Some(load_vision(path, &a, &model)?);
        engine_cfg.vision_inline = a.vision_inline;
    }
    let handle = Engine::start(model, tok, engine_cfg).context("starting the engine")?;
    let config = ServerConfig {
        host: a.host,
        port: a.port,
        api_key: a.api_key.filter(|k| !k.is_empty()),
        model_name: name,
        aliases: a.alias,
        any_model: a.any_model,
        strict_model_names: a.strict_model_names,
        local_models: tempo9_server::model_names::LocalModels {
            ollama_root: Some(ollama_store::default_root()),
            gguf_dir: gguf.parent().map(PathBuf::from),
        },
        max_body_bytes: a.max_body,
        max_tokens: a.max_tokens,
        max_concurrent: a.max_concurrent.max(1),
        max_total_tokens: a.max_total_tokens.filter(|&n| n > 0),
        volatile_prefixes: a
            .strip_system_line
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect(),
        digest,
        chat_template,
        status_prompts: a.status_prompts,
        access: tempo9_server::access::AccessConfig {
            allowed_hosts: a.allowed_host,
            cors_origins: a.cors_origin,
        },
        body_timeout: std::time::Duration::from_secs(a.body_timeout.max(1)),
        header_timeout: std::time::Duration::from_secs(a.header_timeout.max(1)),
        max_connections: a.max_connections.max(1),
    };
    let state = Arc::new(AppState::new(handle, config)?.with_path(PathBuf::from(&gguf)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        // Handlers only parse, template and shuttle events; the engine thread computes.
        .worker_threads(2)
        .enable_all()
        .build()?;
    let served = rt.block_on(tempo9_server::serve(state.clone()));
    // Flushes the KV SSD tier (and saves it with --kv-persist) before exiting.
    state.engine.shutdown();
    served
}

/// Loads the vision projector at `path` for `model` (refused, naming what
/// differs, when it does not fit) on the `--vision-device`.
fn load_vision(
    path: &std::path::Path,
    a: &ServeArgs,
    model: &tempo9_models::Model,
) -> Result<tempo9_engine::VisionModel> {
    use tempo9_models::vision::{Projector, VisionEncoder};
    let p = Projector::open(path).with_context(|| format!("--mmproj {}", path.display()))?;
    let hp = model.hparams();
    p.check_language_model(hp.arch.name(), hp.n_embd, hp.n_deepstack)
        .with_context(|| format!("--mmproj {}", path.display()))?;
    let device = a
        .model
        .device
        .vision_device(a.vision_device, model.device())?;
    let threads = a
        .model
        .threads
        .unwrap_or_else(tempo9_engine::default_threads);
    tracing::info!(
        projector = p.hparams().projector.name(),
        device = %device.name(),
        sm_share = a.vision_sm_share,
        "vision encoder"
    );
    // A share of the SMs only where the encoder shares the model's GPU.
    let params = if device.name() == model.device().name()
        && device.kind() != tempo9_ggml::DeviceKind::Cpu
        && a.vision_sm_share < 100
    {
        tempo9_ggml::sm_share_params(a.vision_sm_share)
    } else {
        String::new()
    };
    let enc = VisionEncoder::with_backend_params(p, device, threads, &params)
        .with_context(|| format!("loading the vision encoder of {}", path.display()))?;
    Ok(tempo9_engine::VisionModel(Arc::new(enc)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_bytes("32M"), Ok(32 << 20));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("x").is_err());
    }

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn serving_is_the_default() {
        let out = serve_by_default(os(&["tempo9", "--gguf", "m.gguf", "--port", "1"])).unwrap();
        assert_eq!(
            out,
            os(&["tempo9", "serve", "--gguf", "m.gguf", "--port", "1"])
        );
        for keep in [
            &["tempo9", "--help"][..],
            &["tempo9", "run", "--gguf", "m"],
            &["tempo9"],
        ] {
            assert_eq!(serve_by_default(os(keep)).unwrap(), os(keep));
        }
    }

    #[test]
    fn model_arg_passes_through_with_gguf() {
        let args: Vec<OsString> = ["tempo9", "--gguf", "a.gguf", "--model", "x:1"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(expand_model_arg(args.clone()).unwrap(), args);
        let args: Vec<OsString> = ["tempo9", "run", "--gguf", "a.gguf"]
            .iter()
            .map(OsString::from)
            .collect();
        assert_eq!(expand_model_arg(args.clone()).unwrap(), args);
    }
}
