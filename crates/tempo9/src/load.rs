//! Loading a model: a GGUF path or an Ollama model name, and the engine
//! settings it runs with (the `tempo9 serve` defaults).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use tempo9_engine::{Engine, EngineConfig, SsdConfig};
use tempo9_ggml::DeviceChoice;
use tempo9_models::ModelError;
use tempo9_server::{ollama_store, AppState, ServerConfig};
use tempo9_tokenizer::Tokenizer;

use crate::error::{Error, ErrorKind, Result};

/// How a model is loaded and run. [`Default`] gives `tempo9 serve`'s defaults on
/// the CPU: all cores, the model's trained context, a quarter of memory for KV,
/// the prefix cache and the SSD tier under `~/.cache/tempo9/kv`.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// CPU threads for compute (`None`: all available cores).
    pub threads: Option<usize>,
    /// Per-request context limit in tokens, prompt plus output (`None`: the
    /// model's trained context).
    pub context: Option<usize>,
    /// KV cache memory for all requests together, in bytes (`None`: a quarter of
    /// system memory).
    pub kv_budget_bytes: Option<usize>,
    /// Tokens per KV page (16, 32, 64, 128 or 256); the prefix cache shares whole pages.
    pub page_tokens: usize,
    /// Most requests running at once (more wait in the queue).
    pub max_running: usize,
    /// Batch-invariant numbers (see `tempo9 serve --deterministic`).
    pub deterministic: bool,
    /// The SSD tier for evicted prefix-cache pages (`None`: off).
    pub ssd: Option<SsdConfig>,
    /// A Jinja chat template to use instead of the model's.
    pub chat_template: Option<String>,
    /// Speculative decoding: draft up to this many tokens per step (0 = off).
    pub speculation_k: usize,
    /// The compute device: the CPU, a GPU through ggml's CUDA backend (an error
    /// when none can be used), or by default a GPU when the backend library loads
    /// and finds one, else the CPU (as `tempo9 serve --device`).
    pub device: DeviceChoice,
    /// Where `libggml-cuda.so` is looked for (`None`: `TEMPO9_BACKEND_DIR`, else
    /// the application's executable directory). A process loads it once.
    pub backend_dir: Option<PathBuf>,
    /// Layers on the GPU, counted from the last one (`None`: all; as `tempo9 serve
    /// --gpu-layers`). Ignored on the CPU.
    pub gpu_layers: Option<usize>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let e = EngineConfig::default();
        LoadOptions {
            threads: None,
            context: None,
            kv_budget_bytes: None,
            page_tokens: e.page_tokens,
            max_running: e.max_running,
            deterministic: false,
            ssd: Some(SsdConfig::new(tempo9_engine::ssd::default_dir())),
            chat_template: None,
            speculation_k: 0,
            device: DeviceChoice::Auto,
            backend_dir: None,
            gpu_layers: None,
        }
    }
}

