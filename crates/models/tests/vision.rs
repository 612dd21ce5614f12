//! A tiny synthetic Qwen3-VL projector (`mmproj`, llama.cpp's converter layout)
//! written in memory: its hyper-parameters load with llama.cpp's defaults,
//! files that are not a usable projector or do not fit the language model fail
//! with a message naming the problem, and images preprocess to the patch grid.

use std::sync::Arc;

use tempo9_gguf::GgufFile;
use tempo9_models::vision::{
    decode, DecodedImage, PixelHash, Projector, ProjectorType, VisionError,
};

mod common;
use common::Writer;

/// ViT width, heads, feed-forward, blocks, patch side, LM width.
const E: usize = 32;
const HEADS: usize = 2;
const FF: usize = 48;
const LAYERS: usize = 3;
const PATCH: usize = 4;
const PROJ: usize = 24;
/// Position-embedding grid side (image_size / patch).
const GRID: usize = 6;
const DEEPSTACK: [usize; 2] = [0, 2];

/// The tiny projector; `tweak` may change metadata.
fn tiny_mmproj(tweak: impl FnOnce(&mut Writer)) -> Vec<u8> {
    tiny_mmproj_std([0.5, 0.5, 0.5], tweak)
}

/// [`tiny_mmproj`] with `std` as the normalisation's divisors.
fn tiny_mmproj_std(std: [f32; 3], tweak: impl FnOnce(&mut Writer)) -> Vec<u8> {
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
    w.f32_array("clip.vision.image_mean", &[0.5, 0.5, 0.5]);
    w.f32_array("clip.vision.image_std", &std);
    tweak(&mut w);
    let mut seed = 0x1234_5678_9abc_def1u64;
    for t in tensor_shapes() {
        w.tensor(&t.0, &t.1, &mut seed);
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

fn load(bytes: Vec<u8>) -> Result<Projector, VisionError> {
    Projector::from_file(Arc::new(GgufFile::from_bytes(bytes).unwrap()))
}

#[test]
fn loads_hparams_with_llama_cpp_defaults() {
    let p = load(tiny_mmproj(|_| {})).unwrap();
    let hp = p.hparams();
    assert_eq!(hp.projector, ProjectorType::Qwen3Vl);
    assert_eq!(
        (hp.n_embd, hp.n_head, hp.n_ff, hp.n_layer),
        (E, HEADS, FF, LAYERS)
    );
    assert_eq!(
        (hp.patch_size, hp.n_merge, hp.image_size),
        (PATCH, 2, GRID * PATCH)
    );
    assert_eq!(hp.deepstack_layers, DEEPSTACK);
    assert_eq!(hp.n_embd_out(), PROJ * 3);
    // 8 to 4096 merged tokens of (patch × 2)² pixels.
    assert_eq!((hp.min_pixels, hp.max_pixels), (8 * 64, 4096 * 64));
    p.check_language_model("qwen3vl", PROJ, 2).unwrap();
}

#[test]
fn bad_files_and_mismatches_name_the_problem() {
    let err = |bytes: Vec<u8>| load(bytes).err().expect("must fail").to_string();
    let e = err(tiny_mmproj(|w| {
        w.string("clip.vision.projector_type", "gemma3")
    }));
    assert!(e.contains("'gemma3' is not supported"), "{e}");
    let mut not_clip = Writer::new("qwen3");
    not_clip.u32("qwen3.block_count", 1);
    let e = err(not_clip.finish());
    assert!(e.contains("not a projector"), "{e}");
    let e = err(tiny_mmproj_std([0.5, 0.0, 0.5], |_| {}));
    assert!(e.contains("has a zero"), "{e}");

    let p = load(tiny_mmproj(|_| {})).unwrap();
    let e = p
        .check_language_model("qwen3vl", 64, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("24-wide") && e.contains("64"), "{e}");
    let e = p
        .check_language_model("qwen3", PROJ, 2)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not 'qwen3'"), "{e}");
    let e = p
        .check_language_model("qwen3vl", PROJ, 3)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("2 deepstack layers") && e.contains("takes 3"),
        "{e}"
    );
}

#[test]
fn preprocess_fits_the_patch_grid_and_normalises() {
    let p = load(tiny_mmproj(|_| {})).unwrap();
    // 30×17 grey 51 (0.2): smart resize to multiples of 8 → 32×16 = 512 pixels,
    // exactly the minimum. As `mtmd`, the picture keeps its aspect: scaled by
    // min(32/30, 16/17) to 29×16 (sides rounded up), centred at column 1, black
    // around. Flat stays flat, normalised to (0.2 - 0.5) / 0.5; black to -1.
    let img = DecodedImage::from_rgb(30, 17, vec![51; 30 * 17 * 3]).unwrap();
    let pre = p.preprocess(&img);
    assert_eq!((pre.width, pre.height), (32, 16));
    assert_eq!(pre.planar.len(), 3 * 32 * 16);
    let grey = (51.0f32 / 255.0 - 0.5) / 0.5;
    for (i, &v) in pre.planar.iter().enumerate() {
        let x = i % 32;
        let want = if (1..30).contains(&x) { grey } else { -1.0 };
        assert_eq!(v, want, "value {i} (x {x})");
    }
    assert_eq!(pre.hash, PixelHash::of(&img));
    // A different picture has a different hash.
    let mut other = img.clone();
    other.rgb[7] ^= 1;
    assert_ne!(PixelHash::of(&other), pre.hash);
    // Bytes that are not an image are a clear error.
    let e = decode(b"\x89PNG\r\n\x1a\nbroken", 1 << 20)
        .unwrap_err()
        .to_string();
    assert!(e.contains("cannot be decoded"), "{e}");
}
