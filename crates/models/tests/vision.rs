//! A tiny synthetic Qwen3-VL projector (`mmproj`, llama.cpp's converter layout)
//! written in memory: its hyper-parameters load with llama.cpp's defaults,
//! files that are not a usable projector or do not fit the language model fail
//! with a message naming the problem, and images preprocess to the patch grid.

use std::sync::Arc;

use tempo9_gguf::GgufFile;
use tempo9_models::vision::ImageEmbeddings;
use tempo9_models::vision::{
    decode, DecodedImage, PixelHash, Projector, ProjectorType, VisionEncoder, VisionError,
};
use tempo9_models::{
    CellRun, KvView, LoadOptions, MaskBuilder, Model, RowEmbeds, SeqSpan, StepBatch,
};

mod common;
use common::Writer;

// ViT width, heads, feed-forward, blocks, patch side, LM width; the same in
// scripts/fixtures/vision_fixtures.py, which writes this file byte for byte.
const E: usize = 16;
const HEADS: usize = 2;
const FF: usize = 32;
const LAYERS: usize = 3;
const PATCH: usize = 4;
const PROJ: usize = 128;
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
    assert!(e.contains("128-wide") && e.contains("64"), "{e}");
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

/// The test image of `w × h` (scripts/fixtures/vision_fixtures.py's `pixels`):
/// gradients plus an LCG's noise.
fn pixels(w: u32, h: u32) -> DecodedImage {
    let mut rgb = Vec::with_capacity((w * h * 3) as usize);
    let mut s = w.wrapping_mul(7919).wrapping_add(h.wrapping_mul(104729));
    for y in 0..h {
        for x in 0..w {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            let n = (s >> 24) % 64;
            rgb.push(((x * 255 / (w - 1).max(1) + n) % 256) as u8);
            rgb.push(((y * 255 / (h - 1).max(1) + 2 * n) % 256) as u8);
            rgb.push((((x + y) * 9 + n) % 256) as u8);
        }
    }
    DecodedImage::from_rgb(w, h, rgb).unwrap()
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3vl-tiny/vision")
}

/// Preprocessing against llama.cpp's `mtmd` (b11434) on six images of
/// different sizes (upscaled with padding, unchanged, tall, wide, under the
/// minimum, downscaled): the same resized size and bit-identical f32 values.
#[test]
fn preprocess_matches_llama_cpp_bit_for_bit() {
    let bytes = tiny_mmproj(|_| {});
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("preprocess.json")).unwrap(),
    )
    .unwrap();
    // The fixture was recorded on this very file.
    assert_eq!(
        fixture["mmproj_fnv1a64"],
        format!("{:016x}", fnv1a64(&bytes))
    );
    let p = load(bytes).unwrap();
    let images = fixture["images"].as_array().unwrap();
    assert_eq!(images.len(), 6);
    assert_preprocessed_as_recorded(&p, images);
}

