//! Model architectures as ggml graphs, one file per architecture under `arch/`.
//!
//! A [`Model`] is loaded once from a GGUF file (weights placed on a device) and is
//! immutable afterwards. Each engine step calls [`Model::forward`] with a
//! [`StepBatch`]: a flat list of tokens from any number of sequences, with their
//! positions, the KV cells their keys/values go to and the attention masks saying
//! which cells each token sees, per cache group ([`CacheGroup`]: layers that keep
//! the same kind of cache in one pool of cells). It returns logits only for the
//! rows asked for.

mod arch;
mod attn;
mod batch;
pub mod cache;
mod deltanet;
pub mod hparams;
pub mod kv;
mod layers;
mod moe;
mod step;
pub mod vision;
pub mod weights;

use std::path::Path;
use std::sync::Arc;

use tempo9_ggml::{Device, DeviceKind, GgmlError};
use tempo9_gguf::{GgufError, GgufFile};

pub use attn::MATMUL_DECODE_ABOVE;
pub use batch::{CellRun, KvView, RowEmbeds, SeqSpan, StateSnapshot, StepBatch};
pub use cache::{CacheGroup, GroupKind};
pub use hparams::{Arch, AttnTemp, HParams, MoeParams, SsmParams};
pub use kv::{KvStore, MaskBuilder};
pub use step::Executor;
use weights::{Offload, SpecList, Weights};

/// Errors from loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The GGUF file is invalid.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A ggml call failed.
    #[error(transparent)]
    Ggml(#[from] GgmlError),
    /// The architecture is not implemented.
    #[error("unsupported model architecture '{0}' (supported: {list})", list = Arch::supported_list())]
    UnsupportedArch(String),
    /// A required metadata key is missing.
    #[error("missing metadata key {0}")]
    MissingKey(String),
    /// A required tensor is missing.
    #[error("missing tensor {0}")]
    MissingTensor(String),
    /// A tensor has the wrong shape or size.
    #[error("tensor {name} has shape {have:?}, expected {want:?}")]
    TensorShape {
        /// Tensor name.
        name: String,
        /// Expected dims.
        want: Vec<usize>,
        /// Dims in the file.
        have: Vec<u64>,
    },
    /// Inconsistent hyper-parameters.
    #[error("invalid hyper-parameters: {0}")]
    BadHParams(String),
    /// A feature of the file is not supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The step batch is malformed.
    #[error("invalid batch: {0}")]
    BadBatch(String),
}

/// The graph builder of each architecture.
enum Graphs {
    Llama(arch::llama::Llama),
    Gemma3(arch::gemma3::Gemma3),
    Gemma4(arch::gemma4::Gemma4),
    Qwen3(arch::qwen3::Qwen3),
    Qwen35(arch::qwen35::Qwen35),
    GptOss(arch::gpt_oss::GptOss),
}

/// Options for loading a model.
pub struct LoadOptions<'p> {
    /// Device the weights and graphs go to.
    pub device: Device,
    /// Called with (bytes done, bytes total) while weights load.
    pub progress: Option<&'p mut dyn FnMut(u64, u64)>,
    /// Copy CPU matmul weights into ggml's repacked layouts (faster; costs RAM).
    pub repack: bool,
    /// Which layers a GPU `device` gets (their weights and KV cells); the rest stay
    /// on the CPU. Ignored when `device` is the CPU.
    pub offload: Offload,
}

impl LoadOptions<'_> {
    /// Defaults for `device`: repacking on, no progress callback.
    pub fn new(device: Device) -> Self {
        LoadOptions {
            device,
            progress: None,
            repack: true,
            offload: Offload::All,
        }
    }
}

/// A loaded model: hyper-parameters, weights on a device, and its graph builder.
pub struct Model {
    hp: HParams,
    /// The MTP head's hyper-parameters, when the file has one it runs: the trunk's,
    /// as for a model of one full-attention layer (its KV store's layer 0).
    mtp_hp: Option<HParams>,
    weights: Weights,
    graphs: Graphs,
    device: Device,
    offload: Offload,
    file: Arc<GgufFile>,
}

impl Model {
    /// Opens and validates a GGUF file, then loads its weights.
    pub fn load(path: &Path, opts: LoadOptions<'_>) -> Result<Model, ModelError> {
        let file = Arc::new(GgufFile::open(path)?);
        Model::from_gguf(file, opts)
    }

