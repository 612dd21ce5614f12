//! The engine core on a real model (SmolLM2-135M): greedy outputs do not depend on
//! batching, the prefix cache or preemption; random workloads keep the page
//! accounting sound; long prompts are chunked without stalling decodes;
//! cancellation and stop strings behave.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use tempo9_engine::{
    EngineConfig, EngineCore, Event, FinishReason, Policy, Request, RequestStream,
};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn smollm2() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let model = load(MODELS[0].1)?;
    let tok = tokenizer(&model);
    Some((model, tok))
}

/// Two threads and `kv_bytes` of KV memory; defaults otherwise.
fn config(kv_bytes: usize) -> EngineConfig {
    EngineConfig {
        // Outputs are compared bit for bit across batch compositions.
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(kv_bytes),
        ..EngineConfig::default()
    }
}

fn core(model: &Arc<Model>, tok: &Arc<Tokenizer>, kv_bytes: usize) -> EngineCore {
    EngineCore::new(model.clone(), tok.clone(), config(kv_bytes)).expect("engine")
}

fn greedy(prompt: Vec<u32>, n: usize) -> Request {
    let mut r = Request::new(prompt, n);
    r.stop.eog = false;
    r
}

/// Chat prompts: four share a long system prompt (their decodes see more than 256
/// cells, so they attend through matmuls on the CPU: `MATMUL_DECODE_ABOVE`), four
/// are unrelated; lengths vary.
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    let system = "You are a careful coding assistant working in a large Rust repository. \
        Follow the project's style, explain briefly, and prefer small diffs. "
        .repeat(12);
    let questions = [
        "How do I read a file into a string?",
        "Write a function that reverses a vector in place.",
        "What is the difference between Rc and Arc?",
        "Explain lifetimes in one paragraph.",
        "Name three prime numbers.",
        "Translate 'good morning' to French.",
        "What is 12 times 12?",
        "Write a haiku about the sea.",
    ];
    questions
        .iter()
        .enumerate()
        .map(|(i, q)| {
            let text = if i < 4 {
                format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
            } else {
                format!("<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")
            };
            tok.encode(&text, true, true)
        })
        .collect()
}

const N_GEN: usize = 32;

/// The three real models with their tokenizers, loaded one at a time (stops early
/// where a model is missing and TEMPO9_SKIP_MODEL_TESTS=1).
fn real_models() -> impl Iterator<Item = (&'static str, Arc<Model>, Arc<Tokenizer>)> {
    MODELS.iter().map_while(|&(_, file)| {
        let model = load(file)?;
        let tok = tokenizer(&model);
        Some((file, model, tok))
    })
}

/// A greedy request for `n` tokens that reports its top-4 logprobs (to compare
/// numbers bit for bit, not just tokens).
fn with_logprobs(prompt: &[u32], n: usize) -> Request {
    let mut r = greedy(prompt.to_vec(), n);
    r.logprobs = true;
    r.top_logprobs = 4;
    r
}

/// Asserts that `got` has the tokens and top log-probabilities of `alone`, bit for bit.
fn same_as_alone(file: &str, name: &str, got: &Output, alone: &Output) {
    assert_eq!(got.tokens, alone.tokens, "{file}: {name}'s tokens");
    assert_eq!(
        got.top_logprobs, alone.top_logprobs,
        "{file}: {name}'s logprobs"
    );
}

#[test]
fn same_tokens_alone_batched_warm_and_preempted() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let ps = prompts(&tok);
    // Alone: a fresh engine (cold cache) per request.
    let alone: Vec<Output> = ps
        .iter()
        .map(|p| {
            run_batch(
                &mut core(&model, &tok, 64 << 20),
                vec![greedy(p.clone(), N_GEN)],
            )
            .remove(0)
        })
        .collect();
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(a.tokens.len(), N_GEN, "prompt {i}: {:?}", a.finish);
        assert_eq!(a.finish.usage.cached_tokens, 0);
    }

    // Among seven others: identical tokens.
    let mut shared = core(&model, &tok, 64 << 20);
    let out = run_batch(
        &mut shared,
        ps.iter().map(|p| greedy(p.clone(), N_GEN)).collect(),
    );
    for (i, (o, a)) in out.iter().zip(&alone).enumerate() {
        assert_eq!(o.tokens, a.tokens, "batched: prompt {i} differs from alone");
    }

    // Warm prefix cache: prompt pages are served from the cache (every whole page
    // that leaves 16 tokens or more to compute), then the 16-token blocks the first
    // run computed exactly in the next page are copied (that page stayed cached: as
    // a whole page if the answer filled it, else as a partial entry), and the outputs
    // are identical.
    let warm = run_batch(
        &mut shared,
        ps.iter().map(|p| greedy(p.clone(), N_GEN)).collect(),
    );
    let cached: usize = warm.iter().map(|o| o.finish.usage.cached_tokens).sum();
    let want: usize = ps
        .iter()
        .map(|p| {
            let n = p.len();
            let pages = n.saturating_sub(16) / 64 * 64;
            let exact = n / 16 * 16;
            // A copy leaves a 16-token block to compute, as a hit does.
            let copy = if exact > pages && exact < pages + 64 {
                (exact - pages).min(n - pages - 16) / 16 * 16
            } else {
                0
            };
            pages + copy
        })
        .sum();
    assert_eq!(cached, want, "warm: cached prompt tokens");
    assert!(cached > 0);
    for (i, (o, a)) in warm.iter().zip(&alone).enumerate() {
        assert_eq!(o.tokens, a.tokens, "warm: prompt {i} differs from alone");
    }
    let st = shared.stats();
    assert_eq!(st.kv_pages_used, 0, "idle engine holds no pages: {st:?}");

    // Preempted: the pool holds 8 pages (a long prompt needs 6), so later requests
    // are preempted (their KV dropped) and recomputed when memory frees up.
    let page_bytes = shared.stats().page_bytes;
    let mut tight = core(&model, &tok, 8 * page_bytes);
    let out = run_batch(
        &mut tight,
        ps.iter().map(|p| greedy(p.clone(), N_GEN)).collect(),
    );
    let preempted: u32 = out.iter().map(|o| o.finish.usage.preemptions).sum();
    assert!(preempted > 0, "the tight pool should force preemption");
    for (i, (o, a)) in out.iter().zip(&alone).enumerate() {
        assert_eq!(
            o.tokens, a.tokens,
            "preempted run: prompt {i} differs from alone"
        );
    }
    eprintln!("preempted run: {preempted} preemptions, all outputs identical to alone");
}