/// Reads a `.emb.f32` fixture: (n_tokens, n_embd, values).
fn read_emb(path: &std::path::Path) -> (usize, usize, Vec<f32>) {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let n = i32::from_le_bytes(b[0..4].try_into().unwrap()) as usize;
    let d = i32::from_le_bytes(b[4..8].try_into().unwrap()) as usize;
    let v: Vec<f32> = b[8..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(v.len(), n * d);
    (n, d, v)
}

/// Each recorded image (its size) preprocessed by `p`: the resized size and the
/// FNV-1a-64 of the f32 pixels, RGB-interleaved as llama.cpp's clip_image_f32
/// (ours are planar), as recorded.
fn assert_preprocessed_as_recorded(p: &Projector, images: &[serde_json::Value]) {
    for im in images {
        let (w, h) = (
            im["width"].as_u64().unwrap() as u32,
            im["height"].as_u64().unwrap() as u32,
        );
        let pre = p.preprocess(&pixels(w, h));
        let want = [
            im["resized"][0].as_u64().unwrap(),
            im["resized"][1].as_u64().unwrap(),
        ];
        assert_eq!([pre.width as u64, pre.height as u64], want, "{w}x{h}");
        // llama.cpp's clip_image_f32 is RGB-interleaved; ours is planar.
        let n = pre.width * pre.height;
        let interleaved: Vec<u8> = (0..n)
            .flat_map(|i| (0..3).map(move |c| c * n + i))
            .flat_map(|j| pre.planar[j].to_le_bytes())
            .collect();
        assert_eq!(
            im["fnv1a64"].as_str().unwrap(),
            format!("{:016x}", fnv1a64(&interleaved)),
            "{w}x{h}: first values {:?} vs llama.cpp's {}",
            &pre.planar[..2],
            im["first"]
        );
    }
}

/// How a recorded reference relates to this build: ggml's CPU kernels (the
/// kernel set) and the compiler's target (`codegen`: plain C loops round
/// differently per `-march`) decide the last bits.
enum Reference {
    /// Recorded with this build's kernel set and codegen: compared exactly.
    Exact(std::path::PathBuf),
    /// Recorded with this kernel set but another codegen (named): compared
    /// within a tolerance, or skipped where a tolerance means nothing.
    OtherCodegen(std::path::PathBuf, String),
    /// No reference for this kernel set.
    None,
}

/// The reference among `candidates` (path, recorded fingerprint, recorded
/// codegen) for this build, selected by fingerprint and codegen, never by name.
fn select(candidates: Vec<(std::path::PathBuf, String, String)>) -> Reference {
    let ks = tempo9_ggml::KernelSet::current().fingerprint();
    let cg = common::codegen();
    let same_set: Vec<_> = candidates.into_iter().filter(|c| c.1 == ks).collect();
    if let Some(c) = same_set.iter().find(|c| c.2 == cg) {
        return Reference::Exact(c.0.clone());
    }
    match same_set.into_iter().next() {
        Some(c) => Reference::OtherCodegen(c.0, c.2),
        None => Reference::None,
    }
}

/// The encoder-output references: directories under `vision_dir` whose
/// `meta.json` names the kernel set and codegen they were recorded with.
fn embedding_reference(vision_dir: std::path::PathBuf) -> Reference {
    let mut found = Vec::new();
    for e in std::fs::read_dir(vision_dir).unwrap().flatten() {
        let meta = e.path().join("meta.json");
        let Ok(text) = std::fs::read_to_string(&meta) else {
            continue;
        };
        let m: serde_json::Value = serde_json::from_str(&text).unwrap();
        found.push((
            e.path(),
            m["kernel_set"]["fingerprint"].as_str().unwrap().to_string(),
            m["codegen"].as_str().unwrap().to_string(),
        ));
    }
    select(found)
}

/// The greedy references of `model_dir`: `greedy/*.json` with their recorded
/// `kernel_set` and `codegen`.
fn greedy_reference(model_dir: &str) -> Reference {
    let dir = fixture_dir().join(format!("../../{model_dir}/greedy"));
    let mut found = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let fx: serde_json::Value = serde_json::from_str(&text).unwrap();
        found.push((
            e.path(),
            fx["kernel_set"]["fingerprint"]
                .as_str()
                .unwrap()
                .to_string(),
            fx["codegen"].as_str().unwrap().to_string(),
        ));
    }
    select(found)
}

