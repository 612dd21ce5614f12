//! Loading weights from a GGUF mapping onto a device.
//!
//! On the CPU, weights stay in the file mapping (no copy) except matmul weights
//! that the CPU's repacked buffer types accept: those are copied once into the
//! faster layout. On a GPU, weights are uploaded to device memory (never repacked),
//! the token embedding too when the device can look up rows of its type: llama.cpp
//! keeps it in host memory to save device memory, but then every step starts with a
//! CPU graph split and a copy of the looked-up rows. With
//! partial offload ([`Offload::Layers`]) the remaining layers follow the CPU rules.

use std::sync::Arc;

use tempo9_ggml::{Buffer, BufferType, DType, Device, DeviceKind, HostBytes, Tensor, TensorStore};
use tempo9_gguf::GgufFile;

use crate::ModelError;

/// How the graph uses a weight; decides where it may be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightUse {
    /// Left operand of a matrix multiplication.
    MatMul,
    /// Stacked expert matrices `[n_in, n_out, n_expert]`, multiplied per row by
    /// `mul_mat_id`.
    Experts,
    /// Looked up by row (token embedding).
    Rows,
    /// Element-wise operand (norm scales, biases).
    Elementwise,
}

/// One weight a model needs.
#[derive(Debug, Clone)]
pub struct WeightSpec {
    /// Name in our store (unique).
    pub name: String,
    /// Name of the GGUF tensor holding the data (differs for tied weights).
    pub source: String,
    /// Expected dimensions, innermost first.
    pub shape: Vec<usize>,
    /// How the graph uses it.
    pub usage: WeightUse,
}

impl WeightSpec {
    /// A weight stored under its own name.
    pub fn new(name: impl Into<String>, shape: &[usize], usage: WeightUse) -> WeightSpec {
        let name = name.into();
        WeightSpec {
            source: name.clone(),
            name,
            shape: shape.to_vec(),
            usage,
        }
    }
}

/// Index of a weight in [`Weights`].
pub type WeightId = usize;

/// Collects specs and hands out their ids, so an architecture can declare its
/// tensors once and keep the ids for graph building.
#[derive(Default)]
pub struct SpecList {
    specs: Vec<WeightSpec>,
}

impl SpecList {
    /// Adds a weight, returning its id.
    pub fn add(&mut self, name: impl Into<String>, shape: &[usize], usage: WeightUse) -> WeightId {
        self.specs.push(WeightSpec::new(name, shape, usage));
        self.specs.len() - 1
    }

    /// Adds a weight whose data comes from another GGUF tensor (tied weights).
    pub fn add_from(
        &mut self,
        name: &str,
        source: &str,
        shape: &[usize],
        usage: WeightUse,
    ) -> WeightId {
        self.specs.push(WeightSpec {
            name: name.into(),
            source: source.into(),
            shape: shape.to_vec(),
            usage,
        });
        self.specs.len() - 1
    }

    /// The specs, in id order.
    pub fn specs(&self) -> &[WeightSpec] {
        &self.specs
    }

    /// Declares the token embedding, final norm and output projection most
    /// architectures share; the output reuses the embedding when the file ties them.
    pub fn add_embeddings(&mut self, file: &GgufFile, n_embd: usize, n_vocab: usize) -> Embeddings {
        let (e, v) = (n_embd, n_vocab);
        Embeddings {
            tok_embd: self.add("token_embd.weight", &[e, v], WeightUse::Rows),
            output_norm: self.add("output_norm.weight", &[e], WeightUse::Elementwise),
            output: match file.tensor("output.weight") {
                Some(_) => self.add("output.weight", &[e, v], WeightUse::MatMul),
                None => self.add_from(
                    "output.weight",
                    "token_embd.weight",
                    &[e, v],
                    WeightUse::MatMul,
                ),
            },
        }
    }
}

/// Ids of the input embedding, final norm and output projection.
#[derive(Debug, Clone, Copy)]
pub struct Embeddings {
    /// Token embedding matrix (looked up by row).
    pub tok_embd: WeightId,
    /// Final RMS-norm scale.
    pub output_norm: WeightId,
    /// Output projection to logits.
    pub output: WeightId,
}

/// Which weights a non-CPU device gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Offload {
    /// The whole model.
    #[default]
    All,
    /// The last `n` transformer blocks (`blk.<i>.*`), like llama.cpp's
    /// `--n-gpu-layers`; the output norm and projection too once `n` covers every
    /// block. The rest stays on the CPU.
    Layers(usize),
}

impl Offload {
    /// Whether transformer block `il` of `n_layer` goes to the device (its weights,
    /// and its KV cells, see [`crate::KvStore::with_offload`]).
    pub fn layer_on_device(self, il: usize, n_layer: usize) -> bool {
        match self {
            Offload::All => true,
            Offload::Layers(n) => il + n.min(n_layer) >= n_layer,
        }
    }