/// A pool smaller than a sequence's padded attention window (384 cells for a
/// window of 512) caps the window at the pool: the request runs, as it would in a
/// large pool.
#[test]
fn a_pool_smaller_than_the_padded_window_caps_it() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let prompt = prompts(&tok).remove(0);
    assert!(
        prompt.len() > 256 && prompt.len() + 16 <= 384,
        "{}",
        prompt.len()
    );
    let big = run_batch(
        &mut core(&model, &tok, 64 << 20),
        vec![greedy(prompt.clone(), 16)],
    );
    let page_bytes = core(&model, &tok, 64 << 20).stats().page_bytes;
    let small = run_batch(
        &mut core(&model, &tok, 6 * page_bytes),
        vec![greedy(prompt, 16)],
    );
    assert_eq!(small[0].tokens.len(), 16, "{:?}", small[0].finish);
    assert_eq!(small[0].tokens, big[0].tokens);
}

/// Which of two requests submitted together gets its first token first, under
/// `policy`: 0 for the long prompt (submitted first), 1 for the short one.
fn first_served(model: &Arc<Model>, tok: &Arc<Tokenizer>, policy: Policy) -> usize {
    let cfg = EngineConfig {
        // Outputs are compared bit for bit across batch compositions.
        deterministic: true,
        policy,
        ..config(64 << 20)
    };
    let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine");
    let long: Vec<u32> = (0..1100u32).map(|i| 300 + i % 4000).collect();
    let short: Vec<u32> = (0..100u32).map(|i| 5000 + i).collect();
    let mut streams = [
        eng.submit(greedy(long, 2)).unwrap(),
        eng.submit(greedy(short, 2)).unwrap(),
    ];
    loop {
        assert!(eng.step().expect("step"), "engine went idle");
        for (i, st) in streams.iter_mut().enumerate() {
            if let Some(Event::Token(_)) = st.try_recv() {
                return i;
            }
        }
    }
}

/// FCFS serves the long prompt that came first; `shortest` serves the short one
/// that came with it first (its estimated completion is earlier).
#[test]
fn shortest_policy_serves_the_short_prompt_first() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    assert_eq!(first_served(&model, &tok, Policy::Fcfs), 0);
    assert_eq!(first_served(&model, &tok, Policy::Shortest), 1);
}

