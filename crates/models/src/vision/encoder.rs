//! The `encode(image) -> embeddings` boundary: a vision encoder owns its weights
//! and its own backend scheduler, so it can run on a thread and device of its
//! own; results are cached by [`PixelHash`], so an image re-sent while it is
//! still being prefilled (or in a later turn) is encoded once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tempo9_ggml::{Backend, Context, DType, Device, DeviceKind, Scheduler};

use super::gemma4v::{self, Gemma4VWeights};
use super::mmproj::{Projector, ProjectorType};
use super::preprocess::{PixelHash, Preprocessed};
use super::qwen3vl::{self, Qwen3VlWeights};
use crate::weights::{SpecList, Weights};
use crate::ModelError;

/// One image's embeddings for the language model.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageEmbeddings {
    /// The image's pixel hash.
    pub hash: PixelHash,
    /// Merged tokens per row of the image grid.
    pub n_x: usize,
    /// Rows of merged tokens.
    pub n_y: usize,
    /// Values per token: the merger's embedding, then each deepstack feature.
    pub n_embd: usize,
    /// `n_x * n_y` tokens of `n_embd` values, row-major over the grid.
    pub data: Vec<f32>,
}

impl ImageEmbeddings {
    /// Tokens the image takes in the prompt.
    pub fn n_tokens(&self) -> usize {
        self.n_x * self.n_y
    }
}

/// A tower's weight ids, per projector type.
enum TowerWeights {
    Qwen3Vl(Qwen3VlWeights),
    Gemma4V(Gemma4VWeights),
}

/// How many encoded images the cache keeps (oldest dropped first).
const CACHE_IMAGES: usize = 16;

/// A projector's vision encoder: weights on a device, a scheduler for its
/// graphs, and a cache of recent outputs.
pub struct VisionEncoder {
    projector: Projector,
    weights: Weights,
    ids: TowerWeights,
    sched: Mutex<Scheduler>,
    cache: Mutex<VecDeque<Arc<ImageEmbeddings>>>,
    /// Images computed (cache hits not counted).
    encodes: AtomicU64,
    /// Wall time of those encodes, in nanoseconds.
    encode_nanos: AtomicU64,
}

impl VisionEncoder {
    /// Loads `projector`'s weights onto `device` (CPU matmul weights stay in
    /// the file mapping, as llama.cpp's `clip` keeps them) with `threads` CPU
    /// threads for its graphs.
    pub fn new(projector: Projector, device: Device, threads: usize) -> Result<Self, ModelError> {
        Self::with_backend_params(projector, device, threads, "")
    }

    /// [`Self::new`] with a parameter string for the device's backend library
    /// (see [`tempo9_ggml::sm_share_params`]).
    pub fn with_backend_params(
        projector: Projector,
        device: Device,
        threads: usize,
        params: &str,
    ) -> Result<Self, ModelError> {
        let hp = projector.hparams().clone();
        let file = projector.file().clone();
        let n_pos_embd = file
            .tensor("v.position_embd.weight")
            .map(|t| t.shape.get(1).copied().unwrap_or(0) as usize)
            .ok_or_else(|| ModelError::MissingTensor("v.position_embd.weight".into()))?;
        let mut specs = SpecList::default();
        let ids = match hp.projector {
            ProjectorType::Qwen3Vl => {
                let side = (n_pos_embd as f64).sqrt() as usize;
                if side * side != n_pos_embd || n_pos_embd == 0 {
                    return Err(ModelError::BadHParams(format!(
                        "v.position_embd.weight has {n_pos_embd} positions, not a square grid"
                    )));
                }
                TowerWeights::Qwen3Vl(Qwen3VlWeights::declare(&hp, n_pos_embd, &mut specs))
            }
            ProjectorType::Gemma4V => {
                TowerWeights::Gemma4V(Gemma4VWeights::declare(&hp, &file, &mut specs)?)
            }
        };
        let weights = Weights::load(&file, specs.specs(), device, false, &mut |_, _| {})?;
        let mut backends = Vec::new();
        if device.kind() != DeviceKind::Cpu {
            backends.push(Backend::with_params(device, params)?);
        }
        let cpu = Backend::new(Device::cpu())?;
        cpu.set_threads(threads);
        backends.push(cpu);
        let sched = Scheduler::new(backends, 1 << 12)?;
        Ok(VisionEncoder {
            projector,
            weights,
            ids,
            sched: Mutex::new(sched),
            cache: Mutex::new(VecDeque::new()),
            encodes: AtomicU64::new(0),
            encode_nanos: AtomicU64::new(0),
        })
    }

    /// The projector this encoder runs.
    pub fn projector(&self) -> &Projector {
        &self.projector
    }