    /// Whether the device gets every block (and so the output norm and projection).
    pub fn is_full(self, n_layer: usize) -> bool {
        match self {
            Offload::All => true,
            Offload::Layers(n) => n >= n_layer,
        }
    }

    /// Per spec: whether it goes to the device.
    fn on_device(self, specs: &[WeightSpec]) -> Vec<bool> {
        let layer = |name: &str| -> Option<usize> {
            name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
        };
        let n_layer = specs
            .iter()
            .filter_map(|s| layer(&s.name))
            .max()
            .map_or(0, |l| l + 1);
        specs
            .iter()
            .map(|s| match layer(&s.name) {
                Some(il) => self.layer_on_device(il, n_layer),
                None => self.is_full(n_layer),
            })
            .collect()
    }
}

/// The model file's mapping, shared with ggml buffers that point into it.
struct Mapping(Arc<GgufFile>);

impl HostBytes for Mapping {
    fn host_bytes(&self) -> &[u8] {
        self.0.bytes()
    }
}

/// Loaded weights.
pub struct Weights {
    store: TensorStore,
    /// Bytes per buffer type, for logs and memory accounting.
    pub placement: Vec<(String, usize)>,
    /// Per weight: whether it lives in one of the CPU's repacked layouts.
    repacked: Vec<bool>,
}