/// Random arrivals, prompt lengths (half of them under a chunk, so short prompts copy
/// part of a page from each other), shared prefixes and cancellations on a small
/// pool (so pages are evicted and requests preempted). After every step the page
/// invariants hold; every request that was not cancelled produces exactly its
/// alone output (nobody read another's pages); idle, the pool holds nothing.
#[test]
fn random_workloads_keep_pages_sound() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let n_vocab = model.hparams().n_vocab as u64;
    let page_bytes = core(&model, &tok, 64 << 20).stats().page_bytes;
    let mut alone_cache: std::collections::HashMap<Vec<u32>, Vec<u32>> = Default::default();
    let (mut preemptions, mut evictions, mut hits, mut copied) = (0, 0, 0, 0);
    for seed in 1..=3u64 {
        let mut rng = Rng(0x2545_F491_4F6C_DD1D ^ seed.wrapping_mul(0x9E37_79B9));
        let prefixes: Vec<Vec<u32>> = (0..3)
            .map(|_| {
                (0..40 + rng.below(150))
                    .map(|_| 1 + rng.below(n_vocab - 1) as u32)
                    .collect()
            })
            .collect();
        // Six pages: a few requests' worth, so the cache evicts and requests preempt.
        // Chunks of at most 128 tokens and no ITL target: a schedule that does not
        // depend on how fast this machine is.
        let cfg = EngineConfig {
            // Outputs are compared bit for bit across batch compositions.
            deterministic: true,
            step_tokens: 128,
            itl_target: None,
            ..config(6 * page_bytes)
        };
        let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine");
        let mut live: Vec<(Vec<u32>, RequestStream, Vec<u32>, bool)> = Vec::new();
        let mut done: Vec<(Vec<u32>, Vec<u32>, FinishReason)> = Vec::new();
        let mut submitted = 0;
        let mut steps = 0;
        while submitted < 14 || eng.has_work() {
            if submitted < 14 && rng.below(3) == 0 {
                let mut p = prefixes[rng.below(3) as usize].clone();
                if rng.below(2) == 0 {
                    p.truncate(1 + rng.below(p.len() as u64) as usize);
                    p.extend((0..rng.below(40)).map(|_| 1 + rng.below(n_vocab - 1) as u32));
                } else {
                    // A prompt under a chunk: shares part of a page with its kin.
                    p.truncate(16 + rng.below(32) as usize);
                    p.extend((0..rng.below(12)).map(|_| 1 + rng.below(n_vocab - 1) as u32));
                }
                let s = eng.submit(greedy(p.clone(), 8)).expect("submit");
                live.push((p, s, Vec::new(), false));
                submitted += 1;
            }
            if !live.is_empty() && rng.below(12) == 0 {
                let k = rng.below(live.len() as u64) as usize;
                live[k].1.cancel();
                live[k].3 = true;
            }
            eng.step().expect("step");
            steps += 1;
            eng.check_invariants()
                .unwrap_or_else(|e| panic!("seed {seed} step {steps}: {e}"));
            let mut k = 0;
            while k < live.len() {
                let mut fin = None;
                while let Some(ev) = live[k].1.try_recv() {
                    match ev {
                        Event::Token(t) => live[k].2.push(t.id),
                        Event::Finished(f) => fin = Some(f.reason),
                    }
                }
                if let Some(reason) = fin {
                    let (p, _, toks, cancelled) = live.remove(k);
                    if cancelled {
                        assert!(matches!(
                            reason,
                            FinishReason::Cancelled | FinishReason::Length
                        ));
                    } else {
                        done.push((p, toks, reason));
                    }
                } else {
                    k += 1;
                }
            }
            assert!(steps < 10_000, "seed {seed}: no progress");
        }
        assert!(live.is_empty(), "every stream finished");
        let st = eng.stats();
        assert_eq!(
            (st.running, st.waiting, st.kv_pages_used),
            (0, 0, 0),
            "{st:?}"
        );
        assert_eq!(st.kv_pages_free + st.kv_pages_cached, st.kv_pages_total);
        for (p, toks, reason) in done {
            assert_eq!(reason, FinishReason::Length);
            let want = alone_cache.entry(p.clone()).or_insert_with(|| {
                run_batch(
                    &mut core(&model, &tok, 64 << 20),
                    vec![greedy(p.clone(), 8)],
                )
                .remove(0)
                .tokens
            });
            assert_eq!(
                &toks, want,
                "seed {seed}: a request's output depends on its neighbours"
            );
        }
        eprintln!("seed {seed}: {steps} steps, {st:?}");
        preemptions += st.preemptions_total;
        evictions += st.evicted_pages;
        hits += st.prefix_hit_tokens;
        copied += st.prefix_copied_tokens;
    }
    assert!(
        preemptions > 0 && evictions > 0 && hits > 0 && copied > 0,
        "the workloads should exercise preemption ({preemptions}), eviction ({evictions}), prefix hits ({hits}) and short-prompt copies ({copied})"
    );
}

/// While a long prompt is prefilled in chunks, requests already decoding get a
/// token at every step.
#[test]
fn long_prefill_does_not_stall_decodes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    // Without an ITL target the 2000-token prompt goes in chunks of up to 512; with
    // a 1 ms target, once a step has measured the cost per token, in chunks of 64.
    for (itl_target, steps) in [(None, 4..=5), (Some(Duration::from_millis(1)), 24..=40)] {
        let cfg = EngineConfig {
            // Outputs are compared bit for bit across batch compositions.
            deterministic: true,
            itl_target,
            ..config(256 << 20)
        };
        let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine");
        let short = tok.encode(
            "<|im_start|>user\nCount to ten.<|im_end|>\n<|im_start|>assistant\n",
            true,
            true,
        );
        let mut decoders: Vec<RequestStream> = (0..3)
            .map(|_| eng.submit(greedy(short.clone(), 60)).unwrap())
            .collect();
        // Let them reach decoding.
        eng.step().unwrap();
        for s in &mut decoders {
            assert!(matches!(s.try_recv(), Some(Event::Token(_))));
        }
        let long: Vec<u32> = (0..2000u32).map(|i| 100 + i % 5000).collect();
        let mut big = eng.submit(greedy(long, 1)).unwrap();
        let mut prefill_steps = 0;
        loop {
            eng.step().unwrap();
            prefill_steps += 1;
            for (k, s) in decoders.iter_mut().enumerate() {
                assert!(
                    matches!(s.try_recv(), Some(Event::Token(_))),
                    "decoder {k} got no token in prefill step {prefill_steps}"
                );
            }
            if let Some(Event::Token(_)) = big.try_recv() {
                break;
            }
        }
        assert!(
            steps.contains(&prefill_steps),
            "ITL target {itl_target:?}: prefill took {prefill_steps} steps, expected {steps:?}"
        );
        eng.run_until_idle().unwrap();
    }
}