    /// Loads weights of an already opened GGUF file.
    pub fn from_gguf(file: Arc<GgufFile>, mut opts: LoadOptions<'_>) -> Result<Model, ModelError> {
        let hp = HParams::from_gguf(&file)?;
        let mut specs = SpecList::default();
        let graphs = match hp.arch {
            Arch::Llama => {
                Graphs::Llama(arch::llama::Llama::declare(&hp, &file, &mut specs, false))
            }
            Arch::Qwen2 => Graphs::Llama(arch::qwen2::declare(&hp, &file, &mut specs)),
            Arch::Gemma3 => Graphs::Gemma3(arch::gemma3::Gemma3::declare(&hp, &file, &mut specs)),
            Arch::Qwen3 => Graphs::Qwen3(arch::qwen3::Qwen3::declare(&hp, &file, &mut specs)),
            Arch::Qwen3Moe => Graphs::Qwen3(arch::qwen3moe::declare(&hp, &file, &mut specs)),
            Arch::Qwen3Vl => Graphs::Qwen3(arch::qwen3vl::declare(&hp, &file, &mut specs)),
            Arch::Qwen3VlMoe => Graphs::Qwen3(arch::qwen3vlmoe::declare(&hp, &file, &mut specs)),
            Arch::Qwen35 => Graphs::Qwen35(arch::qwen35::Qwen35::declare(&hp, &file, &mut specs)),
            Arch::Qwen35Moe => Graphs::Qwen35(arch::qwen35moe::declare(&hp, &file, &mut specs)),
            Arch::Mistral3 => Graphs::Llama(arch::mistral3::declare(&hp, &file, &mut specs)),
            Arch::GptOss => Graphs::GptOss(arch::gpt_oss::GptOss::declare(&hp, &file, &mut specs)),
            Arch::Gemma4 => Graphs::Gemma4(arch::gemma4::Gemma4::declare(&hp, &file, &mut specs)),
        };
        let mut no_progress = |_: u64, _: u64| {};
        let progress: &mut dyn FnMut(u64, u64) = match opts.progress.as_mut() {
            Some(p) => *p,
            None => &mut no_progress,
        };
        let weights = Weights::load_with(
            &file,
            specs.specs(),
            opts.device,
            opts.offload,
            opts.repack,
            progress,
        )?;
        tracing::info!(arch = hp.arch.name(), layers = hp.n_layer, placement = ?weights.placement, "model loaded");
        let mtp_hp = (hp.n_nextn > 0 && matches!(graphs, Graphs::Qwen35(_))).then(|| HParams {
            n_layer: 1,
            is_swa: vec![false],
            is_recurrent: vec![false],
            ..hp.clone()
        });
        Ok(Model {
            hp,
            mtp_hp,
            weights,
            graphs,
            device: opts.device,
            offload: opts.offload,
            file,
        })
    }

    /// Hyper-parameters.
    pub fn hparams(&self) -> &HParams {
        &self.hp
    }

    /// The hyper-parameters a graph's layers are built with: the trunk's, or the MTP
    /// head's (one layer).
    pub(crate) fn layer_hparams(&self, mtp: bool) -> &HParams {
        match (mtp, &self.mtp_hp) {
            (true, Some(h)) => h,
            _ => &self.hp,
        }
    }

    /// Whether the model has a multi-token-prediction head that
    /// [`Model::mtp_forward`] runs (Qwen3.5's `nextn` block).
    pub fn has_mtp(&self) -> bool {
        self.mtp_hp.is_some()
    }

    /// A KV store for the MTP head's attention: `cells` cells of its one layer.
    pub fn new_mtp_kv(&self, cells: usize) -> Result<Arc<KvStore>, ModelError> {
        let hp = self
            .mtp_hp
            .as_ref()
            .ok_or_else(|| ModelError::BadBatch("the model has no MTP head".into()))?;
        let groups = [CacheGroup {
            kind: GroupKind::Full,
            layers: vec![0],
        }];
        KvStore::new(hp, self.device, &groups, &[cells]).map(Arc::new)
    }

    /// Bytes of one token's K and V in the MTP head (F16 rows, its one layer).
    pub fn mtp_token_bytes(&self) -> usize {
        self.mtp_hp
            .as_ref()
            .map_or(0, |h| (h.n_embd_k() + h.n_embd_v()) * 2)
    }

    /// The device the model runs on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// (free, total) bytes of the model's device memory; `None` on the CPU.
    pub fn device_memory(&self) -> Option<(usize, usize)> {
        (self.device.kind() != DeviceKind::Cpu).then(|| self.device.memory())
    }

    /// Which layers the device holds (all of them unless partially offloaded).
    pub fn offload(&self) -> Offload {
        self.offload
    }