impl Weights {
    /// The weight with id `id`.
    pub fn get(&self, id: WeightId) -> Tensor<'_> {
        self.store.get(id)
    }

    /// Whether weight `id` is stored in a repacked CPU layout.
    pub fn is_repacked(&self, id: WeightId) -> bool {
        self.repacked[id]
    }

    /// Loads `specs` from `file` for use on `device`, calling `progress(done, total)` in bytes.
    /// `repack` lets CPU matmul weights move into faster repacked layouts (a copy).
    /// On a GPU every weight but the token embedding goes to the device.
    pub fn load(
        file: &Arc<GgufFile>,
        specs: &[WeightSpec],
        device: Device,
        repack: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Weights, ModelError> {
        Weights::load_with(file, specs, device, Offload::All, repack, progress)
    }

    /// Like [`Weights::load`], choosing with `offload` which layers a non-CPU
    /// `device` gets (ignored on the CPU).
    pub fn load_with(
        file: &Arc<GgufFile>,
        specs: &[WeightSpec],
        device: Device,
        offload: Offload,
        repack: bool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Weights, ModelError> {
        let mut store = TensorStore::new(specs.len() + 1)?;
        let mut sources = Vec::with_capacity(specs.len());
        for s in specs {
            let info = file
                .tensor(&s.source)
                .ok_or_else(|| ModelError::MissingTensor(s.source.clone()))?;
            let mut want: Vec<u64> = s.shape.iter().map(|&d| d as u64).collect();
            let mut have = info.shape.clone();
            let rank = want.len().max(have.len());
            want.resize(rank, 1);
            have.resize(rank, 1);
            if want != have {
                return Err(ModelError::TensorShape {
                    name: s.source.clone(),
                    want: s.shape.clone(),
                    have: info.shape.clone(),
                });
            }
            let dtype = DType::from_raw(info.dtype.id()).ok_or_else(|| {
                ModelError::Unsupported(format!("tensor {} type {}", s.source, info.dtype.name()))
            })?;
            let shape: Vec<i64> = s.shape.iter().map(|&d| d as i64).collect();
            let id = store.add(&s.name, dtype, &shape);
            debug_assert_eq!(id, sources.len());
            if store.get(id).nbytes() as u64 != info.n_bytes {
                return Err(ModelError::TensorShape {
                    name: s.source.clone(),
                    want: s.shape.clone(),
                    have: info.shape.clone(),
                });
            }
            sources.push(info.clone());
        }

        // Choose a buffer type per weight; None = read in place from the file mapping.
        let cpu = Device::cpu();
        let on_device: Vec<bool> = match device.kind() {
            DeviceKind::Cpu => vec![false; specs.len()],
            _ => offload.on_device(specs),
        };
        let extra = match repack && on_device.iter().any(|d| !d) {
            // AMX tiles fault in some VMs and change numerics vs. the reference; the
            // CPU_REPACK layouts give llama.cpp's default speed and results.
            true => cpu
                .extra_buffer_types()
                .into_iter()
                .filter(|b| !b.name().contains("AMX"))
                .collect(),
            false => Vec::new(),
        };
        let mut choice: Vec<Option<BufferType>> = Vec::with_capacity(specs.len());
        for (id, s) in specs.iter().enumerate() {
            let t = store.get(id);
            let c = match (on_device[id], s.usage) {
                (false, WeightUse::MatMul) => extra
                    .iter()
                    .copied()
                    .find(|&b| cpu.supports_mul_mat_in(b, t)),
                // As llama.cpp checks expert weights (the count used does not matter).
                (false, WeightUse::Experts) => extra
                    .iter()
                    .copied()
                    .find(|&b| cpu.supports_mul_mat_id_in(b, t, 2)),
                (true, WeightUse::Rows) if device.supports_get_rows(t) => {
                    Some(device.buffer_type())
                }
                (false, _) | (true, WeightUse::Rows) => None,
                (true, _) => Some(device.buffer_type()),
            };
            choice.push(c);
        }

        let total: u64 = sources.iter().map(|i| i.n_bytes).sum();
        let mut done = 0u64;
        let mut placement: Vec<(String, usize)> = Vec::new();
        let mut account =
            |name: String, n: usize| match placement.iter_mut().find(|(k, _)| *k == name) {
                Some((_, v)) => *v += n,
                None => placement.push((name, n)),
            };

        // In-place weights: one buffer over the whole mapping. Bytes that are not a
        // memory map (tests) may be unaligned: then those weights are copied instead.
        let map = match choice.iter().any(Option::is_none) {
            true => Buffer::from_host(Arc::new(Mapping(file.clone()))).ok(),
            false => None,
        };
        if map.is_none() {
            choice
                .iter_mut()
                .filter(|c| c.is_none())
                .for_each(|c| *c = Some(BufferType::cpu()));
        }
        if let Some(map) = map {
            map.mark_weights();
            for (id, info) in sources
                .iter()
                .enumerate()
                .filter(|(id, _)| choice[*id].is_none())
            {
                map.place(store.get(id), info.offset as usize)?;
                done += info.n_bytes;
                account("mmap".into(), info.n_bytes as usize);
            }
            progress(done, total);
            store.keep_buffer(map);
        }

        // Copied weights: one buffer per buffer type.
        let mut bufts: Vec<BufferType> = choice.iter().flatten().copied().collect();
        bufts.dedup();
        let mut seen = Vec::new();
        for buft in bufts {
            if seen.contains(&buft) {
                continue;
            }
            seen.push(buft);
            let ids: Vec<usize> = (0..specs.len())
                .filter(|&i| choice[i] == Some(buft))
                .collect();
            let align = buft.alignment().max(1);
            let mut offsets = Vec::with_capacity(ids.len());
            let mut size = 0usize;
            for &i in &ids {
                offsets.push(size);
                size += buft.alloc_size(store.get(i)).div_ceil(align) * align;
            }
            let buf = buft.alloc(size)?;
            buf.mark_weights();
            for (&i, &off) in ids.iter().zip(&offsets) {
                let t = store.get(i);
                buf.place(t, off)?;
                t.write_bytes(0, file.tensor_bytes(&sources[i]))?;
                file.release(&sources[i]);
                done += sources[i].n_bytes;
                progress(done, total);
            }
            account(buft.name(), size);
            store.keep_buffer(buf);
        }
        progress(total, total);
        let repacked = choice
            .iter()
            .map(|c| c.is_some_and(|b| extra.contains(&b)))
            .collect();
        Ok(Weights {
            store,
            placement,
            repacked,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_offload_takes_the_last_layers() {
        let mut l = SpecList::default();
        l.add("token_embd.weight", &[8, 8], WeightUse::Rows);
        for i in 0..4 {
            l.add(format!("blk.{i}.attn_q.weight"), &[8, 8], WeightUse::MatMul);
            l.add(
                format!("blk.{i}.attn_norm.weight"),
                &[8],
                WeightUse::Elementwise,
            );
        }
        l.add("output.weight", &[8, 8], WeightUse::MatMul);
        let on = |o: Offload| o.on_device(l.specs());
        let all = on(Offload::All);
        assert!(all.iter().all(|&x| x));
        assert_eq!(on(Offload::Layers(4)), all);
        assert_eq!(on(Offload::Layers(99)), all);
        let none = on(Offload::Layers(0));
        assert!(none.iter().all(|&x| !x));
        let two = on(Offload::Layers(2));
        assert_eq!(
            two,
            [false, false, false, false, false, true, true, true, true, false]
        );
        assert!((0..4).all(|il| Offload::All.layer_on_device(il, 4)));
        let kv: Vec<bool> = (0..4)
            .map(|il| Offload::Layers(2).layer_on_device(il, 4))
            .collect();
        assert_eq!(kv, [false, false, true, true]);
        assert!(!Offload::Layers(0).layer_on_device(3, 4));
    }
}