/// Steps until every stream has its first token.
fn steps_to_first_tokens(eng: &mut EngineCore, streams: &mut [RequestStream]) -> usize {
    let mut got = vec![false; streams.len()];
    let mut steps = 0;
    while !got.iter().all(|&g| g) {
        eng.step().unwrap();
        steps += 1;
        for (g, s) in got.iter_mut().zip(streams.iter_mut()) {
            *g |= matches!(s.try_recv(), Some(Event::Token(_)));
        }
    }
    steps
}

#[test]
fn a_prompt_alone_takes_solo_steps() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let engine = |solo_step_tokens| {
        let cfg = EngineConfig {
            // Outputs are compared bit for bit across batch compositions.
            deterministic: true,
            step_tokens: 128,
            solo_step_tokens,
            itl_target: None,
            ..config(256 << 20)
        };
        EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine")
    };
    let prompt = |k: u32| {
        (0..1000u32)
            .map(|i| 100 + (i * 7 + k) % 5000)
            .collect::<Vec<u32>>()
    };
    // Alone: 512-token steps (2 for 1000 tokens) instead of 128-token ones (8), and
    // the same greedy tokens either way.
    let mut outs = Vec::new();
    for (solo, want) in [(512, 2), (128, 8)] {
        let mut eng = engine(solo);
        let mut s = [eng.submit(greedy(prompt(0), 8)).unwrap()];
        assert_eq!(steps_to_first_tokens(&mut eng, &mut s), want, "solo {solo}");
        eng.run_until_idle().unwrap();
        let [mut s] = s;
        outs.push(collect(&mut s).tokens);
    }
    assert_eq!(outs[0], outs[1]);
    // Two prompts together: 128-token steps, the solo size only once one is done.
    let mut eng = engine(512);
    let mut two = [
        eng.submit(greedy(prompt(1), 8)).unwrap(),
        eng.submit(greedy(prompt(2), 8)).unwrap(),
    ];
    let steps = steps_to_first_tokens(&mut eng, &mut two);
    assert!(steps >= 15, "two prompts took {steps} steps");
    eng.run_until_idle().unwrap();
    // Three arriving together with one 1000-token prefix: the two that wait for the
    // first one's prefix do not keep it from solo steps (2), then both tails (1).
    let mut eng = engine(512);
    let shared = |k: u32| {
        let mut p = prompt(3);
        p.extend((0..40u32).map(|i| 200 + k * 50 + i));
        p
    };
    let mut three: Vec<RequestStream> = (0..3)
        .map(|k| eng.submit(greedy(shared(k), 8)).unwrap())
        .collect();
    let steps = steps_to_first_tokens(&mut eng, &mut three);
    assert!(steps <= 4, "a shared prefix took {steps} steps");
    eng.run_until_idle().unwrap();
}

#[test]
fn requests_arriving_together_compute_a_shared_prefix_once() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    // Four agents send a ~700-token system prompt at the same moment.
    let system = "You are a coding agent. Use the tools to read, edit and test files; keep diffs \
        small and explain each change in one sentence. "
        .repeat(24);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            tok.encode(
                &format!("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nTask {i}: list the files.<|im_end|>\n<|im_start|>assistant\n"),
                true,
                true,
            )
        })
        .collect();
    let n_prompt = prompts[0].len();
    assert!(n_prompt > 600, "system prompt too short: {n_prompt}");
    let mut eng = core(&model, &tok, 256 << 20);
    let outs = run_batch(
        &mut eng,
        prompts.iter().map(|p| greedy(p.clone(), 8)).collect(),
    );
    let cached: Vec<usize> = outs.iter().map(|o| o.finish.usage.cached_tokens).collect();
    // One request computes the shared pages; the others wait for them and hit.
    assert_eq!(
        cached.iter().filter(|&&c| c == 0).count(),
        1,
        "cached {cached:?}"
    );
    assert!(
        cached.iter().filter(|&&c| c >= n_prompt - 128).count() == 3,
        "cached {cached:?} of {n_prompt}"
    );
    let computed = eng.stats().computed_tokens_total as usize;
    assert!(
        computed < n_prompt + 3 * 128 + 4 * 8,
        "computed {computed} tokens for 4 x {n_prompt}"
    );
    // Same tokens as each request alone.
    for (p, o) in prompts.iter().zip(&outs) {
        let mut fresh = core(&model, &tok, 64 << 20);
        let alone = run_batch(&mut fresh, vec![greedy(p.clone(), 8)]);
        assert_eq!(alone[0].tokens, o.tokens);
    }
}

#[test]
fn cancel_frees_pages_at_next_step_and_stop_strings_cut_text() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let mut eng = core(&model, &tok, 64 << 20);
    let p = tok.encode("<|im_start|>user\nCount from 1 to 20, separated by commas.<|im_end|>\n<|im_start|>assistant\n", true, true);
    let mut s = eng.submit(greedy(p.clone(), 200)).unwrap();
    for _ in 0..3 {
        eng.step().unwrap();
    }
    assert!(eng.stats().kv_pages_used > 0);
    drop(s);
    eng.step().unwrap();
    assert_eq!(
        eng.stats().kv_pages_used,
        0,
        "a dropped stream's pages are released"
    );
    assert!(!eng.has_work());

    // Stop strings: the full output, then the same request stopped at a string in it.
    let full = run_batch(&mut eng, vec![greedy(p.clone(), 40)]).remove(0);
    assert!(full.text.len() > 12, "need some text: {:?}", full.text);
    let cut = full
        .text
        .char_indices()
        .nth(full.text.chars().count() / 2)
        .unwrap()
        .0;
    let stop: String = full.text[cut..].chars().take(3).collect();
    let mut r = greedy(p, 40);
    r.stop.strings = vec![stop.clone()];
    s = eng.submit(r).unwrap();
    eng.run_until_idle().unwrap();
    let out = collect(&mut s);
    let at = full.text.find(&stop).unwrap();
    assert_eq!(
        out.text,
        full.text[..at],
        "text ends right before the stop string"
    );
    assert_eq!(out.finish.reason, FinishReason::StopString(stop));
}

