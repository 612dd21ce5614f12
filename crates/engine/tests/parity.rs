//! Greedy generation matches llama.cpp's, token for token, on the real models
//! (fixtures recorded by scripts/fixtures/make_fixtures.py with llama-server's
//! defaults), and a sequence yields the same tokens alone as batched with three others.

mod common;

use common::*;
use tempo9_engine::sampler::SamplingParams;
use tempo9_engine::{Engine, EngineConfig, GenRequest};
use tempo9_tokenizer::Tokenizer;

const N_GEN: usize = 64;
/// Log-probabilities come from the same ggml kernels as llama.cpp's; allow rounding only.
const LOGPROB_TOL: f32 = 2e-3;

/// Greedy with end-of-generation tokens banned: llama.cpp's `ignore_eos`, as in the fixtures.
fn greedy(prompt: Vec<u32>, top: usize, eog: &[u32]) -> GenRequest {
    GenRequest {
        prompt,
        max_tokens: N_GEN,
        sampling: SamplingParams::default(),
        stop_at_eog: false,
        top_logprobs: top,
        banned_tokens: eog.to_vec(),
    }
}

/// Checks one model: every fixture case alone, then (if `check_batched`) in batches of four.
fn check_model(dir: &str, file: &str, check_batched: bool) {
    let Some(model) = load(file) else { return };
    let eog = Tokenizer::from_gguf(model.gguf())
        .expect("tokenizer")
        .eog_tokens();
    let cfg = EngineConfig {
        threads: 2,
        kv_cells: 4096,
        max_seqs: 4,
        step_tokens: 512,
    };
    let mut engine = Engine::new(model, cfg).expect("engine");
    let fx = fixture(&format!("{dir}/greedy.json"));
    let cases = fx["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10, "{dir}: need at least 10 fixture prompts");
    let never = |_: u32| false;
    let mut solo: Vec<tempo9_engine::GenOutput> = Vec::new();
    let mut problems = Vec::new();
    let mut worst = 0f32;
    for c in cases {
        let name = c["name"].as_str().unwrap_or("?");
        let want = ids(&c["tokens"]);
        let out = engine
            .generate(
                &[greedy(ids(&c["prompt_ids"]), 8, &eog)],
                &never,
                &mut |_, _| true,
            )
            .unwrap();
        let got = &out[0].tokens;
        if got != &want {
            let at = got
                .iter()
                .zip(&want)
                .position(|(a, b)| a != b)
                .unwrap_or(want.len().min(got.len()));
            problems.push(format!("{name}: tokens differ from llama.cpp at step {at}"));
        }
        // The raw distribution agrees at every step llama.cpp reported one.
        for (step, top) in c["top"].as_array().expect("top").iter().enumerate() {
            let Some(top) = top.as_array() else { continue };
            let Some(ours) = out[0].top_logprobs.get(step) else {
                break;
            };
            let (id, lp) = (
                top[0][0].as_u64().unwrap() as u32,
                top[0][1].as_f64().unwrap() as f32,
            );
            if ours[0].0 != id {
                problems.push(format!(
                    "{name}: step {step} top-1 is {} (llama.cpp {id})",
                    ours[0].0
                ));
                break;
            }
            worst = worst.max((ours[0].1 - lp).abs());
        }
        solo.push(out[0].clone());
    }
    eprintln!(
        "{dir}: {} cases, max |top-1 logprob difference| = {worst:.2e}",
        cases.len()
    );
    assert!(problems.is_empty(), "{dir}: {problems:#?}");
    assert!(
        worst < LOGPROB_TOL,
        "{dir}: top-1 logprobs differ by up to {worst}"
    );

    if !check_batched {
        return;
    }
    // Batched with three others (mixed prompt lengths, so prefill chunks and decodes
    // share steps): each sequence attends only over its own KV window, so it must
    // produce exactly the tokens it produced alone.
    for chunk in (0..cases.len()).collect::<Vec<_>>().chunks(4) {
        let reqs: Vec<GenRequest> = chunk
            .iter()
            .map(|&i| greedy(ids(&cases[i]["prompt_ids"]), 0, &eog))
            .collect();
        let out = engine.generate(&reqs, &never, &mut |_, _| true).unwrap();
        for (k, &i) in chunk.iter().enumerate() {
            assert_eq!(
                out[k].tokens, solo[i].tokens,
                "{dir}: case {i} batched with {chunk:?} differs from alone"
            );
        }
    }
}

#[test]
fn smollm2_matches_llama_cpp_alone_and_batched() {
    check_model(MODELS[0].0, MODELS[0].1, true);
}

#[test]
fn qwen2_5_coder_matches_llama_cpp() {
    check_model(MODELS[1].0, MODELS[1].1, false);
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model(MODELS[2].0, MODELS[2].1, false);
}

// Models with Q4_K weights use ggml's repacked CPU layout (as llama.cpp does by
// default, and as the llama.cpp fixtures require). Its matmul sends row groups of
// four through a gemm kernel and the remaining rows through gemv, and the two round
// differently (top-1 log-probabilities drift by up to ~0.3 nats over 64 steps), so a
// sequence batched with others can leave a near-tie differently than alone.
// llama.cpp with -np 4 behaves the same. Exact batch invariance with repacked weights
// is open work of the engine-core issue.
#[test]
#[ignore = "ggml CPU_REPACK gemm/gemv rounding differs between batched and single rows"]
fn qwen2_5_coder_batched_equals_alone() {
    check_model(MODELS[1].0, MODELS[1].1, true);
}

#[test]
#[ignore = "ggml CPU_REPACK gemm/gemv rounding differs between batched and single rows"]
fn gemma3_batched_equals_alone() {
    check_model(MODELS[2].0, MODELS[2].1, true);
}
