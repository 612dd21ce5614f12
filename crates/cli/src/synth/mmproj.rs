//! `tempo9 synth-gguf --projector qwen3vl-tiny`: the tiny Qwen3-VL vision
//! projector (`mmproj`, architecture `clip`, llama.cpp's converter layout, F32
//! random weights) that the vision tests and llama.cpp's reference were
//! recorded on, byte for byte as `crates/models/tests/vision.rs` and
//! `scripts/fixtures/vision_fixtures.py` write it (same keys in the same order,
//! the same xorshift weights; its FNV-1a-64 is in the fixtures).

/// ViT width, heads, feed-forward, blocks, patch side, projection width,
/// position grid side and deepstack layers of the tiny projector.
const E: usize = 16;
const HEADS: usize = 2;
const FF: usize = 32;
const LAYERS: usize = 3;
const PATCH: usize = 4;
const PROJ: usize = 128;
const GRID: usize = 6;
const DEEPSTACK: [usize; 2] = [0, 2];
const SEED: u64 = 0x1234_5678_9abc_def1;

/// The tiny projector's file bytes.
pub fn tiny_qwen3vl() -> Vec<u8> {
    let mut w = Writer::new("clip");
    w.string("clip.projector_type", "qwen3vl_merger");
    w.bool("clip.has_vision_encoder", true);
    w.bool("clip.use_gelu", true);
    w.u32("clip.vision.embedding_length", E as u32);
    w.u32("clip.vision.attention.head_count", HEADS as u32);
    w.u32("clip.vision.feed_forward_length", FF as u32);
    w.u32("clip.vision.block_count", LAYERS as u32);
    w.u32("clip.vision.projection_dim", PROJ as u32);
    w.u32("clip.vision.image_size", (GRID * PATCH) as u32);
    w.u32("clip.vision.patch_size", PATCH as u32);
    w.u32("clip.vision.spatial_merge_size", 2);
    w.f32("clip.vision.attention.layer_norm_epsilon", 1e-6);
    w.f32_array("clip.vision.image_mean", &[0.5; 3]);
    w.f32_array("clip.vision.image_std", &[0.5; 3]);
    let mut seed = SEED;
    for (name, shape) in tensor_shapes() {
        w.tensor(&name, &shape, &mut seed);
    }
    w.finish()
}

/// Every tensor of the tiny projector with its shape (innermost first).
fn tensor_shapes() -> Vec<(String, Vec<usize>)> {
    let e4 = 4 * E;
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("v.patch_embd.weight".into(), vec![PATCH, PATCH, 3, E]),
        ("v.patch_embd.weight.1".into(), vec![PATCH, PATCH, 3, E]),
        ("v.patch_embd.bias".into(), vec![E]),
        ("v.position_embd.weight".into(), vec![E, GRID * GRID]),
        ("v.post_ln.weight".into(), vec![E]),
        ("v.post_ln.bias".into(), vec![E]),
        ("mm.0.weight".into(), vec![e4, e4]),
        ("mm.0.bias".into(), vec![e4]),
        ("mm.2.weight".into(), vec![e4, PROJ]),
        ("mm.2.bias".into(), vec![PROJ]),
    ];
    for il in 0..LAYERS {
        let b = |n: &str| format!("v.blk.{il}.{n}");
        t.extend([
            (b("ln1.weight"), vec![E]),
            (b("ln1.bias"), vec![E]),
            (b("attn_qkv.weight"), vec![E, 3 * E]),
            (b("attn_qkv.bias"), vec![3 * E]),
            (b("attn_out.weight"), vec![E, E]),
            (b("attn_out.bias"), vec![E]),
            (b("ln2.weight"), vec![E]),
            (b("ln2.bias"), vec![E]),
            (b("ffn_up.weight"), vec![E, FF]),
            (b("ffn_up.bias"), vec![FF]),
            (b("ffn_down.weight"), vec![FF, E]),
            (b("ffn_down.bias"), vec![E]),
        ]);
    }
    for il in DEEPSTACK {
        let d = |n: &str| format!("v.deepstack.{il}.{n}");
        t.extend([
            (d("norm.weight"), vec![e4]),
            (d("norm.bias"), vec![e4]),
            (d("fc1.weight"), vec![e4, e4]),
            (d("fc1.bias"), vec![e4]),
            (d("fc2.weight"), vec![e4, PROJ]),
            (d("fc2.bias"), vec![PROJ]),
        ]);
    }
    t
}

/// The tests' minimal GGUF v3 writer (string, u32, f32, bool and f32-array
/// keys; F32 tensors), kept byte-identical to theirs.
pub(crate) struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Writer {
    pub(crate) fn new(arch: &str) -> Writer {
        let mut w = Writer {
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        };
        w.string("general.architecture", arch);
        w
    }

    fn key(&mut self, k: &str, ty: u32) {
        self.kv.extend((k.len() as u64).to_le_bytes());
        self.kv.extend(k.as_bytes());
        self.kv.extend(ty.to_le_bytes());
        self.n_kv += 1;
    }

    pub(crate) fn string(&mut self, k: &str, v: &str) {
        self.key(k, 8);
        self.kv.extend((v.len() as u64).to_le_bytes());
        self.kv.extend(v.as_bytes());
    }

    pub(crate) fn u32(&mut self, k: &str, v: u32) {
        self.key(k, 4);
        self.kv.extend(v.to_le_bytes());
    }

    pub(crate) fn f32(&mut self, k: &str, v: f32) {
        self.key(k, 6);
        self.kv.extend(v.to_le_bytes());
    }

    pub(crate) fn bool(&mut self, k: &str, v: bool) {
        self.key(k, 7);
        self.kv.push(u8::from(v));
    }

    pub(crate) fn f32_array(&mut self, k: &str, v: &[f32]) {
        self.key(k, 9);
        self.kv.extend(6u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend(x.to_le_bytes());
        }
    }

    /// A tensor of xorshift64 values in [-0.2, 0.2].
    pub(crate) fn tensor(&mut self, name: &str, shape: &[usize], seed: &mut u64) {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed % 2001) as f32 / 1000.0 - 1.0) * 0.2
            })
            .collect();
        self.tensors.push((name.into(), shape.to_vec(), data));
    }

    /// A tensor of the given values (scalars such as clamp bounds).
    pub(crate) fn tensor_values(&mut self, name: &str, shape: &[usize], data: Vec<f32>) {
        assert_eq!(shape.iter().product::<usize>(), data.len(), "{name}");
        self.tensors.push((name.into(), shape.to_vec(), data));
    }

    pub(crate) fn finish(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, shape, data) in &self.tensors {
            out.extend((name.len() as u64).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend((shape.len() as u32).to_le_bytes());
            for &d in shape {
                out.extend((d as u64).to_le_bytes());
            }
            out.extend(0u32.to_le_bytes()); // F32
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64 * 4).div_ceil(32) * 32;
        }
        pad32(&mut out);
        for (_, _, data) in &self.tensors {
            for x in data {
                out.extend(x.to_le_bytes());
            }
            pad32(&mut out);
        }
        out
    }
}

fn pad32(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(32) {
        out.push(0);
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