/// Declared context costs nothing: the KV pool is reserved address space that the
/// OS commits only when tokens are written.
#[test]
fn startup_memory_does_not_depend_on_context() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let rss = || {
        let s = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = s.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    };
    let mut pools = Vec::new();
    let mut deltas = Vec::new();
    for ctx in [8192usize, 131072] {
        let before = rss();
        let cfg = EngineConfig {
            // Outputs are compared bit for bit across batch compositions.
            deterministic: true,
            max_context: Some(ctx),
            ..config(4 << 30)
        };
        let eng = EngineCore::new(model.clone(), tok.clone(), cfg).unwrap();
        assert_eq!(eng.max_context(), ctx);
        deltas.push(rss().saturating_sub(before));
        pools.push(eng.stats().kv_pages_total);
        drop(eng);
    }
    eprintln!("RSS growth creating the engine (8K / 128K ctx, 4 GiB KV budget): {deltas:?}");
    // The pool is sized by the budget, never by the declared context.
    assert_eq!(pools[0], pools[1]);
    // Fixed costs (the graph scheduler's tables for up to 2^17 nodes, ~64 MiB once
    // touched) are far below the 4 GiB KV reservation, which is not committed.
    for d in deltas {
        assert!(d < 128 << 20, "creating the engine committed {d} bytes");
    }
}

/// Prompts shorter than a chunk share the prefix they have in common with another
/// short prompt's first page, finished (kept in the prefix cache) or still running,
/// by copying its KV cells, leaving at least a 16-token block to compute; the numbers
/// are those of the prompt alone, bit for bit
/// (also through the 16-row blocks of the repacked Q4_K matmuls and Gemma 3's
/// sliding-window layers).
#[test]
fn short_prompts_copy_a_shared_prefix_exactly() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (file, model, tok) in real_models() {
        let enc = |s: &str| tok.encode(s, true, true);
        let probe = |p: &[u32]| with_logprobs(p, 48);
        let system = "You are a helpful senior software engineer who mentors new colleagues on the storage team. Answer in detail. ";
        let a = enc(&format!(
            "{system}Explain hash maps to a new team member. (request 1 of 1)"
        ));
        let b = enc(&format!(
            "{system}Explain hash maps to a new team member. (request 1 of 4)"
        ));
        let other = "You are a terse assistant for a team of backend engineers who run databases, queues and caches; answer every question in one short line. ";
        let c = enc(&format!("{other}Name three sorting algorithms, please."));
        let d = enc(&format!("{other}Name three graph algorithms, please."));
        for p in [&a, &b, &c, &d] {
            assert!(p.len() < 64, "{file}: prompt of {} tokens", p.len());
        }
        let common = |x: &[u32], y: &[u32]| x.iter().zip(y).take_while(|(p, q)| p == q).count();
        let alone =
            |p: &[u32]| run_batch(&mut core(&model, &tok, 64 << 20), vec![probe(p)]).remove(0);

        let mut eng = core(&model, &tok, 64 << 20);
        // `a` runs alone; with its output its first page fills and stays cached.
        let out_a = run_batch(&mut eng, vec![probe(&a)]).remove(0);
        assert_eq!(out_a.finish.usage.cached_tokens, 0);
        // `b` copies what it shares with `a`'s finished page.
        let out_b = run_batch(&mut eng, vec![probe(&b)]).remove(0);
        let want_b = common(&a, &b).min(b.len() - 16) / 16 * 16;
        assert!(want_b >= 16, "{file}: a and b share {want_b}");
        assert_eq!(out_b.finish.usage.cached_tokens, want_b, "{file}: b's copy");
        // `d` arrives while `c` decodes: it copies from `c`'s running page.
        let mut sc = eng.submit(probe(&c)).expect("submit");
        eng.step().expect("step");
        let mut sd = eng.submit(probe(&d)).expect("submit");
        eng.run_until_idle().expect("run");
        eng.check_invariants().expect("invariants");
        let (out_c, out_d) = (collect(&mut sc), collect(&mut sd));
        let want_d = common(&c, &d).min(d.len() - 16) / 16 * 16;
        assert!(want_d >= 16, "{file}: c and d share {want_d}");
        assert_eq!(out_d.finish.usage.cached_tokens, want_d, "{file}: d's copy");
        assert_eq!(
            eng.stats().prefix_copied_tokens as usize,
            want_b + want_d,
            "{file}"
        );
        for (name, p, o) in [
            ("a", &a, &out_a),
            ("b", &b, &out_b),
            ("c", &c, &out_c),
            ("d", &d, &out_d),
        ] {
            same_as_alone(file, name, o, &alone(p));
        }
        assert_eq!(eng.stats().kv_pages_used, 0);
    }
}