    /// Images this encoder has computed so far (answers from its cache are not
    /// counted): what an image re-sent in later turns should not grow.
    pub fn encodes(&self) -> u64 {
        self.encodes.load(Ordering::Relaxed)
    }

    /// Seconds spent computing those encodes (wall time of [`Self::encode`]
    /// calls that were not cache hits).
    pub fn encode_seconds(&self) -> f64 {
        self.encode_nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// The cached embeddings of the image with `hash`, if it was encoded lately.
    pub fn cached(&self, hash: PixelHash) -> Option<Arc<ImageEmbeddings>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.iter().find(|e| e.hash == hash).cloned()
    }

    /// Embeddings of a preprocessed image: from the cache when the same pixels
    /// were encoded lately, else computed (and cached).
    pub fn encode(&self, img: &Preprocessed) -> Result<Arc<ImageEmbeddings>, ModelError> {
        if let Some(e) = self.cached(img.hash) {
            return Ok(e);
        }
        let t0 = std::time::Instant::now();
        let out = Arc::new(self.compute(img)?);
        let nanos = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.encode_nanos.fetch_add(nanos, Ordering::Relaxed);
        self.encodes.fetch_add(1, Ordering::Relaxed);
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.push_back(out.clone());
        if cache.len() > CACHE_IMAGES {
            cache.pop_front();
        }
        Ok(out)
    }

    fn compute(&self, img: &Preprocessed) -> Result<ImageEmbeddings, ModelError> {
        let hp = self.projector.hparams();
        let p = hp.patch_size;
        let align = p * hp.n_merge;
        if img.width == 0
            || img.height == 0
            || !img.width.is_multiple_of(align)
            || !img.height.is_multiple_of(align)
        {
            return Err(ModelError::BadBatch(format!(
                "image of {}x{} is not on the {align}-pixel grid: preprocess it first",
                img.width, img.height
            )));
        }
        let (px, py) = (img.width / p, img.height / p);
        let n_out = px * py / (hp.n_merge * hp.n_merge);
        let nodes = 64 + 48 * hp.n_layer;
        let ctx = Context::new(nodes * 2, nodes)?;
        let image = ctx.new_input(
            "inp_raw",
            DType::F32,
            &[img.width as i64, img.height as i64, 3],
        );
        let n_patches = (px * py) as i64;
        // The tower's graph and its I32 inputs with their values.
        let (out, int_inputs) = match &self.ids {
            TowerWeights::Qwen3Vl(ids) => {
                let inp = qwen3vl::GraphInputs {
                    image,
                    positions: ctx.new_input("positions", DType::I32, &[4 * n_patches]),
                };
                let out = qwen3vl::build(&ctx, hp, ids, &self.weights, &inp, (px, py));
                (out, vec![(inp.positions, qwen3vl::positions(px, py))])
            }
            TowerWeights::Gemma4V(ids) => {
                let side = ids.max_patches_per_side();
                if px > side || py > side {
                    return Err(ModelError::BadBatch(format!(
                        "image of {px}x{py} patches: the position tables cover {side} per side"
                    )));
                }
                let inp = gemma4v::GraphInputs {
                    image,
                    pos_x: ctx.new_input("pos_x", DType::I32, &[n_patches]),
                    pos_y: ctx.new_input("pos_y", DType::I32, &[n_patches]),
                };
                let out = gemma4v::build(&ctx, hp, ids, &self.weights, &inp, (px, py));
                let (xs, ys) = gemma4v::positions(px, py);
                (out, vec![(inp.pos_x, xs), (inp.pos_y, ys)])
            }
        };
        out.set_output();
        let mut graph = ctx.new_graph(nodes);
        graph.expand(out);
        let mut sched = self.sched.lock().unwrap_or_else(|e| e.into_inner());
        sched.reserve(2 * graph.n_nodes() + 64)?;
        sched.alloc_with_inputs(&ctx, &graph)?;
        image.write(&img.planar)?;
        for (t, v) in &int_inputs {
            t.write(v)?;
        }
        sched.compute(&graph)?;
        let n_embd = out.ne()[0] as usize;
        if n_embd != hp.n_embd_out() || out.ne()[1] as usize != n_out {
            return Err(ModelError::BadHParams(format!(
                "encoder output {:?}, expected [{}, {n_out}]",
                out.ne(),
                hp.n_embd_out()
            )));
        }
        let mut data = vec![0f32; n_embd * n_out];
        out.read_f32(0, &mut data)?;
        Ok(ImageEmbeddings {
            hash: img.hash,
            n_x: px / hp.n_merge,
            n_y: py / hp.n_merge,
            n_embd,
            data,
        })
    }
}
