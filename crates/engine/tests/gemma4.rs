//! Gemma 4's cache layout on the synthetic `gemma4-tiny` file (3 of its 6 layers
//! read earlier layers' K/V): the KV-sharing layers own no cells, the sliding and
//! full layers keep rows of their own widths, and a repeated prompt is served
//! from the prefix cache with the output of a fresh engine, bit for bit.

mod common;

use std::sync::Arc;

use common::*;
use tempo9_engine::{EngineConfig, EngineCore, Request};
use tempo9_models::{GroupKind, Model};
use tempo9_tokenizer::Tokenizer;

fn gemma4_tiny() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let model = load(SYNTH_MODELS[7].1)?;
    let tok = tokenizer(&model);
    Some((model, tok))
}

fn core(model: &Arc<Model>, tok: &Arc<Tokenizer>) -> EngineCore {
    let cfg = EngineConfig {
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        ..EngineConfig::default()
    };
    EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine")
}

fn request(prompt: Vec<u32>, n: usize) -> Request {
    let mut r = Request::new(prompt, n);
    r.stop.eog = false;
    r.logprobs = true;
    r.top_logprobs = 4;
    r
}

#[test]
fn kv_sharing_layers_own_no_cells() {
    let Some((model, _)) = gemma4_tiny() else {
        return;
    };
    let hp = model.hparams();
    // Layers 0, 1, 3, 4 slide (window 128), 2 and 5 attend fully; 3 and 4 read
    // layer 1's K/V, 5 reads layer 2's.
    assert_eq!(hp.kv_source, [0, 1, 2, 1, 1, 2]);
    let groups = model.cache_groups(false);
    assert_eq!(groups.len(), 2);
    assert_eq!(
        (groups[0].kind.clone(), groups[0].layers.clone()),
        (GroupKind::Full, vec![2])
    );
    assert_eq!(groups[1].kind, GroupKind::Sliding { window: 128 });
    assert_eq!(groups[1].layers, [0, 1]);
    // Per-layer widths: sliding 2 KV heads of 32, full 1 of 64.
    assert_eq!((hp.n_embd_k_of(0), hp.n_embd_k_of(2)), (64, 64));
    assert_eq!((hp.head_dim_of(0), hp.head_dim_of(2)), (32, 64));
    assert_eq!((hp.n_head_kv_of(0), hp.n_head_kv_of(2)), (2, 1));
    let kv = model.new_kv(&groups, &[256, 256]).expect("kv store");
    // A page of the full group holds layer 2's rows only; of the sliding group,
    // layers 0 and 1's (F16 K and V).
    assert_eq!(kv.cells_bytes(0, 64), 64 * (64 + 64) * 2);
    assert_eq!(kv.cells_bytes(1, 64), 64 * 2 * (64 + 64) * 2);
    // The sharing layers read their source's pools.
    assert_eq!(kv.k(4).name(), kv.k(1).name());
    assert_eq!(kv.v(5).name(), kv.v(2).name());
    let swa_full = model.cache_groups(true);
    assert_eq!(swa_full.len(), 1);
    assert_eq!(swa_full[0].layers, [0, 1, 2]);
}

#[test]
fn a_repeated_prompt_hits_the_prefix_cache_with_identical_output() {
    let Some((model, tok)) = gemma4_tiny() else {
        return;
    };
    let mut rng = Rng(0x6e44_0001);
    // Longer than the sliding window, so the cached pages include slid-out ones.
    let prompt: Vec<u32> = (0..700).map(|_| 100 + rng.below(20_000) as u32).collect();
    let mut eng = core(&model, &tok);
    let first = run_batch(&mut eng, vec![request(prompt.clone(), 24)]).remove(0);
    assert_eq!(first.finish.usage.cached_tokens, 0);
    let again = run_batch(&mut eng, vec![request(prompt.clone(), 24)]).remove(0);
    let cached = again.finish.usage.cached_tokens;
    assert!(
        cached >= 640,
        "cached {cached} of {} prompt tokens",
        prompt.len()
    );
    let fresh = run_batch(&mut core(&model, &tok), vec![request(prompt, 24)]).remove(0);
    for (what, o) in [("first", &first), ("repeat", &again)] {
        assert_eq!(o.tokens, fresh.tokens, "{what}: tokens");
        assert_eq!(
            o.top_logprobs, fresh.top_logprobs,
            "{what}: top log-probabilities"
        );
    }
}

/// The sliding layers' own pages (a window of recycled cells) compute what one
/// full cache with a sliding mask computes, bit for bit, on decode steps past the
/// window, when flash attention visits the same cells in the same order: on one
/// thread (on two, ggml splits a decode over 512 or more cells between the
/// threads, and the full cache's longer window is split elsewhere than the
/// sliding pages' short one: the parity test's `flash_decode` note says how far
/// that rounding moves this file's numbers).
#[test]
fn sliding_pages_decode_as_one_full_cache_does() {
    let Some((model, tok)) = gemma4_tiny() else {
        return;
    };
    let mut rng = Rng(0x6e44_0002);
    // 303 prompt tokens (the window is 128), then 48 decode steps.
    let prompt: Vec<u32> = (0..303).map(|_| 100 + rng.below(20_000) as u32).collect();
    let run = |swa_full: bool| {
        let cfg = EngineConfig {
            threads: 1,
            kv_budget_bytes: Some(64 << 20),
            swa_full,
            flash_decode: true,
            ..EngineConfig::default()
        };
        let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine");
        run_batch(&mut eng, vec![request(prompt.clone(), 48)]).remove(0)
    };
    let (pages, full) = (run(false), run(true));
    assert_eq!(pages.tokens, full.tokens, "tokens");
    assert_eq!(
        pages.top_logprobs, full.top_logprobs,
        "top log-probabilities"
    );
}