/// The same short prompt twice on one engine: the second time copies the blocks the
/// first left cached and computes the rest, and its tokens and log-probabilities are
/// the first's, bit for bit, on the three real models and Qwen2.5-Coder-1.5B (Q4_K
/// and Q6_K weights, all repacked or dot products), where a copy that left 1 to 6
/// rows to compute moved the first log-probability by up to 0.019 nats (a repeated
/// greedy request then answered differently).
#[test]
fn repeated_short_prompts_are_exact() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let files = MODELS
        .iter()
        .map(|&(_, f)| f)
        .chain(["qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"]);
    for file in files {
        let Some(model) = load(file) else {
            continue;
        };
        let tok = tokenizer(&model);
        let text = tok.encode(
            "Write a function that parses a JSON array of user records, keeps the ones \
             whose email is verified, and returns their names sorted by signup date; \
             then write its unit tests, one per edge case.",
            true,
            true,
        );
        let sizes = [17, 18, 20, 31, 32, 33, 34, 38];
        assert!(text.len() >= 38, "{file}: {} tokens", text.len());
        let mut eng = core(&model, &tok, 64 << 20);
        for n in sizes {
            let p = &text[..n];
            let alone =
                run_batch(&mut core(&model, &tok, 64 << 20), vec![with_logprobs(p, 8)]).remove(0);
            for round in ["first", "again"] {
                let got = run_batch(&mut eng, vec![with_logprobs(p, 8)]).remove(0);
                same_as_alone(file, &format!("{n} tokens, {round}"), &got, &alone);
            }
        }
        // From 32 tokens on, a 16-token block is copied (from the shorter prompts
        // before, then from the first round) and 16 to 22 rows are computed.
        assert_eq!(eng.stats().prefix_copied_tokens, 8 * 16, "{file}");
        eng.check_invariants().expect("invariants");
    }
}

/// A prompt that continues an earlier one (the next turn: the earlier prompt, then
/// new tokens) copies the earlier prompt's exact cells in its last, partial page
/// (after the cached whole pages), from the finished request's page (a whole cached
/// page once its answer filled it, else kept as a partial entry) or from a running
/// request's page, or from a cached whole page of a prompt that parts from it inside
/// the page; the numbers are those of the prompt alone, bit for bit, on all three
/// models.
#[test]
fn continued_prompts_copy_the_partial_page_exactly() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (file, model, tok) in real_models() {
        let probe = |p: &[u32]| with_logprobs(p, 16);
        // Varied text: a repetitive one would be continued by the answers, which then
        // fill pages that a later prompt hits as a whole.
        let text = tok.encode(
            "Summarise the design of a paged KV cache with a global prefix cache. Pages hold \
             sixty-four tokens each and are shared by reference counting between requests \
             whose prompts begin with the same tokens. When memory runs short, unreferenced \
             pages leave in least-recently-used order, and a request that still cannot fit \
             is preempted and recomputed later. The scheduler admits requests by free pages, \
             chunks long prompts under a per-step token budget, and lets decoding streams \
             run every step. Explain how cancellation returns pages, how the SSD tier keeps \
             evicted prefixes, why outputs stay bit-identical after a preemption, and which \
             counters an operator should watch on the metrics endpoint during an incident \
             with many coding agents sharing one long system prompt and tool history. \
             Finally, compare this design with the per-slot caches of llama.cpp's server and \
             with vLLM's block manager, listing what each does better on a small machine \
             with two cores, no GPU and a slow disk, and what you would measure first.",
            true,
            true,
        );
        let turn = tok.encode(
            " Now list three ways it fails under memory pressure, and how to test each one.",
            false,
            false,
        );
        assert!(
            text.len() >= 200 && turn.len() >= 16,
            "{file}: {} and {} tokens",
            text.len(),
            turn.len()
        );
        let alone =
            |p: &[u32]| run_batch(&mut core(&model, &tok, 64 << 20), vec![probe(p)]).remove(0);
        let next = |p: &[u32]| [p, &turn[..]].concat();
        let mut eng = core(&model, &tok, 64 << 20);
        // 120 tokens: exact cells end 48 cells into the second page; 16 answer tokens
        // fill it, so it stays cached once the request ends.
        let first = &text[..120];
        let out_first = run_batch(&mut eng, vec![probe(first)]).remove(0);
        let second = next(first);
        let out_second = run_batch(&mut eng, vec![probe(&second)]).remove(0);
        assert_eq!(
            out_second.finish.usage.cached_tokens, 112,
            "{file}: copy from a finished page"
        );
        // 180 tokens: also a continuation of the first (copies its 48 cells, then
        // computes 68 tokens from cell 112). Its next turn arrives while it decodes
        // (its exact cells end 48 cells into its third page, not yet full).
        let third = &text[..180];
        let mut s3 = eng.submit(probe(third)).expect("submit");
        eng.step().expect("step");
        let fourth = next(third);
        let mut s4 = eng.submit(probe(&fourth)).expect("submit");
        eng.run_until_idle().expect("run");
        eng.check_invariants().expect("invariants");
        let (out_third, out_fourth) = (collect(&mut s3), collect(&mut s4));
        assert_eq!(
            out_third.finish.usage.cached_tokens, 112,
            "{file}: third's copy"
        );
        assert_eq!(
            out_fourth.finish.usage.cached_tokens, 176,
            "{file}: copy from a running page"
        );
        assert_eq!(eng.stats().prefix_copied_tokens, 48 + 48 + 48, "{file}");
        for (name, p, o) in [
            ("first", first, &out_first),
            ("second", &second[..], &out_second),
            ("third", third, &out_third),
            ("fourth", &fourth[..], &out_fourth),
        ] {
            same_as_alone(file, name, o, &alone(p));
        }
        assert_eq!(eng.stats().kv_pages_used, 0);
        // 100 tokens: exact cells end 32 cells into the second page, and the 16
        // answer tokens leave it partial. It is kept as a partial cache entry, so the
        // next turn still copies those cells.
        let mut eng = core(&model, &tok, 64 << 20);
        let fifth = &text[..100];
        let out_fifth = run_batch(&mut eng, vec![probe(fifth)]).remove(0);
        assert!(out_fifth.tokens.len() <= 16);
        let sixth = next(fifth);
        let out_sixth = run_batch(&mut eng, vec![probe(&sixth)]).remove(0);
        assert_eq!(
            out_sixth.finish.usage.cached_tokens, 96,
            "{file}: copy from a kept partial page"
        );
        eng.check_invariants().expect("invariants");
        assert_eq!(eng.stats().kv_pages_used, 0);
        same_as_alone(file, "fifth", &out_fifth, &alone(fifth));
        same_as_alone(file, "sixth", &out_sixth, &alone(&sixth));
        // Prompts that part from a cached one inside a whole page copy the blocks they
        // share from it: 100 tokens of the 150-token prompt then a new turn (a hit on
        // the first page, then 32 of the 36 shared cells of the second); 40 tokens then
        // new text (32 cells of the first page, no hit).
        let mut eng = core(&model, &tok, 64 << 20);
        let seventh = &text[..150];
        let out_seventh = run_batch(&mut eng, vec![probe(seventh)]).remove(0);
        let eighth = next(&text[..100]);
        let out_eighth = run_batch(&mut eng, vec![probe(&eighth)]).remove(0);
        assert_eq!(
            out_eighth.finish.usage.cached_tokens, 96,
            "{file}: a hit, then a copy from a whole page that parts inside"
        );
        let ninth = [&text[..40], &turn[..], &turn[..]].concat();
        assert!(ninth.len() >= 64, "{file}: a tiled prompt");
        let out_ninth = run_batch(&mut eng, vec![probe(&ninth)]).remove(0);
        assert_eq!(
            out_ninth.finish.usage.cached_tokens, 32,
            "{file}: a copy from a first page that parts inside"
        );
        eng.check_invariants().expect("invariants");
        same_as_alone(file, "seventh", &out_seventh, &alone(seventh));
        same_as_alone(file, "eighth", &out_eighth, &alone(&eighth));
        same_as_alone(file, "ninth", &out_ninth, &alone(&ninth));
    }
}

