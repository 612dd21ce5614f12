//! Requests with images through the engine, on the synthetic Qwen3-VL model
//! (qwen3vl-tiny) and the tiny projector (`tempo9 synth-gguf --projector
//! qwen3vl-tiny`, written by scripts/synth-models.py): greedy tokens after an
//! image as llama.cpp's `llama-server --mmproj` gives them, an image re-sent in
//! later turns encoded once and served from the prefix cache (the same tokens as
//! computing it afresh), a different image never taken for it, and malformed
//! image requests refused.

mod common;

use std::sync::Arc;

use common::*;
use tempo9_engine::{
    EngineConfig, EngineCore, FinishReason, PromptImage, Request, SubmitError, VisionModel,
};
use tempo9_ggml::{Device, KernelSet};
use tempo9_models::vision::{DecodedImage, Projector, VisionEncoder};
use tempo9_models::Model;

/// The test image of `w × h` (scripts/fixtures/vision_fixtures.py's `pixels`):
/// gradients plus an LCG's noise; `salt` changes the noise (another picture of
/// the same size).
fn pixels(w: u32, h: u32, salt: u32) -> DecodedImage {
    let mut rgb = Vec::with_capacity((w * h * 3) as usize);
    let mut s = w
        .wrapping_mul(7919)
        .wrapping_add(h.wrapping_mul(104729))
        .wrapping_add(salt);
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

/// The model and its vision encoder, or None when the files are missing and
/// TEMPO9_SKIP_MODEL_TESTS=1.
fn setup() -> Option<(Arc<Model>, Arc<VisionEncoder>)> {
    let model = load("qwen3vl-tiny.gguf")?;
    let p = Projector::open(model_path("mmproj-qwen3vl-tiny.gguf")?).unwrap();
    let enc = Arc::new(VisionEncoder::new(p, Device::cpu(), 1).unwrap());
    Some((model, enc))
}

fn engine(model: &Arc<Model>, vision: Option<&Arc<VisionEncoder>>) -> EngineCore {
    let config = EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        vision: vision.map(|v| VisionModel(v.clone())),
        ..EngineConfig::default()
    };
    EngineCore::new(model.clone(), tokenizer(model), config).unwrap()
}

/// A greedy request for `before`, the image's placeholder tokens, then `after`.
fn image_request(
    enc: &VisionEncoder,
    before: &[u32],
    img: &DecodedImage,
    after: &[u32],
    max_tokens: usize,
) -> Request {
    let pre = Arc::new(enc.projector().preprocess(img));
    let (nx, ny) = enc.projector().grid(&pre);
    let mut prompt = before.to_vec();
    // Any ids will do: the image's rows take its embeddings (the chat
    // template's <|image_pad|> by convention).
    prompt.extend(std::iter::repeat_n(0, nx * ny));
    prompt.extend_from_slice(after);
    let mut r = Request::new(prompt, max_tokens);
    r.stop.eog = false;
    r.images = vec![PromptImage {
        at: before.len(),
        pixels: pre,
    }];
    r
}

/// The greedy fixture recorded with this build's kernel set and codegen.
fn exact_greedy_fixture(model_dir: &str) -> Option<serde_json::Value> {
    let dir = fixtures_dir().join(model_dir).join("greedy");
    let (ks, cg) = (KernelSet::current().fingerprint(), codegen());
    std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap())
        .find(|fx: &serde_json::Value| {
            fx["kernel_set"]["fingerprint"].as_str() == Some(ks.as_str())
                && fx["codegen"].as_str() == Some(cg.as_str())
        })
}

