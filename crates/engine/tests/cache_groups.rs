//! Cache groups on a real model with sliding-window layers (Gemma 3 270M: 15 of its
//! 18 layers slide over 512 positions): those layers keep only their window's pages,
//! compute exactly what one cache for all layers (`swa_full`) computes, and a long
//! prefix served from the cache gives exactly the numbers of computing it, from RAM,
//! from the SSD tier and after a restart.

mod common;

use std::sync::Arc;

use common::*;
use tempo9_engine::{EngineConfig, EngineCore, Request, SsdConfig};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn gemma3() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let model = load(MODELS[2].1)?;
    let tok = tokenizer(&model);
    Some((model, tok))
}

fn engine(model: &Arc<Model>, tok: &Arc<Tokenizer>, swa_full: bool) -> EngineCore {
    let config = EngineConfig {
        // Outputs are compared bit for bit across batch compositions.
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(1 << 30),
        swa_full,
        ..EngineConfig::default()
    };
    EngineCore::new(model.clone(), tok.clone(), config).expect("engine")
}

/// `n` tokens of varied text.
fn text_tokens(tok: &Tokenizer, n: usize, seed: usize) -> Vec<u32> {
    let words = [
        "cache",
        "window",
        "layer",
        "token",
        "prefix",
        "page",
        "model",
        "agent",
        "tool",
        "stream",
        "batch",
        "memory",
        "Rust",
        "engine",
        "sliding",
        "attention",
    ];
    let mut text = String::new();
    let mut i = seed;
    while text.len() < n * 8 {
        i = i
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        text.push_str(words[(i >> 33) % words.len()]);
        text.push(if (i >> 40).is_multiple_of(7) {
            '.'
        } else {
            ' '
        });
    }
    let mut t = tok.encode(&text, true, false);
    t.truncate(n);
    assert_eq!(t.len(), n);
    t
}

fn greedy(prompt: Vec<u32>, n: usize) -> Request {
    let mut r = Request::new(prompt, n);
    r.stop.eog = false;
    r.logprobs = true;
    r.top_logprobs = 4;
    r
}

#[test]
fn sliding_layers_keep_their_window_and_compute_the_same() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = gemma3() else {
        return;
    };
    let prompts: Vec<Vec<u32>> = [700, 1300, 2100]
        .iter()
        .enumerate()
        .map(|(i, &n)| text_tokens(&tok, n, i))
        .collect();
    let reqs = || prompts.iter().map(|p| greedy(p.clone(), 24)).collect();
    let full = run_batch(&mut engine(&model, &tok, true), reqs());

    let mut grouped = engine(&model, &tok, false);
    let st = grouped.stats();
    assert!(
        st.sliding.n_pages > 0,
        "Gemma 3 has a sliding group: {st:?}"
    );
    assert!(
        st.sliding_page_bytes > 4 * st.page_bytes,
        "15 sliding layers, 3 full"
    );
    // Step by hand to watch what the sliding group holds.
    let mut streams: Vec<_> = reqs()
        .into_iter()
        .map(|r: Request| grouped.submit(r).unwrap())
        .collect();
    let mut peak = 0;
    while grouped.has_work() {
        grouped.step().unwrap();
        grouped.check_invariants().unwrap();
        peak = peak.max(grouped.stats().sliding.in_use);
    }
    let out: Vec<Output> = streams.iter_mut().map(collect).collect();
    for (i, (g, f)) in out.iter().zip(&full).enumerate() {
        assert_eq!(
            g.tokens, f.tokens,
            "prompt {i}: tokens differ from swa_full"
        );
        assert_eq!(
            g.top_logprobs, f.top_logprobs,
            "prompt {i}: logprobs differ"
        );
    }
    let st = grouped.stats();
    // Each request holds at most its window (512), a step's tokens (512) and a page.
    let per_request = (512 + 512) / st.page_tokens + 1;
    assert!(
        peak <= 3 * per_request,
        "sliding pages held at peak: {peak}"
    );
    assert!(st.sliding.released_pages > 0, "{st:?}");
    assert_eq!(st.sliding.in_use, 0);
    eprintln!(
        "sliding group: peak {peak} pages held for {} prompt tokens; {:?}",
        prompts.iter().map(Vec::len).sum::<usize>(),
        st.sliding
    );
}