/// A prefix-cache hit may leave fewer than a chunk of the prompt to compute (16
/// tokens or more): the short chunk's flash attention is padded to a full tile so
/// it rounds like the prompt computed from scratch. First-token logprobs
/// bit-identical on all three models (Q4_1; repacked Q4_K with Q6_K and Q8_0;
/// Gemma 3's sliding windows) for remainders of 16 to 40 tokens after one page and
/// some after two. (Remainders of 2-7 tokens differed on the Q4_K models: some
/// matmul kernel rounds differently for so few rows.) Earlier prompts' kept partial
/// pages add whole 16-token blocks to some hits (see `crate::partial_page`).
#[test]
fn warm_hits_leaving_short_chunks_are_exact() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (file, model, tok) in real_models() {
        let probe = |p: &[u32]| with_logprobs(p, 1);
        let base = tok.encode(
            &"Summarise the design of a paged KV cache with a global prefix cache. ".repeat(10),
            true,
            true,
        );
        assert!(base.len() >= 160, "{file}: {} tokens", base.len());
        // The longest prompt first, from scratch: its pages hold prompt KV only.
        let mut eng = core(&model, &tok, 64 << 20);
        let sizes = (80..=104).chain([144, 151, 158]);
        // Where each earlier prompt's exact cells end (the same text, so every one of
        // them is a copy source for the later prompts under the same page).
        let mut exact_ends: Vec<usize> = Vec::new();
        for n in std::iter::once(160).chain(sizes) {
            let p = &base[..n];
            let want = run_batch(&mut core(&model, &tok, 64 << 20), vec![probe(p)]).remove(0);
            let got = run_batch(&mut eng, vec![probe(p)]).remove(0);
            let pages = (n - 16) / 64 * 64;
            let shared = exact_ends
                .iter()
                .filter(|&&e| e > pages && e < pages + 64)
                .map(|&e| e - pages)
                .max()
                .unwrap_or(0);
            let copy = shared.min(n - pages - 16) / 16 * 16;
            let cached = if n == 160 { 0 } else { pages + copy };
            exact_ends.push(n / 16 * 16);
            assert_eq!(got.finish.usage.cached_tokens, cached, "{file}: {n}");
            assert_eq!(got.tokens, want.tokens, "{file}: {n} tokens");
            assert_eq!(got.top_logprobs, want.top_logprobs, "{file}: {n} logprobs");
        }
    }
}

