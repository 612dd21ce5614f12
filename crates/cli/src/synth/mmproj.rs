//! `tempo9 synth-gguf --projector`: Qwen3-VL vision projectors (`mmproj`,
//! architecture `clip`, llama.cpp's converter layout, random weights).
//!
//! The tiny one (F32) is the file the vision tests and llama.cpp's reference
//! were recorded on, byte for byte as `crates/models/tests/vision.rs` and
//! `scripts/fixtures/vision_fixtures.py` write it (same keys in the same order,
//! the same xorshift weights; its FNV-1a-64 is in the fixtures). The
//! published-shape one is for speed tests on a GPU.

use tempo9_ggml::{quantize_rows, DType};
use tempo9_gguf::{ArrayValue, GgmlType, GgufWriter, Value};

/// A Qwen3-VL projector's shape (llama.cpp's `clip.vision.*` keys).
pub struct ProjectorShape {
    /// ViT width.
    e: usize,
    heads: usize,
    /// ViT feed-forward width.
    ff: usize,
    layers: usize,
    /// Patch side in pixels.
    patch: usize,
    /// Output width (the language model's `n_embd`).
    proj: usize,
    /// Side of the learned position grid.
    grid: usize,
    /// ViT blocks whose outputs feed the deepstack mergers.
    deepstack: &'static [usize],
    /// ggml type of the 2-D weight matrices (0 = F32, 1 = F16; the converter
    /// writes F16 for a real projector).
    matrix_type: u32,
    /// Factor on the [-0.2, 0.2] random values (a deep ViT needs smaller
    /// weights to keep finite activations).
    scale: f32,
}

/// The tiny projector the vision tests and llama.cpp's reference were recorded
/// on: ViT 16 wide × 3 blocks, 4-pixel patches, 128-wide output, deepstack 0, 2.
pub const TINY: ProjectorShape = ProjectorShape {
    e: 16,
    heads: 2,
    ff: 32,
    layers: 3,
    patch: 4,
    proj: 128,
    grid: 6,
    deepstack: &[0, 2],
    matrix_type: 0,
    scale: 1.0,
};

/// Qwen3-VL-30B-A3B's vision tower (HF vision_config: depth 27, hidden 1152,
/// 16 heads, intermediate 4304, patch 16, 2304 position embeddings,
/// out_hidden 2048, deepstack_visual_indexes [8, 16, 24]), F16 matrices: a
/// speed-test file with random weights.
pub const QWEN3_VL_30B_A3B: ProjectorShape = ProjectorShape {
    e: 1152,
    heads: 16,
    ff: 4304,
    layers: 27,
    patch: 16,
    proj: 2048,
    grid: 48,
    deepstack: &[8, 16, 24],
    matrix_type: 1,
    scale: 0.1,
};

const SEED: u64 = 0x1234_5678_9abc_def1;

/// The tiny projector's file bytes.
#[cfg(test)]
fn tiny_qwen3vl() -> Vec<u8> {
    let mut out = Vec::new();
    write_qwen3vl(&TINY, &mut out).expect("writing to memory");
    out
}

/// Writes a Qwen3-VL projector of shape `sh`.
pub fn write_qwen3vl(sh: &ProjectorShape, out: &mut impl std::io::Write) -> std::io::Result<()> {
    let mut w = Writer::new("clip");
    w.string("clip.projector_type", "qwen3vl_merger");
    w.bool("clip.has_vision_encoder", true);
    w.bool("clip.use_gelu", true);
    w.u32("clip.vision.embedding_length", sh.e as u32);
    w.u32("clip.vision.attention.head_count", sh.heads as u32);
    w.u32("clip.vision.feed_forward_length", sh.ff as u32);
    w.u32("clip.vision.block_count", sh.layers as u32);
    w.u32("clip.vision.projection_dim", sh.proj as u32);
    w.u32("clip.vision.image_size", (sh.grid * sh.patch) as u32);
    w.u32("clip.vision.patch_size", sh.patch as u32);
    w.u32("clip.vision.spatial_merge_size", 2);
    w.f32("clip.vision.attention.layer_norm_epsilon", 1e-6);
    w.f32_array("clip.vision.image_mean", &[0.5; 3]);
    w.f32_array("clip.vision.image_std", &[0.5; 3]);
    let mut seed = SEED;
    for (name, shape) in tensor_shapes(sh) {
        // Like the converter: matrices in the file's type, vectors and the
        // patch convolutions' 4-D kernels as they are typed below.
        let ty = if shape.len() == 2 && !name.contains("position_embd") {
            sh.matrix_type
        } else {
            0
        };
        w.tensor(&name, &shape, &mut seed, ty, sh.scale);
    }
    w.finish(out)
}