/// The encoder (patch convolutions, 2×2 reorder, resized learned positions,
/// ViT blocks with 2-D M-RoPE, merger and deepstack mergers) against llama.cpp's
/// `clip` on the same file and images: bit-identical against a reference of this
/// build's kernel set and codegen; within 1e-4 (relative to the largest value)
/// against one of another codegen.
#[test]
fn encoder_matches_llama_cpp_clip() {
    let here = tempo9_ggml::KernelSet::current().short_name();
    let (dir, tolerance) = match embedding_reference(fixture_dir()) {
        Reference::Exact(d) => {
            eprintln!("encoder parity EXACT against {}", d.display());
            (d, 1e-5)
        }
        Reference::OtherCodegen(d, cg) => {
            eprintln!(
                "encoder parity within a tolerance: {} was recorded with codegen {cg}, this build is {}",
                d.display(),
                common::codegen()
            );
            (d, 1e-4)
        }
        Reference::None => {
            eprintln!("skipping encoder parity: no reference for kernel set {here}");
            return;
        }
    };
    let p = load(tiny_mmproj(|_| {})).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture_dir().join("preprocess.json")).unwrap(),
    )
    .unwrap();
    let pre: Vec<_> = fixture["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|im| {
            let w = im["width"].as_u64().unwrap() as u32;
            let h = im["height"].as_u64().unwrap() as u32;
            (
                im["name"].as_str().unwrap().to_string(),
                p.preprocess(&pixels(w, h)),
            )
        })
        .collect();
    let enc = VisionEncoder::new(p, tempo9_ggml::Device::cpu(), 2).unwrap();
    let mut worst = 0f32;
    for (name, img) in &pre {
        let got = enc.encode(img).unwrap();
        let (n, d, want) = read_emb(&dir.join(format!("{name}.emb.f32")));
        assert_eq!((got.n_tokens(), got.n_embd), (n, d), "image {name}");
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = got
            .data
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("image {name}: {n} tokens x {d}, max |diff| {diff:e} (max |value| {scale})");
        worst = worst.max(diff / scale);
    }
    // Recorded: bit-identical on one kernel set and codegen (same ggml
    // kernels, same graph, op for op).
    assert!(worst < tolerance, "relative difference {worst:e}");
    // The same pixels again come from the encoder's cache, not a new encode.
    let again = enc.encode(&pre[0].1).unwrap();
    assert!(std::sync::Arc::ptr_eq(
        &again,
        &enc.cached(pre[0].1.hash).unwrap()
    ));
}

/// One single-sequence step over `n` rows stored in cells `start..start + n`,
/// each row seeing every cell up to its own (rows of an image share one
/// temporal position, and llama.cpp's 2-D mask then orders them by (y, x): the
/// raster order they are stored in).
fn lm_step(
    model: &Arc<Model>,
    exec: &mut tempo9_models::Executor,
    kv: &Arc<tempo9_models::KvStore>,
    start: usize,
    rows: Rows<'_>,
) -> Vec<f32> {
    let n = rows.len();
    let n_kv = start + n;
    let mut mask = MaskBuilder::new(n_kv, n);
    for r in 0..n {
        mask.allow_prefix(r, (start + r) as i32, None);
    }
    let mut b = StepBatch {
        kv_slots: vec![(start..n_kv).map(|c| c as i64).collect()],
        seqs: vec![SeqSpan {
            row_start: 0,
            n_rows: n,
            views: vec![KvView {
                window: vec![CellRun {
                    start: 0,
                    len: n_kv,
                }],
                mask: mask.into_data(),
                mask_swa: None,
            }],
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        }],
        output_rows: vec![n as i32 - 1],
        ..StepBatch::default()
    };
    match rows {
        Rows::Text(toks, pos) => {
            b.tokens = toks.to_vec();
            b.positions = (0..n as i32).map(|i| pos + i).collect();
        }
        Rows::Image(e, pos) => {
            // mtmd's M-RoPE image positions: (t, y, x, 0) = (p, p + row, p + col, 0).
            b.tokens = vec![0; n];
            b.positions = vec![pos; n];
            let mut pm = vec![pos; n];
            pm.extend((0..n).map(|i| pos + (i / e.n_x) as i32));
            pm.extend((0..n).map(|i| pos + (i % e.n_x) as i32));
            pm.extend(std::iter::repeat_n(0, n));
            b.positions_multi = Some(pm);
            b.embeds = Some(RowEmbeds {
                rows: (0..n as i32).collect(),
                values: e.data.clone(),
            });
        }
    }
    model.forward(exec, kv, &b).unwrap()
}