/// `Request::deterministic` in an engine that is not: the request's tokens and
/// log-probabilities are the same bit for bit alone and batched with others, on the
/// model whose Q5_0/Q8_0 weights ggml multiplies differently for one row than for
/// several (Qwen2.5-Coder; on AVX2 none of them is repacked).
#[test]
fn a_deterministic_request_is_batch_invariant_in_a_default_engine() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(model) = load(MODELS[1].1) else {
        return;
    };
    let tok = tokenizer(&model);
    let ps = prompts(&tok);
    let default_engine = || {
        let cfg = EngineConfig {
            threads: 2,
            kv_budget_bytes: Some(128 << 20),
            ..EngineConfig::default()
        };
        assert!(!cfg.deterministic);
        EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine")
    };
    let det = |p: &[u32]| {
        let mut r = with_logprobs(p, 16);
        r.deterministic = true;
        r
    };
    for i in [4usize, 6] {
        let alone = run_batch(&mut default_engine(), vec![det(&ps[i])]).remove(0);
        // Decoding beside three ordinary requests (their decode rows share matmuls).
        let mut reqs: Vec<Request> = [5usize, 7, 0]
            .iter()
            .map(|&j| with_logprobs(&ps[j], 16))
            .collect();
        reqs.insert(1, det(&ps[i]));
        let batched = run_batch(&mut default_engine(), reqs).remove(1);
        same_as_alone(MODELS[1].1, &format!("prompt {i}"), &batched, &alone);
    }
}

/// `EngineCore::requests` follows each request from waiting to running, with its
/// prefix hit, prefill progress and generated tokens, and forgets it at the end.
#[test]
fn requests_report_phase_and_progress() {
    use tempo9_engine::RequestPhase;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = smollm2() else {
        return;
    };
    let mut eng = core(&model, &tok, 64 << 20);
    let p = prompts(&tok).swap_remove(0);
    assert!(p.len() > 256, "a prompt of several pages");
    let mut first = eng.submit(greedy(p.clone(), 4)).expect("submit");
    let r = eng.requests();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].id, first.id());
    assert_eq!(r[0].phase, RequestPhase::Waiting);
    assert_eq!((r[0].prompt_tokens, r[0].computed_tokens), (p.len(), 0));
    while first.try_recv().is_none() {
        eng.step().expect("step");
        let r = eng.requests();
        if let Some(r) = r.first() {
            assert_eq!(r.phase, RequestPhase::Running);
            assert!(r.computed_tokens > 0 && r.computed_tokens <= p.len() + r.generated_tokens);
        }
    }
    // Running to its end, then gone.
    let r = eng.requests();
    assert_eq!(r[0].generated_tokens, 1);
    assert_eq!(r[0].cached_tokens, 0);
    while eng.step().expect("step") {}
    assert!(eng.requests().is_empty());
    drop(first);
    // The same prompt again: admitted on its cached pages.
    let second = eng.submit(greedy(p.clone(), 4)).expect("submit");
    eng.step().expect("step");
    let r = eng.requests();
    assert_eq!(r[0].id, second.id());
    assert!(r[0].cached_tokens >= 128, "{r:?}");
    assert!(r[0].computed_tokens >= r[0].cached_tokens);
}

/// Twelve decode rows in one step of a deterministic engine give each request the
/// numbers it gets alone, on the models with K-quant weights (Qwen2.5-Coder's
/// Q6_K, Gemma 3's Q4_K/Q6_K): from 8 rows, ggml's CPU backend multiplies K-quants
/// with a tiled kernel that rounds differently from a lone row's dot products, so
/// the engine keeps such decode groups below 8 rows (`TILED_MIN_ROWS`).
#[test]
fn twelve_decode_rows_are_batch_invariant_on_k_quant_weights() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for &(_, file) in &MODELS[1..] {
        let Some(model) = load(file) else {
            return;
        };
        let tok = tokenizer(&model);
        let texts = [
            "Copy this code exactly: fn add(a: i32) -> i32 { a + 1 }",
            "{\"name\": \"tempo9\"}\nRepeat the JSON above:\n",
            "The list: apple, banana, cherry, apple,",
            "Count: one two three four five, one two",
        ];
        // Twelve distinct prompts (no shared prefix): each text after one of three
        // leading tokens.
        let ps: Vec<Vec<u32>> = (0..3u32)
            .flat_map(|c| {
                let tok = &tok;
                texts.iter().map(move |t| {
                    let mut p = tok.encode(t, true, false);
                    p.insert(0, 1000 + c);
                    p
                })
            })
            .collect();
        let alone: Vec<Output> = ps
            .iter()
            .map(|p| {
                run_batch(&mut core(&model, &tok, 64 << 20), vec![with_logprobs(p, 3)]).remove(0)
            })
            .collect();
        let batched = run_batch(
            &mut core(&model, &tok, 64 << 20),
            ps.iter().map(|p| with_logprobs(p, 3)).collect(),
        );
        for (i, (b, a)) in batched.iter().zip(&alone).enumerate() {
            same_as_alone(file, &format!("prompt {i}"), b, a);
        }
    }
}