/// Every tensor of a projector with its shape (innermost first).
fn tensor_shapes(sh: &ProjectorShape) -> Vec<(String, Vec<usize>)> {
    let (e, ff, patch, proj) = (sh.e, sh.ff, sh.patch, sh.proj);
    let e4 = 4 * e;
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("v.patch_embd.weight".into(), vec![patch, patch, 3, e]),
        ("v.patch_embd.weight.1".into(), vec![patch, patch, 3, e]),
        ("v.patch_embd.bias".into(), vec![e]),
        ("v.position_embd.weight".into(), vec![e, sh.grid * sh.grid]),
        ("v.post_ln.weight".into(), vec![e]),
        ("v.post_ln.bias".into(), vec![e]),
        ("mm.0.weight".into(), vec![e4, e4]),
        ("mm.0.bias".into(), vec![e4]),
        ("mm.2.weight".into(), vec![e4, proj]),
        ("mm.2.bias".into(), vec![proj]),
    ];
    for il in 0..sh.layers {
        let b = |n: &str| format!("v.blk.{il}.{n}");
        t.extend([
            (b("ln1.weight"), vec![e]),
            (b("ln1.bias"), vec![e]),
            (b("attn_qkv.weight"), vec![e, 3 * e]),
            (b("attn_qkv.bias"), vec![3 * e]),
            (b("attn_out.weight"), vec![e, e]),
            (b("attn_out.bias"), vec![e]),
            (b("ln2.weight"), vec![e]),
            (b("ln2.bias"), vec![e]),
            (b("ffn_up.weight"), vec![e, ff]),
            (b("ffn_up.bias"), vec![ff]),
            (b("ffn_down.weight"), vec![ff, e]),
            (b("ffn_down.bias"), vec![e]),
        ]);
    }
    for &il in sh.deepstack {
        let d = |n: &str| format!("v.deepstack.{il}.{n}");
        t.extend([
            (d("norm.weight"), vec![e4]),
            (d("norm.bias"), vec![e4]),
            (d("fc1.weight"), vec![e4, e4]),
            (d("fc1.bias"), vec![e4]),
            (d("fc2.weight"), vec![e4, proj]),
            (d("fc2.bias"), vec![proj]),
        ]);
    }
    t
}

/// A small projector file's writer: metadata and whole tensors in memory (F32 or
/// F16), written through [`GgufWriter`] (the layout of the tests' files).
pub(crate) struct Writer {
    gguf: GgufWriter,
    data: Vec<Vec<u8>>,
}

impl Writer {
    pub(crate) fn new(arch: &str) -> Writer {
        let mut w = Writer {
            gguf: GgufWriter::new(),
            data: Vec::new(),
        };
        w.string("general.architecture", arch);
        w
    }

    pub(crate) fn string(&mut self, k: &str, v: &str) {
        self.gguf.set(k, Value::String(v.into()));
    }

    pub(crate) fn u32(&mut self, k: &str, v: u32) {
        self.gguf.set(k, Value::U32(v));
    }

    pub(crate) fn f32(&mut self, k: &str, v: f32) {
        self.gguf.set(k, Value::F32(v));
    }

    pub(crate) fn bool(&mut self, k: &str, v: bool) {
        self.gguf.set(k, Value::Bool(v));
    }

    pub(crate) fn f32_array(&mut self, k: &str, v: &[f32]) {
        self.gguf.set(k, Value::Array(ArrayValue::F32(v.to_vec())));
    }

    /// A tensor of xorshift64 values in [-0.2, 0.2] × `scale`, stored as `ty`
    /// (0 = F32, 1 = F16).
    pub(crate) fn tensor(
        &mut self,
        name: &str,
        shape: &[usize],
        seed: &mut u64,
        ty: u32,
        scale: f32,
    ) {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed % 2001) as f32 / 1000.0 - 1.0) * 0.2 * scale
            })
            .collect();
        let (dtype, bytes) = match ty {
            0 => (
                GgmlType::F32,
                data.iter().flat_map(|x| x.to_le_bytes()).collect(),
            ),
            _ => (
                GgmlType::F16,
                quantize_rows(DType::F16, &data, shape[0]).expect("F16 needs no blocks"),
            ),
        };
        self.push(name, shape, dtype, bytes);
    }

    /// A tensor of the given values, F32 (scalars such as clamp bounds).
    pub(crate) fn tensor_values(&mut self, name: &str, shape: &[usize], data: Vec<f32>) {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{name}");
        let bytes = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.push(name, shape, GgmlType::F32, bytes);
    }

    fn push(&mut self, name: &str, shape: &[usize], dtype: GgmlType, bytes: Vec<u8>) {
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        self.gguf
            .add_tensor(name, &shape, dtype)
            .expect("a projector tensor of a known shape");
        self.data.push(bytes);
    }

    pub(crate) fn finish(self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        let data = self.data;
        self.gguf.write(w, |i, _, out| out.write_all(&data[i]))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    /// The file the vision fixtures were recorded on (their `mmproj_fnv1a64`).
    #[test]
    fn is_the_recorded_projector() {
        let h = super::tiny_qwen3vl()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
                (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
            });
        assert_eq!(format!("{h:016x}"), "d682996a80fcb607");
    }
}