/// A step's rows: text tokens from a position, or an image at a position.
enum Rows<'a> {
    Text(&'a [u32], i32),
    Image(&'a ImageEmbeddings, i32),
}

impl Rows<'_> {
    fn len(&self) -> usize {
        match self {
            Rows::Text(t, _) => t.len(),
            Rows::Image(e, _) => e.n_tokens(),
        }
    }
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

/// The synthetic Qwen3-VL (dense) language model with the tiny projector
/// against llama-server `--mmproj` (b11434) on six images of different sizes:
/// the text before the image, the image's embeddings (deepstack features
/// included) at M-RoPE positions, the text after it at positions advanced by
/// the larger side of the image grid, then 32 greedy tokens, identical.
#[test]
fn greedy_after_an_image_matches_llama_cpp() {
    greedy_after_images("qwen3vl-tiny");
}

/// [`greedy_after_an_image_matches_llama_cpp`] for Qwen3-VL-MoE.
#[test]
fn greedy_after_an_image_matches_llama_cpp_moe() {
    greedy_after_images("qwen3vlmoe-tiny");
}

fn greedy_after_images(model_dir: &str) {
    // Greedy tokens of a random model part at the first rounding difference:
    // only a reference of this very build's kernels and codegen is compared.
    let fx_path = match greedy_reference(model_dir) {
        Reference::Exact(p) => p,
        Reference::OtherCodegen(p, cg) => {
            eprintln!(
                "skipping greedy image parity: {} was recorded with codegen {cg}, this build is {}",
                p.display(),
                common::codegen()
            );
            return;
        }
        Reference::None => {
            eprintln!("skipping greedy image parity: no reference for this kernel set");
            return;
        }
    };
    eprintln!("greedy image parity EXACT against {}", fx_path.display());
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx_path).unwrap()).unwrap();
    let Some(path) = common::model_path(fx["model"].as_str().unwrap()) else {
        return;
    };
    let model = Arc::new(Model::load(&path, LoadOptions::new(tempo9_ggml::Device::cpu())).unwrap());
    let hp = model.hparams().clone();
    let bytes = tiny_mmproj(|_| {});
    assert_eq!(fx["mmproj_fnv1a64"], format!("{:016x}", fnv1a64(&bytes)));
    let p = load(bytes).unwrap();
    p.check_language_model(hp.arch.name(), hp.n_embd, hp.n_deepstack)
        .unwrap();
    let ids = |k: &str| -> Vec<u32> {
        fx[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let (before, after) = (ids("tokens_before"), ids("tokens_after"));
    let sizes: Vec<(String, u32, u32)> = {
        let pre: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(fixture_dir().join("preprocess.json")).unwrap(),
        )
        .unwrap();
        pre["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|im| {
                let d = |k: &str| im[k].as_u64().unwrap() as u32;
                (
                    im["name"].as_str().unwrap().to_string(),
                    d("width"),
                    d("height"),
                )
            })
            .collect()
    };
    let enc = VisionEncoder::new(p, tempo9_ggml::Device::cpu(), 2).unwrap();
    let images = fx["images"].as_array().unwrap();
    assert_eq!(images.len(), 6);
    for im in images {
        let name = im["name"].as_str().unwrap();
        let &(_, w, h) = sizes.iter().find(|s| s.0 == name).unwrap();
        let emb = enc
            .encode(&enc.projector().preprocess(&pixels(w, h)))
            .unwrap();
        let want: Vec<u32> = im["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let groups = model.cache_groups(false);
        let kv = model.new_kv(&groups, &[1024]).unwrap();
        let mut exec = tempo9_models::Executor::new(tempo9_ggml::Device::cpu(), 2).unwrap();
        let mut cell = 0;
        lm_step(&model, &mut exec, &kv, cell, Rows::Text(&before, 0));
        cell += before.len();
        let t = before.len() as i32;
        lm_step(&model, &mut exec, &kv, cell, Rows::Image(&emb, t));
        cell += emb.n_tokens();
        // mtmd: an M-RoPE image advances the position by max(nx, ny).
        let mut pos = t + emb.n_x.max(emb.n_y) as i32;
        let mut logits = lm_step(&model, &mut exec, &kv, cell, Rows::Text(&after, pos));
        cell += after.len();
        pos += after.len() as i32;
        let mut got = Vec::new();
        while got.len() < want.len() {
            let tok = argmax(&logits);
            got.push(tok);
            logits = lm_step(&model, &mut exec, &kv, cell, Rows::Text(&[tok], pos));
            cell += 1;
            pos += 1;
        }
        assert_eq!(
            got,
            want,
            "{model_dir}, image {name} ({w}x{h}, {} tokens)",
            emb.n_tokens()
        );
        eprintln!(
            "{model_dir}, image {name}: {} image tokens, 32 greedy tokens identical",
            emb.n_tokens()
        );
    }
}