#[test]
fn a_16k_prefix_hit_on_gemma3_is_exact() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = gemma3() else {
        return;
    };
    let first = text_tokens(&tok, 16_000, 7);
    let mut warm = engine(&model, &tok, false);
    let a = run_batch(&mut warm, vec![greedy(first.clone(), 8)]).remove(0);
    // The next turn: the conversation so far, then more.
    let mut next = first.clone();
    next.extend(&a.tokens);
    next.extend(text_tokens(&tok, 150, 8));
    let hit = run_batch(&mut warm, vec![greedy(next.clone(), 16)]).remove(0);
    let cold = run_batch(
        &mut engine(&model, &tok, false),
        vec![greedy(next.clone(), 16)],
    )
    .remove(0);
    let cached = hit.finish.usage.cached_tokens;
    assert!(
        cached >= 16_000 - 128,
        "cached {cached} of {} tokens",
        next.len()
    );
    assert_eq!(cold.finish.usage.cached_tokens, 0);
    assert_eq!(hit.tokens, cold.tokens, "tokens after a {cached}-token hit");
    assert_eq!(
        hit.top_logprobs, cold.top_logprobs,
        "logprobs after the hit"
    );
    let st = warm.stats();
    eprintln!(
        "16K prefix: {cached} tokens from the cache; {:?}",
        st.sliding
    );
}

/// Random arrivals of prompts longer than the window that share prefixes, with
/// cancellations, on a pool of a few requests' worth (so the sliding group releases,
/// keeps and evicts windows, and requests are preempted): after every step both
/// groups' invariants hold; every request not cancelled produces exactly its alone
/// output (nobody read another's cells, a hit's windows were right); idle, neither
/// group holds a page.
#[test]
fn random_workloads_with_sliding_windows_stay_sound() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = gemma3() else {
        return;
    };
    let st = engine(&model, &tok, false).stats();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let prefixes: Vec<Vec<u32>> = (0..3)
        .map(|i| text_tokens(&tok, 600 + rng.below(800) as usize, 100 + i))
        .collect();
    let cfg = EngineConfig {
        deterministic: true,
        threads: 2,
        step_tokens: 256,
        itl_target: None,
        window_checkpoint_tokens: 512,
        // 28 pages in each group: one or two requests at a time.
        kv_budget_bytes: Some(28 * (st.page_bytes + st.sliding_page_bytes)),
        ..EngineConfig::default()
    };
    let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine");
    let mut live: Vec<(Vec<u32>, tempo9_engine::RequestStream, Vec<u32>, bool)> = Vec::new();
    let mut done: Vec<(Vec<u32>, Vec<u32>)> = Vec::new();
    let (mut submitted, mut steps) = (0, 0);
    while submitted < 12 || eng.has_work() {
        if submitted < 12 && rng.below(3) == 0 {
            let mut p = prefixes[rng.below(3) as usize].clone();
            p.truncate(1 + rng.below(p.len() as u64) as usize);
            p.extend(text_tokens(
                &tok,
                rng.below(200) as usize + 1,
                1000 + submitted,
            ));
            let mut r = greedy(p.clone(), 6);
            r.logprobs = false;
            r.top_logprobs = 0;
            live.push((p, eng.submit(r).expect("submit"), Vec::new(), false));
            submitted += 1;
        }
        if !live.is_empty() && rng.below(15) == 0 {
            let k = rng.below(live.len() as u64) as usize;
            live[k].1.cancel();
            live[k].3 = true;
        }
        eng.step().expect("step");
        steps += 1;
        eng.check_invariants()
            .unwrap_or_else(|e| panic!("step {steps}: {e}"));
        let mut k = 0;
        while k < live.len() {
            let mut fin = None;
            while let Some(ev) = live[k].1.try_recv() {
                match ev {
                    tempo9_engine::Event::Token(t) => live[k].2.push(t.id),
                    tempo9_engine::Event::Finished(f) => fin = Some(f.reason),
                }
            }
            match fin {
                Some(reason) => {
                    let (p, _, toks, cancelled) = live.remove(k);
                    if !cancelled {
                        assert_eq!(reason, tempo9_engine::FinishReason::Length);
                        done.push((p, toks));
                    }
                }
                None => k += 1,
            }
        }
        assert!(steps < 10_000, "no progress");
    }
    let st = eng.stats();
    assert_eq!((st.kv_pages_used, st.sliding.in_use), (0, 0), "{st:?}");
    assert_eq!(st.sliding.free + st.sliding.cached, st.sliding.n_pages);
    assert!(st.sliding.released_pages > 0, "{st:?}");
    for (p, toks) in &done {
        let mut r = greedy(p.clone(), 6);
        r.logprobs = false;
        r.top_logprobs = 0;
        let alone = run_batch(&mut engine(&model, &tok, false), vec![r]).remove(0);
        assert_eq!(
            toks, &alone.tokens,
            "a request's output depends on its neighbours"
        );
    }
    eprintln!(
        "{steps} steps, {} finished; preemptions {}, prefix hit tokens {}; {:?}",
        done.len(),
        st.preemptions_total,
        st.prefix_hit_tokens,
        st.sliding
    );
    assert!(
        st.prefix_hit_tokens > 0 && st.preemptions_total > 0,
        "the workload should exercise prefix hits and preemption: {st:?}"
    );
}