impl LoadOptions {
    /// Options from a JSON object (the C and Python bindings' shape): `threads`,
    /// `context`, `kv_budget_bytes`, `page_tokens`, `max_running`,
    /// `deterministic`, `chat_template`, `speculation_k`, `device` (`"cpu"`,
    /// `"cuda"` or `"auto"`), `backend_dir`, `gpu_layers`, and `ssd`: `false`
    /// (off), or `{"dir", "budget_bytes", "persist"}`. Absent keys keep the
    /// defaults; unknown keys are refused.
    ///
    /// ```
    /// use serde_json::json;
    /// let o = tempo9::LoadOptions::from_json(&json!({"threads": 4, "ssd": false}))?;
    /// assert_eq!(o.threads, Some(4));
    /// assert!(o.ssd.is_none());
    /// let typo = tempo9::LoadOptions::from_json(&json!({"thread": 4}));
    /// assert_eq!(typo.unwrap_err().kind, tempo9::ErrorKind::BadRequest);
    /// # Ok::<(), tempo9::Error>(())
    /// ```
    pub fn from_json(v: &Value) -> Result<LoadOptions> {
        let bad = |m: String| Error::new(ErrorKind::BadRequest, m);
        let obj = match v {
            Value::Null => return Ok(LoadOptions::default()),
            Value::Object(o) => o,
            _ => return Err(bad("load options must be a JSON object".into())),
        };
        let uint = |k: &str| -> Result<Option<usize>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(x) => x
                    .as_u64()
                    .map(|n| Some(n as usize))
                    .ok_or_else(|| bad(format!("'{k}' must be a non-negative integer"))),
            }
        };
        let boolean = |k: &str| -> Result<Option<bool>> {
            match obj.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(_) => Err(bad(format!("'{k}' must be a boolean"))),
            }
        };
        let mut o = LoadOptions::default();
        for k in obj.keys() {
            let known = [
                "threads",
                "context",
                "kv_budget_bytes",
                "page_tokens",
                "max_running",
                "deterministic",
                "ssd",
                "chat_template",
                "speculation_k",
                "device",
                "backend_dir",
                "gpu_layers",
            ];
            if !known.contains(&k.as_str()) {
                return Err(bad(format!(
                    "unknown load option '{k}' (known: {})",
                    known.join(", ")
                )));
            }
        }
        o.threads = uint("threads")?;
        o.context = uint("context")?;
        o.kv_budget_bytes = uint("kv_budget_bytes")?;
        if let Some(n) = uint("page_tokens")? {
            o.page_tokens = n;
        }
        if let Some(n) = uint("max_running")? {
            o.max_running = n;
        }
        o.deterministic = boolean("deterministic")?.unwrap_or(false);
        if let Some(n) = uint("speculation_k")? {
            o.speculation_k = n;
        }
        o.gpu_layers = uint("gpu_layers")?;
        match obj.get("device").map(|d| (d, d.as_str())) {
            None | Some((Value::Null, _)) => {}
            Some((_, Some("cpu"))) => o.device = DeviceChoice::Cpu,
            Some((_, Some("cuda"))) => o.device = DeviceChoice::Cuda,
            Some((_, Some("auto"))) => o.device = DeviceChoice::Auto,
            Some(_) => return Err(bad("'device' must be \"cpu\", \"cuda\" or \"auto\"".into())),
        }
        match obj.get("backend_dir") {
            None | Some(Value::Null) => {}
            Some(Value::String(d)) => o.backend_dir = Some(PathBuf::from(d)),
            Some(_) => return Err(bad("'backend_dir' must be a string".into())),
        }
        match obj.get("chat_template") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => o.chat_template = Some(s.clone()),
            Some(_) => return Err(bad("'chat_template' must be a string".into())),
        }
        match obj.get("ssd") {
            None | Some(Value::Null) | Some(Value::Bool(true)) => {}
            Some(Value::Bool(false)) => o.ssd = None,
            Some(Value::Object(s)) => {
                let dir = match s.get("dir") {
                    None | Some(Value::Null) => tempo9_engine::ssd::default_dir(),
                    Some(Value::String(d)) => PathBuf::from(d),
                    Some(_) => return Err(bad("'ssd.dir' must be a string".into())),
                };
                let mut cfg = SsdConfig::new(dir);
                match s.get("budget_bytes") {
                    None | Some(Value::Null) => {}
                    Some(b) => {
                        cfg.budget_bytes = b.as_u64().ok_or_else(|| {
                            bad("'ssd.budget_bytes' must be a non-negative integer".into())
                        })?
                    }
                }
                match s.get("persist") {
                    None | Some(Value::Null) => {}
                    Some(Value::Bool(b)) => cfg.persist = *b,
                    Some(_) => return Err(bad("'ssd.persist' must be a boolean".into())),
                }
                o.ssd = Some(cfg);
            }
            Some(_) => return Err(bad("'ssd' must be false or an object".into())),
        }
        Ok(o)
    }

    fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            threads: self
                .threads
                .filter(|&n| n > 0)
                .unwrap_or_else(tempo9_engine::default_threads),
            kv_budget_bytes: self.kv_budget_bytes,
            page_tokens: self.page_tokens,
            max_running: self.max_running.max(1),
            max_context: self.context,
            ssd: self.ssd.clone(),
            deterministic: self.deterministic,
            speculation: (self.speculation_k > 0).then(|| tempo9_engine::SpecConfig {
                k: self.speculation_k.min(tempo9_engine::spec::MAX_DRAFT),
                ..tempo9_engine::SpecConfig::default()
            }),
            ..EngineConfig::default()
        }
    }
}

/// A GGUF path: `source` itself when it names a file, else the Ollama store's
/// blob for that model name.
fn resolve(source: &str) -> Result<PathBuf> {
    let p = Path::new(source);
    if p.is_file() {
        return Ok(p.to_path_buf());
    }
    if p.exists() {
        return Err(Error::new(
            ErrorKind::BadFile,
            format!("{source}: not a model file"),
        ));
    }
    if source.ends_with(".gguf") {
        return Err(Error::new(
            ErrorKind::BadFile,
            format!("{source}: no such model file"),
        ));
    }
    ollama_store::resolve(&ollama_store::default_root(), source)
        .map(|m| m.gguf)
        .map_err(|e| {
            Error::new(
                ErrorKind::BadFile,
                format!("{source}: not a model file, and not an Ollama model: {e}"),
            )
        })
}

fn load_error(path: &Path, e: ModelError) -> Error {
    let kind = match e {
        ModelError::UnsupportedArch(_) => ErrorKind::UnsupportedArchitecture,
        ModelError::Ggml(_) => ErrorKind::Engine,
        _ => ErrorKind::BadFile,
    };
    Error::new(kind, format!("loading {}: {e}", path.display()))
}

/// Loads the model and starts its engine; the state the chat API runs on.
pub(crate) fn load(source: &str, opts: &LoadOptions) -> Result<Arc<AppState>> {
    let path = resolve(source)?;
    // ggml's own messages go to `tracing` (silent unless the application subscribes),
    // not to the application's stderr.
    tempo9_ggml::init_logging();
    let device = opts
        .device
        .select(opts.backend_dir.as_deref())
        .map_err(|e| Error::new(ErrorKind::Engine, format!("device cuda: {e}")))?;
    let mut load = tempo9_models::LoadOptions::new(device);
    load.offload = opts.gpu_layers.map_or(
        tempo9_models::weights::Offload::All,
        tempo9_models::weights::Offload::Layers,
    );
    let model = tempo9_models::Model::load(&path, load).map_err(|e| load_error(&path, e))?;
    let model = Arc::new(model);
    let tok = Tokenizer::from_gguf(model.gguf())
        .map_err(|e| Error::new(ErrorKind::BadFile, format!("building the tokenizer: {e}")))?;
    let engine = Engine::start(model, Arc::new(tok), opts.engine_config())
        .map_err(|e| Error::new(ErrorKind::Engine, format!("starting the engine: {e}")))?;
    let config = ServerConfig {
        chat_template: opts.chat_template.clone(),
        // The server's defaults otherwise, so a request gets the same prompt here.
        ..ServerConfig::default()
    };
    let state = AppState::new(engine.clone(), config).map_err(|e| {
        engine.shutdown();
        Error::new(ErrorKind::BadFile, format!("chat template: {e:#}"))
    })?;
    Ok(Arc::new(state.with_path(path)))
}