    /// The GGUF file the model came from.
    pub fn gguf(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Bytes of weights per placement (`mmap` = read in place from the file).
    pub fn weight_placement(&self) -> &[(String, usize)] {
        &self.weights.placement
    }

    /// A KV store for this model: per cache group (see [`Model::cache_groups`]),
    /// `cells[g]` cells for each of its layers, each layer's cells on the device that
    /// holds the layer's weights; shared with the step graphs that read it.
    pub fn new_kv(
        &self,
        groups: &[CacheGroup],
        cells: &[usize],
    ) -> Result<Arc<KvStore>, ModelError> {
        KvStore::with_offload(&self.hp, self.device, groups, cells, self.offload).map(Arc::new)
    }

    /// How this model's layers group by the cache they keep. Group 0 is `Full` with
    /// every full-attention layer; a model with sliding-window layers gets group 1,
    /// `Sliding`, with those, unless `swa_full` (or the model has no sliding
    /// layers): then group 0 holds every layer, and each sequence gives its sliding
    /// layers a `mask_swa` over the full window (one pool for every layer). A
    /// model whose every layer slides also gets that single group (group 0 must be
    /// `Full`: the engine's prefix index hangs on it).
    pub fn cache_groups(&self, swa_full: bool) -> Vec<CacheGroup> {
        cache::cache_groups(&self.hp, swa_full)
    }

    /// Runs one step: writes the batch's K/V into `kv` and returns logits,
    /// `output_rows.len() * n_vocab` floats in output-row order. A step of the same
    /// shape as the executor's previous one (steady decoding) reuses its graph.
    pub fn forward(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
    ) -> Result<Vec<f32>, ModelError> {
        match self.forward_step(exec, kv, batch, false)? {
            StepOutput::Logits(l) => Ok(l),
            StepOutput::Tokens(_) => unreachable!("a logits graph returns logits"),
        }
    }

    /// Whether greedy steps ([`Model::forward_step`] with `greedy`) save time: the
    /// output layer runs on a GPU.
    /// (On the CPU the logits are already in host memory, and ggml's CPU argmax
    /// runs on one thread.)
    pub fn greedy_on_device(&self) -> bool {
        self.device.kind() != DeviceKind::Cpu && self.offload.is_full(self.hp.n_layer)
    }

    /// Like [`Model::forward`]; with `greedy`, returns each output row's
    /// highest-scoring token instead, picked on the device: a GPU then sends back
    /// one id per row instead of a vocabulary of logits (33 MB per step for 64 rows
    /// of a 128K vocabulary). Exact ties go to whichever id the device's kernel
    /// keeps, and a row whose logits are all NaN or -inf gives token 0. Worth it
    /// only where [`Model::greedy_on_device`] says so.
    pub fn forward_step(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
        greedy: bool,
    ) -> Result<StepOutput, ModelError> {
        batch::check(&self.hp, batch, kv)?;
        self.step(exec, kv, batch, greedy, None).map(|(out, _)| out)
    }

    /// Like [`Model::forward_step`], also returning the final hidden states (after
    /// the output norm) of [`StepBatch::hidden_rows`], `n_embd` floats each in that
    /// order: what the model's MTP head drafts from.
    pub fn forward_hidden(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
        greedy: bool,
    ) -> Result<(StepOutput, Vec<f32>), ModelError> {
        batch::check(&self.hp, batch, kv)?;
        self.step(exec, kv, batch, greedy, None)
    }

    /// Runs the MTP head (see [`Model::has_mtp`]) over `batch` in its own KV store
    /// ([`Model::new_mtp_kv`]): row `i` combines token `batch.tokens[i]` with the
    /// hidden state `h_in[i * n_embd..]` of the position before it (the trunk's, or
    /// the head's own for a further draft). Returns the output rows' logits (or
    /// greedy tokens) and the head's hidden states of [`StepBatch::hidden_rows`],
    /// the input of its next draft.
    pub fn mtp_forward(
        self: &Arc<Self>,
        exec: &mut Executor,
        kv: &Arc<KvStore>,
        batch: &StepBatch,
        h_in: &[f32],
        greedy: bool,
    ) -> Result<(StepOutput, Vec<f32>), ModelError> {
        let hp = self
            .mtp_hp
            .as_ref()
            .ok_or_else(|| ModelError::BadBatch("the model has no MTP head".into()))?;
        batch::check(hp, batch, kv)?;
        if h_in.len() != batch.tokens.len() * hp.n_embd {
            return Err(ModelError::BadBatch(format!(
                "{} hidden-state floats for {} rows of {}",
                h_in.len(),
                batch.tokens.len(),
                hp.n_embd
            )));
        }
        self.step(exec, kv, batch, greedy, Some(h_in))
    }
}

/// What a step returns for its output rows, in output-row order.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutput {
    /// `output_rows.len() * n_vocab` logits.
    Logits(Vec<f32>),
    /// Each row's highest-scoring token, picked on the device (a greedy step).
    Tokens(Vec<u32>),
}