/// A greedy fixture's image requests (its text before, the image at the size the
/// preprocessing fixture `pre` records for it, its text after; 32 tokens) and
/// each image's name and recorded tokens.
fn fixture_requests(
    enc: &VisionEncoder,
    fx: &serde_json::Value,
    pre: &str,
) -> (Vec<Request>, Vec<(String, Vec<u32>)>) {
    let pre = fixture(pre);
    let (before, after) = (ids(&fx["tokens_before"]), ids(&fx["tokens_after"]));
    let mut reqs = Vec::new();
    let mut want = Vec::new();
    for im in fx["images"].as_array().unwrap() {
        let name = im["name"].as_str().unwrap();
        let size = pre["images"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap();
        let (w, h) = (
            size["width"].as_u64().unwrap() as u32,
            size["height"].as_u64().unwrap() as u32,
        );
        reqs.push(image_request(enc, &before, &pixels(w, h, 0), &after, 32));
        want.push((name.to_string(), ids(&im["tokens"])));
    }
    (reqs, want)
}

/// The six images of the fixture through the engine (text, image and text in
/// one prompt, computed in the engine's own pieces, positions from the image
/// on as mtmd assigns them), all at once: 32 greedy tokens each as llama.cpp's.
#[test]
fn greedy_after_an_image_matches_llama_cpp() {
    let Some((model, enc)) = setup() else { return };
    let Some(fx) = exact_greedy_fixture("qwen3vl-tiny") else {
        eprintln!(
            "skipping engine image parity: no qwen3vl-tiny greedy fixture for kernel set {} and codegen {}",
            KernelSet::current().short_name(),
            codegen()
        );
        return;
    };
    let (reqs, want) = fixture_requests(&enc, &fx, "qwen3vl-tiny/vision/preprocess.json");
    let mut core = engine(&model, Some(&enc));
    let outs = run_batch(&mut core, reqs);
    for ((name, want), out) in want.iter().zip(&outs) {
        assert_eq!(&out.tokens, want, "image {name}");
    }
    assert_eq!(core.stats().images_encoded_total, 6);
    eprintln!("6 images through the engine: 32 greedy tokens each identical to llama.cpp's");
}

/// An agent re-sends the same image in its history for three turns: the image
/// is encoded once, turns 2 and 3 find it (and the text around it) in the
/// prefix cache and report those tokens as cached, and their answers are those
/// of a fresh engine computing the whole prompt. A different picture of the
/// same size at the same place is encoded and never served from the cache.
#[test]
fn a_resent_image_is_encoded_once_and_cached() {
    let Some((model, enc)) = setup() else { return };
    let fx = fixture("qwen3vl-tiny/greedy/x86_64-avx512.json");
    let (before, after) = (ids(&fx["tokens_before"]), ids(&fx["tokens_after"]));
    // 120×30: 15 × 4 = 60 image tokens after 4 of text, so the first page
    // holds the image.
    let img = pixels(120, 30, 0);
    let mut core = engine(&model, Some(&enc));
    let mut history = Vec::new();
    let mut turns = Vec::new();
    for turn in 0..3 {
        let mut after_turn = after.clone();
        after_turn.extend_from_slice(&history);
        let r = image_request(&enc, &before, &img, &after_turn, 6);
        let prompt = r.prompt.clone();
        let out = run_batch(&mut core, vec![r]).remove(0);
        assert_eq!(out.finish.reason, FinishReason::Length);
        let u = out.finish.usage;
        eprintln!(
            "turn {}: {} prompt tokens, {} cached, {} images encoded",
            turn + 1,
            u.prompt_tokens,
            u.cached_tokens,
            core.stats().images_encoded_total
        );
        if turn == 0 {
            assert_eq!(u.cached_tokens, 0);
        } else {
            assert!(
                u.cached_tokens >= before.len() + 60,
                "turn {}: {} cached tokens do not cover the image",
                turn + 1,
                u.cached_tokens
            );
        }
        // The next turn's history: this answer and the question again.
        history.extend_from_slice(&out.tokens);
        history.extend_from_slice(&after);
        turns.push((prompt, out.tokens));
    }
    assert_eq!(core.stats().images_encoded_total, 1);
    // The cached turns answer as a fresh engine computing everything does.
    for (i, (prompt, tokens)) in turns.iter().enumerate().skip(1) {
        let mut fresh = engine(&model, Some(&enc));
        let mut r = image_request(&enc, &before, &img, &[], 6);
        r.prompt = prompt.clone();
        let out = run_batch(&mut fresh, vec![r]).remove(0);
        assert_eq!(out.finish.usage.cached_tokens, 0);
        assert_eq!(&out.tokens, tokens, "turn {}", i + 1);
    }
    // Another picture of the same size in the same place: not a hit.
    let other = pixels(120, 30, 1);
    let r = image_request(&enc, &before, &other, &after, 6);
    let out = run_batch(&mut core, vec![r]).remove(0);
    assert_eq!(out.finish.usage.cached_tokens, 0);
    assert_eq!(core.stats().images_encoded_total, 2);
}

/// A request decoding while another's large image is being encoded is not held
/// up: it takes its tokens step after step and finishes while the encoder is
/// still at work (the 512×512 image's ViT runs over 16384 patches, seconds on
/// the CPU; the tiny model's 8 decode steps take milliseconds); the image
/// request waits at its image, then finishes too.
#[test]
fn decoding_goes_on_while_an_image_encodes() {
    let Some((model, enc)) = setup() else { return };
    let mut core = engine(&model, Some(&enc));
    let mut text = Request::new(vec![1, 2, 3, 4, 5], 8);
    text.stop.eog = false;
    let mut text = core.submit(text).unwrap();
    // Its prompt is computed and it decodes.
    core.step().unwrap();
    let img = image_request(&enc, &[1, 2], &pixels(512, 512, 7), &[3, 4], 4);
    assert_eq!(img.images[0].pixels.width, 512);
    let mut img = core.submit(img).unwrap();
    let started = std::time::Instant::now();
    let mut text_done = None;
    while core.has_work() {
        core.step().unwrap();
        if text_done.is_none() && !core.requests().iter().any(|r| r.id == text.id()) {
            text_done = Some((started.elapsed(), core.stats().images_encoded_total));
        }
    }
    let (after, encoded) = text_done.unwrap();
    let total = started.elapsed();
    eprintln!("text request done after {after:?} (images encoded then: {encoded}); image request after {total:?}");
    assert_eq!(
        encoded, 0,
        "the decoding request finished only after the encode ({after:?})"
    );
    assert_eq!(collect(&mut text).tokens.len(), 8);
    let out = collect(&mut img);
    assert_eq!(out.finish.reason, FinishReason::Length);
    assert_eq!(core.stats().images_encoded_total, 1);
}

/// `vision_inline` (encodes inside the step, as llama.cpp does) gives the same
/// greedy tokens as encodes on the encoder's thread, and counts the encodes and
/// their time: the running text request waits for each encode instead.
#[test]
fn inline_encodes_give_the_same_tokens() {
    let Some((model, enc)) = setup() else { return };
    let Some((_, enc_inline)) = setup() else {
        return;
    };
    let reqs = |enc: &VisionEncoder| {
        let mut text = Request::new(vec![1, 2, 3, 4, 5], 12);
        text.stop.eog = false;
        vec![
            text,
            image_request(enc, &[1, 2], &pixels(64, 48, 0), &[3, 4], 12),
            image_request(enc, &[1, 2], &pixels(40, 120, 1), &[3, 4], 12),
        ]
    };
    let mut beside = engine(&model, Some(&enc));
    let want = run_batch(&mut beside, reqs(&enc));
    let mut inline = EngineCore::new(
        model.clone(),
        tokenizer(&model),
        EngineConfig {
            threads: 2,
            kv_budget_bytes: Some(64 << 20),
            vision: Some(VisionModel(enc_inline.clone())),
            vision_inline: true,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let got = run_batch(&mut inline, reqs(&enc_inline));
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        assert_eq!(w.tokens, g.tokens, "request {i}");
    }
    let s = inline.stats();
    assert_eq!(s.images_encoded_total, 2);
    assert!(s.image_encode_seconds_total > 0.0);
}

/// Text requests keep decoding while an image request is admitted with them,
/// and both finish.
#[test]
fn text_and_image_requests_share_steps() {
    let Some((model, enc)) = setup() else { return };
    let mut core = engine(&model, Some(&enc));
    let mut text = Request::new(vec![1, 2, 3, 4, 5], 12);
    text.stop.eog = false;
    let img = image_request(&enc, &[1, 2], &pixels(64, 48, 0), &[3, 4], 12);
    let outs = run_batch(&mut core, vec![text, img]);
    for o in &outs {
        assert_eq!(o.finish.reason, FinishReason::Length);
        assert_eq!(o.tokens.len(), 12);
    }
}

/// Images for an engine without an encoder, or placed outside the prompt, or
/// not preprocessed for the encoder, are refused at submission with a message
/// naming the problem.
#[test]
fn malformed_image_requests_are_refused() {
    let Some((model, enc)) = setup() else { return };
    let bad = |core: &mut EngineCore, r: Request| match core.submit(r) {
        Err(SubmitError::BadRequest(m)) => m,
        Err(e) => panic!("expected a bad request, got {e:?}"),
        Ok(_) => panic!("expected a bad request, it was accepted"),
    };
    let img = pixels(64, 48, 0);
    let mut text_only = engine(&model, None);
    let m = bad(&mut text_only, image_request(&enc, &[1], &img, &[2], 4));
    assert!(m.contains("takes no images"), "{m}");

    let mut core = engine(&model, Some(&enc));
    let mut r = image_request(&enc, &[1], &img, &[2], 4);
    r.prompt.truncate(10);
    let m = bad(&mut core, r);
    assert!(m.contains("leave the prompt of 10 tokens"), "{m}");
    let mut r = image_request(&enc, &[1], &img, &[2], 4);
    let second = r.images[0].clone();
    r.images.push(second);
    let m = bad(&mut core, r);
    assert!(m.contains("overlap another image"), "{m}");
    let mut r = image_request(&enc, &[1], &img, &[2], 4);
    let mut pre = (*r.images[0].pixels).clone();
    pre.width -= 1;
    r.images[0].pixels = Arc::new(pre);
    let m = bad(&mut core, r);
    assert!(m.contains("not preprocessed for the encoder"), "{m}");
}

/// The Gemma 4 vision fixtures (scripts/fixtures/vision_fixtures_gemma4.py)
/// through the engine: `model_dir`'s six images, each request's text, image and
/// text in the engine's own pieces (the image computed whole: its rows attend
/// to each other on sliding layers, and the longest, 1102 tokens, exceeds a
/// step's budget), positions one per token; as the text parity test for Gemma
/// 4, one full cache (`swa_full`) and decode rows through flash attention
/// (`flash_decode`), as llama.cpp's. Each request alone on a fresh engine (as
/// llama-server's one slot ran it): 32 greedy tokens identical to
/// llama-server's. Then all six at once, against alone as the text parity test
/// checks batching (tests/parity.rs `check_batched`, [`batched_limit`]): top-1
/// log-probabilities within the limit, tokens identical except where a request
/// leaves a near-tie of its run alone the other way (gemma4moe-tiny with AVX2
/// kernels: image c, step 30).
fn gemma4_greedy_through_the_engine(model_dir: &str) {
    let Some(model) = load(&format!("{model_dir}.gguf")) else {
        return;
    };
    let Some(mmproj) = model_path("mmproj-gemma4-tiny.gguf") else {
        return;
    };
    let enc =
        Arc::new(VisionEncoder::new(Projector::open(mmproj).unwrap(), Device::cpu(), 1).unwrap());
    let Some(fx) = exact_greedy_fixture(&format!("{model_dir}/vision")) else {
        eprintln!(
            "skipping engine image parity: no {model_dir} vision fixture for kernel set {} and codegen {}",
            KernelSet::current().short_name(),
            codegen()
        );
        return;
    };
    let requests = || {
        let (mut reqs, want) = fixture_requests(&enc, &fx, "gemma4-tiny/vision/preprocess.json");
        for r in &mut reqs {
            r.top_logprobs = 2;
        }
        (reqs, want)
    };
    let config = EngineConfig {
        threads: 2,
        kv_budget_bytes: Some(256 << 20),
        swa_full: true,
        flash_decode: true,
        vision: Some(VisionModel(enc.clone())),
        ..EngineConfig::default()
    };
    let engine = || EngineCore::new(model.clone(), tokenizer(&model), config.clone()).unwrap();
    let (reqs, want) = requests();
    let mut alone = Vec::new();
    for (r, (name, want)) in reqs.into_iter().zip(&want) {
        let out = run_batch(&mut engine(), vec![r]).remove(0);
        assert_eq!(&out.tokens, want, "{model_dir}, image {name} alone");
        alone.push(out);
    }
    eprintln!(
        "{model_dir}: 6 images through the engine one at a time, 32 greedy tokens each identical to llama.cpp's"
    );
    let mut core = engine();
    let outs = run_batch(&mut core, requests().0);
    assert_eq!(core.stats().images_encoded_total, 6);
    let limit = batched_limit(model_dir);
    let mut report = Batched::default();
    for (((name, _), alone), batched) in want.iter().zip(&alone).zip(&outs) {
        report.compare(&format!("image {name}"), alone, batched, limit);
    }
    eprintln!(
        "{model_dir}: the 6 batched, top-1 logprobs within {:.3e} of alone (limit {limit}); \
         runs that left a near-tie the other way (image, step, margin): {:?}",
        report.worst, report.ties
    );
    assert!(
        report.problems.is_empty(),
        "{model_dir}: {:#?}",
        report.problems
    );
}

#[test]
fn gemma4_greedy_after_an_image_matches_llama_cpp() {
    gemma4_greedy_through_the_engine("gemma4-tiny");
}

#[test]
fn gemma4moe_greedy_after_an_image_matches_llama_cpp() {
    gemma4_greedy_through_the_engine("gemma4moe-tiny");
}