/// The same prompt on a fresh engine (no cache, no SSD tier).
fn cold(model: &Arc<Model>, tok: &Arc<Tokenizer>, prompt: &[u32], n: usize) -> Output {
    run_batch(
        &mut engine(model, tok, false),
        vec![greedy(prompt.to_vec(), n)],
    )
    .remove(0)
}

fn same(what: &str, got: &Output, want: &Output) {
    assert_eq!(got.tokens, want.tokens, "{what}: tokens");
    assert_eq!(got.top_logprobs, want.top_logprobs, "{what}: logprobs");
}

/// Runs one request, timing it.
fn timed(eng: &mut EngineCore, prompt: &[u32], n: usize) -> (Output, f64) {
    let t = std::time::Instant::now();
    let out = run_batch(eng, vec![greedy(prompt.to_vec(), n)]).remove(0);
    (out, t.elapsed().as_secs_f64())
}

/// Sliding windows on the SSD tier: (a) a long prompt's pages and windows evicted
/// from a tight RAM budget come back from disk for its next turn; (b) after a
/// restart with a persistent tier, the next turn resumes from what the first engine
/// wrote, windows it kept in RAM included; (c) corrupt window files are read errors
/// and recomputed. Each time bit-identical to a cold engine.
#[test]
fn sliding_windows_resume_from_the_ssd_tier_and_after_a_restart() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = gemma3() else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("tempo9-sliding-ssd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let probe = engine(&model, &tok, false).stats();
    let ps = probe.page_tokens;
    let cfg = EngineConfig {
        deterministic: true,
        threads: 2,
        max_running: 2,
        itl_target: None,
        // 48 pages in each group: the fill evicts a 2000-token prompt.
        kv_budget_bytes: Some(48 * (probe.page_bytes + probe.sliding_page_bytes)),
        ssd: Some(SsdConfig {
            persist: true,
            ..SsdConfig::new(&dir)
        }),
        ..EngineConfig::default()
    };
    let a = text_tokens(&tok, 2000, 21);
    let fill: Vec<Vec<u32>> = (0..3).map(|i| text_tokens(&tok, 1500, 30 + i)).collect();
    let turn = |prev: &[u32], out: &Output, seed| {
        [prev, &out.tokens[..], &text_tokens(&tok, 120, seed)[1..]].concat()
    };
    // (a) Evicted to disk, then continued.
    let (b, out_b) = {
        let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg.clone()).expect("engine");
        let out_a = run_batch(&mut eng, vec![greedy(a.clone(), 4)]).remove(0);
        for f in &fill {
            run_batch(&mut eng, vec![greedy(f.clone(), 2)]);
        }
        eng.flush_ssd();
        let st = eng.stats();
        assert!(st.kv_pages_total <= 48, "{st:?}");
        assert!(
            st.ssd.pages > 0 && st.ssd.windows.entries > 0,
            "evicted pages and windows are on disk: {:?}",
            st.ssd
        );
        let b = turn(&a, &out_a, 22);
        let (out_b, secs) = timed(&mut eng, &b, 12);
        let st = eng.stats();
        let cached = out_b.finish.usage.cached_tokens;
        // A's prompt up to its last whole page.
        assert_eq!(cached, a.len() / ps * ps, "{:?}", st.ssd);
        assert!(
            st.ssd.hit_tokens > 0 && st.ssd.windows.served > 0,
            "served from disk: {:?}",
            st.ssd
        );
        let (want, cold_secs) = {
            let t = std::time::Instant::now();
            (cold(&model, &tok, &b, 12), t.elapsed().as_secs_f64())
        };
        same("B from the SSD tier", &out_b, &want);
        eprintln!(
            "(a) B: {cached} tokens cached, {} from disk ({} windows served, {} written) in {secs:.2} s; cold {cold_secs:.2} s",
            st.ssd.hit_tokens, st.ssd.windows.served, st.ssd.windows.written
        );
        (b, out_b)
    };
    // (b) A restart: B's next turn resumes at B's last whole page, whose window the
    // first engine kept in RAM until it wrote it out on shutdown.
    let c = turn(&b, &out_b, 23);
    {
        let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg.clone()).expect("engine");
        let st = eng.stats().ssd;
        assert!(st.pages > 0 && st.windows.entries > 0, "{st:?}");
        let (out_c, secs) = timed(&mut eng, &c, 12);
        let st = eng.stats().ssd;
        let cached = out_c.finish.usage.cached_tokens;
        assert_eq!(cached, b.len() / ps * ps, "after a restart: {st:?}");
        assert!(st.hit_tokens > 0 && st.windows.served > 0, "{st:?}");
        assert_eq!(st.hit_tokens as usize, cached, "all of it from disk");
        same("C after a restart", &out_c, &cold(&model, &tok, &c, 12));
        eprintln!(
            "(b) C: {cached} tokens from disk ({} windows) in {secs:.2} s",
            st.windows.served
        );
    }
    // (c) Corrupt window files: read errors, recomputed, still exact.
    let tier = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .find(|e| e.path().is_dir())
        .expect("tier dir");
    let mut corrupted = 0;
    for e in std::fs::read_dir(tier.path()).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "window") {
            let mut bytes = std::fs::read(e.path()).unwrap();
            let n = bytes.len();
            bytes[n - 1] ^= 0x55;
            std::fs::write(e.path(), bytes).unwrap();
            corrupted += 1;
        }
    }
    assert!(corrupted > 0, "no window files");
    let d = turn(&b, &out_b, 24);
    {
        let mut eng = EngineCore::new(model.clone(), tok.clone(), cfg.clone()).expect("engine");
        let out_d = run_batch(&mut eng, vec![greedy(d.clone(), 12)]).remove(0);
        let st = eng.stats().ssd;
        assert!(st.windows.read_errors >= 1, "{st:?}");
        same(
            "D over corrupt windows",
            &out_d,
            &cold(&model, &tok, &d, 12),
        );
        eprintln!(
            "(c) D: {} window read errors of {corrupted} corrupted files; cached {}",
            st.windows.read_errors, out_d.finish.usage.cached_tokens
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