/// Malformed image rows are refused before any graph is built, each with a
/// message naming the problem; a text-only architecture takes no embeddings.
#[test]
fn bad_image_rows_are_clear_errors() {
    let Some(path) = common::model_path("qwen3vl-tiny.gguf") else {
        return;
    };
    let cpu = tempo9_ggml::Device::cpu();
    let model = Arc::new(Model::load(&path, LoadOptions::new(cpu)).unwrap());
    let n_inp = model.hparams().n_embd_inp();
    assert_eq!(n_inp, 128 * 3);
    let kv = model.new_kv(&model.cache_groups(false), &[64]).unwrap();
    let mut exec = tempo9_models::Executor::new(cpu, 1).unwrap();
    let mut mask = MaskBuilder::new(2, 2);
    mask.allow_prefix(0, 0, None);
    mask.allow_prefix(1, 1, None);
    let batch = StepBatch {
        tokens: vec![0, 0],
        positions: vec![0, 0],
        kv_slots: vec![vec![0, 1]],
        seqs: vec![SeqSpan {
            row_start: 0,
            n_rows: 2,
            views: vec![KvView {
                window: vec![CellRun { start: 0, len: 2 }],
                mask: mask.into_data(),
                mask_swa: None,
            }],
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        }],
        output_rows: vec![1],
        embeds: Some(RowEmbeds {
            rows: vec![0, 1],
            values: vec![0.0; 2 * n_inp],
        }),
        ..StepBatch::default()
    };
    // The well-formed batch runs.
    model.forward(&mut exec, &kv, &batch).unwrap();
    let mut err = |b: StepBatch| model.forward(&mut exec, &kv, &b).unwrap_err().to_string();
    let mut b = batch.clone();
    b.embeds.as_mut().unwrap().values.pop();
    assert!(err(b).contains("embedding values for 2 rows of 384"));
    let mut b = batch.clone();
    b.embeds.as_mut().unwrap().rows = vec![1, 0];
    assert!(err(b).contains("unsorted or out of range"));
    let mut b = batch.clone();
    b.embeds.as_mut().unwrap().rows = vec![0, 2];
    assert!(err(b).contains("unsorted or out of range"));
    let mut b = batch.clone();
    b.positions_multi = Some(vec![0; 7]);
    assert!(err(b).contains("not 4 per token"));

    // An image not on the patch grid is refused by the encoder.
    let enc = VisionEncoder::new(load(tiny_mmproj(|_| {})).unwrap(), cpu, 1).unwrap();
    let mut pre = enc.projector().preprocess(&pixels(16, 16));
    pre.width -= 1;
    let e = enc.encode(&pre).unwrap_err().to_string();
    assert!(e.contains("not on the 8-pixel grid"), "{e}");

    // A text-only architecture takes no input embeddings.
    let Some(path) = common::model_path("qwen3-tiny.gguf") else {
        return;
    };
    let text = Arc::new(Model::load(&path, LoadOptions::new(cpu)).unwrap());
    let kv = text.new_kv(&text.cache_groups(false), &[64]).unwrap();
    let mut b = batch.clone();
    b.embeds = Some(RowEmbeds {
        rows: vec![0],
        values: vec![0.0; text.hparams().n_embd],
    });
    let e = text.forward(&mut exec, &kv, &b).unwrap_err().to_string();
    assert!(e.contains("qwen3 takes no input embeddings"), "{e}");
}

