//! `tempo9 synth-gguf --projector gemma4-tiny`: a tiny Gemma 4 vision projector
//! (`mmproj`, architecture `clip`, projector type `gemma4v`) in llama.cpp's
//! converter layout (`conversion/gemma.py`'s `Gemma4VisionAudioModel`: separate
//! Q/K/V with per-head norms, sandwich norms, layer scalars, a two-table
//! position embedding, `std_bias`/`std_scale`, the input projection, and
//! clamp scalars of `Gemma4ClippableLinear` on some projections), F32 random
//! weights with the shared minimal writer of [`super::mmproj`]. Its output is
//! 128 wide, for the gemma4-tiny and gemma4moe-tiny language models; the
//! fixtures' recorder (`scripts/fixtures/vision_fixtures.py --gemma4`) writes
//! the projector with this command, so there is one writer.

use super::mmproj::Writer;

/// ViT width, heads, feed-forward, blocks, patch side, projection width and
/// position-table length of the tiny projector (the pooling kernel is
/// llama.cpp's default for the type, 3, so the file has no key for it).
const E: usize = 32;
const HEADS: usize = 2;
const FF: usize = 64;
const LAYERS: usize = 2;
const PATCH: usize = 4;
const PROJ: usize = 128;
const POS: usize = 256;
const SEED: u64 = 0x6e6d_6d61_3476_0001;

/// Clamp bounds (`Gemma4ClippableLinear`) on some projections, set so that they
/// cut the tails of the random activations and the test sees them act.
const CLAMPS: [(&str, &str, f32); 6] = [
    ("v.blk.0.attn_q", "input_max", 0.12),
    ("v.blk.0.attn_q", "input_min", -0.12),
    ("v.blk.1.ffn_down", "output_max", 0.05),
    ("v.blk.1.ffn_down", "output_min", -0.05),
    ("mm.input_projection", "input_max", 1.5),
    ("mm.input_projection", "output_min", -0.6),
];

/// The tiny projector's file bytes.
pub fn tiny_gemma4v() -> Vec<u8> {
    let mut w = Writer::new("clip");
    // The converter's order: MmprojModel's keys, then Gemma 4's.
    w.bool("clip.has_vision_encoder", true);
    w.u32("clip.vision.projection_dim", PROJ as u32);
    w.u32("clip.vision.image_size", 224);
    w.u32("clip.vision.patch_size", PATCH as u32);
    w.u32("clip.vision.embedding_length", E as u32);
    w.u32("clip.vision.feed_forward_length", FF as u32);
    w.u32("clip.vision.block_count", LAYERS as u32);
    w.u32("clip.vision.attention.head_count", HEADS as u32);
    w.f32_array("clip.vision.image_mean", &[0.0; 3]);
    w.f32_array("clip.vision.image_std", &[1.0; 3]);
    w.string("clip.vision.projector_type", "gemma4v");
    w.f32("clip.vision.attention.layer_norm_epsilon", 1e-6);
    let mut seed = SEED;
    for (name, shape) in tensor_shapes() {
        w.tensor(&name, &shape, &mut seed, 0, 1.0);
    }
    for (base, what, v) in CLAMPS {
        w.tensor_values(&format!("{base}.{what}"), &[1], vec![v]);
    }
    let mut out = Vec::new();
    w.finish(&mut out).expect("writing to memory");
    out
}

/// Every random tensor of the tiny projector with its shape (innermost first).
fn tensor_shapes() -> Vec<(String, Vec<usize>)> {
    let d_head = E / HEADS;
    let mut t: Vec<(String, Vec<usize>)> = vec![
        ("v.patch_embd.weight".into(), vec![PATCH, PATCH, 3, E]),
        // Two tables (x, then y) of POS positions.
        ("v.position_embd.weight".into(), vec![E, POS, 2]),
    ];
    for il in 0..LAYERS {
        let b = |n: &str| format!("v.blk.{il}.{n}.weight");
        t.extend([
            (b("ln1"), vec![E]),
            (b("attn_q"), vec![E, E]),
            (b("attn_k"), vec![E, E]),
            (b("attn_v"), vec![E, E]),
            (b("attn_q_norm"), vec![d_head]),
            (b("attn_k_norm"), vec![d_head]),
            (b("attn_out"), vec![E, E]),
            (b("attn_post_norm"), vec![E]),
            (b("ln2"), vec![E]),
            (b("ffn_gate"), vec![E, FF]),
            (b("ffn_up"), vec![E, FF]),
            (b("ffn_down"), vec![FF, E]),
            (b("ffn_post_norm"), vec![E]),
            (b("out_scale"), vec![1]),
        ]);
    }
    t.extend([
        ("v.std_bias".into(), vec![E]),
        ("v.std_scale".into(), vec![E]),
        ("mm.input_projection.weight".into(), vec![E, PROJ]),
    ]);
    t
}

#[cfg(test)]
mod tests {
    use tempo9_gguf::GgufFile;

    /// The file parses as GGUF with every tensor, the clamp scalars included.
    #[test]
    fn writes_a_complete_projector() {
        let f = GgufFile::from_bytes(super::tiny_gemma4v()).unwrap();
        assert_eq!(f.architecture().unwrap(), "clip");
        assert_eq!(
            f.metadata().get_str("clip.vision.projector_type").unwrap(),
            Some("gemma4v")
        );
        let n = super::tensor_shapes().len() + super::CLAMPS.len();
        assert_eq!(f.tensors().len(), n);
        assert!(f.tensor("v.blk.1.ffn_down.output_max").is_some());
    }
}