// ---------------------------------------------------------------------------
// Gemma 4 (`gemma4v` projector, `gemma4` language model), against the
// references of scripts/fixtures/vision_fixtures_gemma4.py.

fn gemma4_fixture_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/gemma4-tiny/vision")
}

fn gemma4_preprocess_fixture() -> serde_json::Value {
    let path = gemma4_fixture_dir().join("preprocess.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The tiny gemma4v projector (`tempo9 synth-gguf --projector gemma4-tiny`,
/// which scripts/synth-models.py puts beside the models), checked to be the
/// file the fixtures were recorded on.
fn gemma4_projector() -> Option<Projector> {
    let path = common::model_path("mmproj-gemma4-tiny.gguf")?;
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(
        gemma4_preprocess_fixture()["mmproj_fnv1a64"],
        format!("{:016x}", fnv1a64(&bytes)),
        "mmproj-gemma4-tiny.gguf is not the recorded projector: rerun scripts/synth-models.py"
    );
    Some(load(bytes).unwrap())
}

/// (name, width, height) of the recorded images.
fn gemma4_images() -> Vec<(String, u32, u32)> {
    gemma4_preprocess_fixture()["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|im| {
            let d = |k: &str| im[k].as_u64().unwrap() as u32;
            (
                im["name"].as_str().unwrap().to_string(),
                d("width"),
                d("height"),
            )
        })
        .collect()
}

#[test]
fn gemma4v_loads_hparams_with_llama_cpp_defaults() {
    let Some(p) = gemma4_projector() else {
        return;
    };
    let hp = p.hparams();
    assert_eq!(hp.projector, ProjectorType::Gemma4V);
    assert_eq!((hp.n_embd, hp.n_head, hp.n_ff, hp.n_layer), (32, 2, 64, 2));
    // Pooling 3 × 3 by default; 70 to 1120 tokens of (4 × 3)² pixels; no
    // `use_gelu` key: llama.cpp's quick GELU.
    assert_eq!((hp.patch_size, hp.n_merge), (4, 3));
    assert_eq!((hp.min_pixels, hp.max_pixels), (70 * 144, 1120 * 144));
    assert_eq!(hp.ffn_act, tempo9_models::vision::FfnAct::GeluQuick);
    assert!(hp.deepstack_layers.is_empty());
    assert_eq!(hp.n_embd_out(), 128);
    p.check_language_model("gemma4", 128, 0).unwrap();
    let e = p
        .check_language_model("qwen3vl", 128, 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("gemma4v projector goes with gemma4"), "{e}");
}

/// Preprocessing against `mtmd` (b11434) on six images (upscaled with padding,
/// slightly resized, tall, wide and unchanged, tiny, downscaled to the token
/// maximum): the same size, bit-identical f32 values.
#[test]
fn gemma4v_preprocess_matches_llama_cpp_bit_for_bit() {
    let Some(p) = gemma4_projector() else {
        return;
    };
    let fixture = gemma4_preprocess_fixture();
    let images = fixture["images"].as_array().unwrap();
    assert_eq!(images.len(), 6);
    assert_preprocessed_as_recorded(&p, images);
}

/// The `gemma4v` tower (patch convolution, x/y position tables, ViT blocks
/// with 2-D NeoX rope, sandwich norms, clamped projections, 3 × 3 pooling,
/// standardisation, projection) against llama.cpp's `clip`: bit-identical
/// against a reference of this build's kernel set and codegen, within 1e-4
/// (relative to the largest value) against another codegen's.
#[test]
fn gemma4v_encoder_matches_llama_cpp_clip() {
    let (dir, tolerance) = match embedding_reference(gemma4_fixture_dir()) {
        Reference::Exact(d) => (d, 1e-6),
        Reference::OtherCodegen(d, _) => (d, 1e-4),
        Reference::None => {
            eprintln!("skipping gemma4v encoder parity: no reference for this kernel set");
            return;
        }
    };
    eprintln!(
        "gemma4v encoder parity against {} (tolerance {tolerance:e})",
        dir.display()
    );
    let Some(p) = gemma4_projector() else {
        return;
    };
    let enc = VisionEncoder::new(p, tempo9_ggml::Device::cpu(), 2).unwrap();
    let mut worst = 0f32;
    for (name, w, h) in gemma4_images() {
        let got = enc
            .encode(&enc.projector().preprocess(&pixels(w, h)))
            .unwrap();
        let (n, d, want) = read_emb(&dir.join(format!("{name}.emb.f32")));
        assert_eq!((got.n_tokens(), got.n_embd), (n, d), "image {name}");
        assert_eq!(
            got.n_x * 3 * 4,
            enc.projector().preprocess(&pixels(w, h)).width
        );
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = got
            .data
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        eprintln!("image {name}: {n} tokens x {d}, max |diff| {diff:e} (max |value| {scale})");
        worst = worst.max(diff / scale);
    }
    assert!(worst <= tolerance, "relative difference {worst:e}");
}

/// One single-sequence Gemma 4 step over `n` rows in cells `start..start + n`
/// at positions equal to the cells (one full cache: llama.cpp's `--swa-full`;
/// the KV store must hold the padded window).
/// Full layers attend causally; sliding layers too, except that the rows of
/// an image (`image: true`) see every cell of the image, within the window
/// behind them (mtmd decodes a Gemma 4 image non-causally, llama.cpp's
/// `LLAMA_NON_CAUSAL_TYPE_SWA_ONLY`).
fn gemma4_step(
    model: &Arc<Model>,
    exec: &mut tempo9_models::Executor,
    kv: &Arc<tempo9_models::KvStore>,
    start: usize,
    tokens: &[u32],
    image: Option<&ImageEmbeddings>,
) -> Vec<f32> {
    let n = image.map_or(tokens.len(), |e| e.n_tokens());
    let n_kv = start + n;
    // llama.cpp's KV cache attends over a window padded to 256 cells (the
    // padding masked): the CPU flash-attention kernel splits a decode row's
    // cells between threads by the window's size, so its sums round as the
    // window is cut.
    let n_win = n_kv.next_multiple_of(256);
    let swa = model.hparams().swa_window;
    let last = (n_kv - 1) as i32;
    let mut mask = MaskBuilder::new(n_win, n);
    let mut mask_swa = MaskBuilder::new(n_win, n);
    for r in 0..n {
        let pos = (start + r) as i32;
        mask.allow_prefix(r, pos, None);
        let through = if image.is_some() { last } else { pos };
        mask_swa.allow_through_from(r, pos, swa, 0, through);
    }
    let mut b = StepBatch {
        tokens: image.map_or_else(|| tokens.to_vec(), |_| vec![0; n]),
        positions: (start as i32..n_kv as i32).collect(),
        kv_slots: vec![(start..n_kv).map(|c| c as i64).collect()],
        seqs: vec![SeqSpan {
            row_start: 0,
            n_rows: n,
            views: vec![KvView {
                window: vec![CellRun {
                    start: 0,
                    len: n_win,
                }],
                mask: mask.into_data(),
                mask_swa: Some(mask_swa.into_data()),
            }],
            tiled_prompt: false,
            state_snapshot: None,
            continues: false,
        }],
        output_rows: vec![n as i32 - 1],
        // As llama.cpp: decode rows through flash attention at any depth.
        flash_decode: true,
        ..StepBatch::default()
    };
    if let Some(e) = image {
        b.embeds = Some(RowEmbeds {
            rows: (0..n as i32).collect(),
            values: e.data.clone(),
        });
    }
    model.forward(exec, kv, &b).unwrap()
}

/// The synthetic Gemma 4 (dense) language model with the tiny gemma4v
/// projector against llama-server `--mmproj` (b11434) on six images: BOS and
/// the text before the image, the image's rows (embeddings unscaled, per-layer
/// inputs of token 0, non-causal on sliding layers) at consecutive positions,
/// the text after, then 32 greedy tokens, identical.
#[test]
fn gemma4_greedy_after_an_image_matches_llama_cpp() {
    gemma4_greedy_after_images("gemma4-tiny");
}

/// [`gemma4_greedy_after_an_image_matches_llama_cpp`] for the MoE file.
#[test]
fn gemma4_greedy_after_an_image_matches_llama_cpp_moe() {
    gemma4_greedy_after_images("gemma4moe-tiny");
}

fn gemma4_greedy_after_images(model_dir: &str) {
    let fx_path = match greedy_reference(&format!("{model_dir}/vision")) {
        Reference::Exact(p) => p,
        Reference::OtherCodegen(p, cg) => {
            eprintln!(
                "skipping greedy image parity: {} was recorded with codegen {cg}, this build is {}",
                p.display(),
                common::codegen()
            );
            return;
        }
        Reference::None => {
            eprintln!("skipping greedy image parity: no reference for this kernel set");
            return;
        }
    };
    eprintln!("greedy image parity EXACT against {}", fx_path.display());
    let fx: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fx_path).unwrap()).unwrap();
    let Some(path) = common::model_path(fx["model"].as_str().unwrap()) else {
        return;
    };
    let Some(p) = gemma4_projector() else {
        return;
    };
    assert_eq!(
        fx["mmproj_fnv1a64"],
        gemma4_preprocess_fixture()["mmproj_fnv1a64"]
    );
    let model = Arc::new(Model::load(&path, LoadOptions::new(tempo9_ggml::Device::cpu())).unwrap());
    let hp = model.hparams().clone();
    p.check_language_model(hp.arch.name(), hp.n_embd, hp.n_deepstack)
        .unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect()
    };
    let (before, after) = (ids(&fx["tokens_before"]), ids(&fx["tokens_after"]));
    let sizes = gemma4_images();
    let enc = VisionEncoder::new(p, tempo9_ggml::Device::cpu(), 2).unwrap();
    let images = fx["images"].as_array().unwrap();
    assert_eq!(images.len(), 6);
    for im in images {
        let name = im["name"].as_str().unwrap();
        let &(_, w, h) = sizes.iter().find(|s| s.0 == name).unwrap();
        let emb = enc
            .encode(&enc.projector().preprocess(&pixels(w, h)))
            .unwrap();
        // llama.cpp evaluated the same number of prompt positions.
        assert_eq!(
            im["tokens_evaluated"].as_u64().unwrap() as usize,
            before.len() + emb.n_tokens() + after.len(),
            "image {name}"
        );
        let want = ids(&im["tokens"]);
        let groups = model.cache_groups(true);
        let kv = model.new_kv(&groups, &[2048]).unwrap();
        let mut exec = tempo9_models::Executor::new(tempo9_ggml::Device::cpu(), 2).unwrap();
        let mut cell = 0;
        gemma4_step(&model, &mut exec, &kv, cell, &before, None);
        cell += before.len();
        gemma4_step(&model, &mut exec, &kv, cell, &[], Some(&emb));
        cell += emb.n_tokens();
        let mut logits = gemma4_step(&model, &mut exec, &kv, cell, &after, None);
        cell += after.len();
        let mut got = Vec::new();
        while got.len() < want.len() {
            let tok = argmax(&logits);
            got.push(tok);
            logits = gemma4_step(&model, &mut exec, &kv, cell, &[tok], None);
            cell += 1;
        }
        assert_eq!(
            got,
            want,
            "{model_dir}, image {name} ({w}x{h}, {} tokens)",
            emb.n_tokens()
        );
        eprintln!(
            "{model_dir}, image {name}: {} image tokens, 32 greedy tokens identical",
            emb.n_tokens()
        );
    }
}
