//! Exact prefix reuse on hybrid models (issue 29), on the synthetic `qwen35-tiny`
//! and `qwen35moe-tiny` files: a prompt resumes from a recurrent-state checkpoint
//! and yields the tokens and top log-probabilities of a fresh engine computing it
//! from scratch, computing only what the checkpoints leave.

mod common;

use std::sync::Arc;

use common::*;
use tempo9_engine::{EngineConfig, EngineCore, Request, SsdConfig};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Checkpoint interval of these tests.
const EVERY: usize = 1024;
const PS: usize = 64;

fn hybrids() -> Vec<(&'static str, Arc<Model>, Arc<Tokenizer>)> {
    SYNTH_MODELS[2..4]
        .iter()
        .filter_map(|&(name, file)| {
            let model = load(file)?;
            let tok = tokenizer(&model);
            Some((name, model, tok))
        })
        .collect()
}

fn config(kv_bytes: usize) -> EngineConfig {
    EngineConfig {
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(kv_bytes),
        max_running: 8,
        state_checkpoint_tokens: EVERY,
        ..EngineConfig::default()
    }
}

fn core(model: &Arc<Model>, tok: &Arc<Tokenizer>, cfg: EngineConfig) -> EngineCore {
    EngineCore::new(model.clone(), tok.clone(), cfg).expect("engine")
}

fn request(prompt: Vec<u32>, n: usize) -> Request {
    let mut r = Request::new(prompt, n);
    r.stop.eog = false;
    r.logprobs = true;
    r.top_logprobs = 4;
    r
}

fn tokens(rng: &mut Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| 100 + rng.below(20_000) as u32).collect()
}

/// What a fresh engine (empty cache) yields for `prompt`.
fn fresh(model: &Arc<Model>, tok: &Arc<Tokenizer>, prompt: &[u32], n: usize) -> Output {
    let mut c = core(model, tok, config(256 << 20));
    run_batch(&mut c, vec![request(prompt.to_vec(), n)]).remove(0)
}

/// Tokens and top log-probabilities identical, bit for bit.
fn same(name: &str, what: &str, got: &Output, want: &Output) {
    assert_eq!(got.tokens, want.tokens, "{name}: {what}: tokens");
    assert_eq!(
        got.top_logprobs, want.top_logprobs,
        "{name}: {what}: top log-probabilities"
    );
}

/// Prompt tokens a request computed (not served from the cache).
fn computed(o: &Output) -> usize {
    o.finish.usage.prompt_tokens - o.finish.usage.cached_tokens
}

/// (i) A prompt parting from a cached 4K one at an arbitrary token computes its new
/// tokens plus less than a checkpoint interval, checkpoints the junction, and the
/// next prompt parting there computes only its new tokens; all exact.
#[test]
fn a_parting_prompt_resumes_from_a_checkpoint_exactly() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, model, tok) in hybrids() {
        let mut rng = Rng(0x5eed_0001);
        let shared = tokens(&mut rng, 4000);
        let a = [&shared[..], &tokens(&mut rng, 50)].concat();
        let b = [&shared[..2900], &tokens(&mut rng, 80)].concat();
        let c = [&shared[..2900], &tokens(&mut rng, 70)].concat();
        let mut eng = core(&model, &tok, config(256 << 20));
        let out_a = run_batch(&mut eng, vec![request(a.clone(), 12)]).remove(0);
        assert_eq!(computed(&out_a), a.len());
        let out_b = run_batch(&mut eng, vec![request(b.clone(), 12)]).remove(0);
        // B parts at 2900: the deepest checkpoint of A before it is at 2048.
        assert_eq!(out_b.finish.usage.cached_tokens, 2 * EVERY, "{name}");
        assert!(computed(&out_b) <= 80 + EVERY, "{name}");
        let out_c = run_batch(&mut eng, vec![request(c.clone(), 12)]).remove(0);
        // C parts at the same token: B checkpointed the junction's page boundary.
        assert_eq!(out_c.finish.usage.cached_tokens, 2900 / PS * PS, "{name}");
        assert!(computed(&out_c) < 70 + PS, "{name}");
        let st = eng.stats().recurrent;
        assert!(st.hits >= 2 && st.taken >= 5, "{name}: {st:?}");
        same(name, "A", &out_a, &fresh(&model, &tok, &a, 12));
        same(name, "B", &out_b, &fresh(&model, &tok, &b, 12));
        same(name, "C", &out_c, &fresh(&model, &tok, &c, 12));
        eprintln!(
            "{name}: computed A {} B {} C {} of {} {} {}; {st:?}",
            computed(&out_a),
            computed(&out_b),
            computed(&out_c),
            a.len(),
            b.len(),
            c.len()
        );
    }
}

/// (ii) A 3-turn agent conversation: each turn is the previous prompt, its answer
/// and a new message; each computes its new tokens plus less than a page.
#[test]
fn an_agent_conversation_computes_only_each_turns_new_tokens() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, model, tok) in hybrids() {
        let mut rng = Rng(0x5eed_0002);
        let mut eng = core(&model, &tok, config(256 << 20));
        let mut prompt = tokens(&mut rng, 700);
        for turn in 0..3 {
            let out = run_batch(&mut eng, vec![request(prompt.clone(), 40)]).remove(0);
            let new = if turn == 0 { prompt.len() } else { 40 + 90 };
            // The previous prompt's last checkpoint leaves at least a block of
            // ROW_GROUP (16) tokens after it, so less than a page and a block.
            assert!(
                computed(&out) < new + PS + 16,
                "{name}: turn {turn} computed {} of {} ({new} new)",
                computed(&out),
                prompt.len()
            );
            same(
                name,
                &format!("turn {turn}"),
                &out,
                &fresh(&model, &tok, &prompt, 40),
            );
            eprintln!(
                "{name}: turn {turn}: computed {} of {}",
                computed(&out),
                prompt.len()
            );
            prompt.extend(&out.tokens);
            prompt.extend(tokens(&mut rng, 90));
        }
    }
}

/// (iii) Four agents sharing a system prompt, parting at different points, arrive
/// together: the shared part is computed once, each agent's own part once, and
/// every answer is what the agent gets alone.
#[test]
fn agents_arriving_together_share_the_prefix_exactly() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, model, tok) in hybrids() {
        let mut rng = Rng(0x5eed_0003);
        let system = tokens(&mut rng, 2200);
        let prompts: Vec<Vec<u32>> = [1500usize, 1700, 1900, 2100]
            .iter()
            .map(|&l| [&system[..l], &tokens(&mut rng, 60)].concat())
            .collect();
        let mut eng = core(&model, &tok, config(256 << 20));
        let outs = run_batch(
            &mut eng,
            prompts.iter().map(|p| request(p.clone(), 12)).collect(),
        );
        let total: usize = outs.iter().map(computed).sum();
        // Distinct tokens: the longest shared part and each agent's own 60, plus at
        // most a page per agent to its junction.
        let bound = 2100 + 4 * 60 + 4 * PS;
        assert!(
            total <= bound,
            "{name}: computed {total} > {bound}: {:?}",
            outs.iter().map(computed).collect::<Vec<_>>()
        );
        for (i, (o, p)) in outs.iter().zip(&prompts).enumerate() {
            same(name, &format!("agent {i}"), o, &fresh(&model, &tok, p, 12));
        }
        eprintln!(
            "{name}: agents computed {:?} ({total} in all)",
            outs.iter().map(computed).collect::<Vec<_>>()
        );
    }
}

/// (v) Random arrivals over shared prefixes with cancellations and a budget small
/// enough to evict pages and checkpoints: accounting returns to baseline when idle
/// and the cache's invariants hold at every step.
#[test]
fn random_hybrid_workloads_keep_the_accounting() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, model, tok) in hybrids() {
        let probe = core(&model, &tok, config(256 << 20)).stats();
        // Live states for 4, a few checkpoints and ~40 pages.
        let budget = 12 * probe.state_slot_bytes + 40 * probe.page_bytes;
        let mut cfg = config(budget);
        cfg.max_running = 4;
        cfg.state_checkpoint_tokens = 256;
        let mut eng = core(&model, &tok, cfg);
        let base = eng.stats();
        let mut rng = Rng(0x5eed_0005);
        let roots: Vec<Vec<u32>> = (0..3).map(|_| tokens(&mut rng, 900)).collect();
        let mut streams = Vec::new();
        let mut cancels = 0;
        for round in 0..30 {
            for _ in 0..rng.below(3) {
                let root = &roots[rng.below(3) as usize];
                let cut = 1 + rng.below(900) as usize;
                let n_new = 1 + rng.below(120) as usize;
                let p = [&root[..cut], &tokens(&mut rng, n_new)].concat();
                streams.push(eng.submit(request(p, 1 + rng.below(20) as usize)).unwrap());
            }
            if round % 4 == 3 {
                if let Some(s) = streams.get(rng.below(streams.len().max(1) as u64) as usize) {
                    s.cancel();
                    cancels += 1;
                }
            }
            for _ in 0..3 {
                eng.step().expect("step");
                eng.check_invariants().expect("invariants");
            }
        }
        eng.run_until_idle().unwrap();
        eng.check_invariants().unwrap();
        let st = eng.stats();
        assert_eq!((st.running, st.waiting, st.kv_pages_used), (0, 0, 0));
        assert_eq!(st.recurrent.live, 0, "{name}: {:?}", st.recurrent);
        assert_eq!(
            st.recurrent.free + st.recurrent.checkpoints,
            base.recurrent.n_slots
        );
        assert_eq!(
            st.kv_pages_free + st.kv_pages_cached,
            base.kv_pages_total,
            "{name}"
        );
        assert!(
            st.recurrent.hits > 0 && st.recurrent.evicted > 0,
            "{name}: {:?}",
            st.recurrent
        );
        eprintln!(
            "{name}: {} requests, {cancels} cancels: {:?}",
            streams.len(),
            st.recurrent
        );
    }
}

/// (iv) Checkpoints and pages evicted from RAM go to the SSD tier, and a prompt
/// resumes from them there; after a restart with a persistent tier too; a corrupt
/// checkpoint file is recomputed. All exact.
#[test]
fn checkpoints_resume_from_the_ssd_tier_and_after_a_restart() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for (name, model, tok) in hybrids() {
        let dir =
            std::env::temp_dir().join(format!("tempo9-hybrid-ssd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let probe = core(&model, &tok, config(256 << 20)).stats();
        // Two live states, a few checkpoints and ~48 pages: the fill evicts the
        // first prompt's pages and checkpoints.
        let mut cfg = config(6 * probe.state_slot_bytes + 48 * probe.page_bytes);
        cfg.max_running = 2;
        let mut ssd = SsdConfig::new(&dir);
        ssd.persist = true;
        cfg.ssd = Some(ssd);
        let mut rng = Rng(0x5eed_0004);
        let shared = tokens(&mut rng, 2000);
        let a = [&shared[..], &tokens(&mut rng, 40)].concat();
        let b = [&shared[..], &tokens(&mut rng, 50)].concat();
        let c = [&shared[..], &tokens(&mut rng, 60)].concat();
        let d = [&shared[..], &tokens(&mut rng, 70)].concat();
        let fill: Vec<Vec<u32>> = (0..3).map(|_| tokens(&mut rng, 1500)).collect();
        // The last checkpoint of A's prompt: the last page boundary 16 tokens or
        // more before its end.
        let last = (a.len() - 16) / PS * PS;
        {
            let mut eng = core(&model, &tok, cfg.clone());
            run_batch(&mut eng, vec![request(a.clone(), 4)]);
            for f in &fill {
                run_batch(&mut eng, vec![request(f.clone(), 4)]);
            }
            eng.flush_ssd();
            let st = eng.stats();
            assert!(
                st.ssd.states > 0 && st.recurrent.evicted > 0,
                "{name}: {:?}",
                st.ssd
            );
            let out_b = run_batch(&mut eng, vec![request(b.clone(), 12)]).remove(0);
            let st = eng.stats();
            // Its pages come back from disk (its checkpoint from RAM or disk).
            assert!(st.ssd.hit_pages > 0, "{name}: {:?}", st.ssd);
            assert_eq!(out_b.finish.usage.cached_tokens, last, "{name}");
            same(
                name,
                "B from the SSD tier",
                &out_b,
                &fresh(&model, &tok, &b, 12),
            );
        }
        // A restart finds the persisted pages and checkpoints.
        {
            let mut eng = core(&model, &tok, cfg.clone());
            let out_c = run_batch(&mut eng, vec![request(c.clone(), 12)]).remove(0);
            assert_eq!(
                out_c.finish.usage.cached_tokens, last,
                "{name}: after a restart"
            );
            let st = eng.stats().ssd;
            assert!(st.served_states >= 1 && st.hit_pages > 0, "{name}: {st:?}");
            same(
                name,
                "C after a restart",
                &out_c,
                &fresh(&model, &tok, &c, 12),
            );
        }
        // Corrupt checkpoint files: read errors, recomputed, still exact.
        let tier = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .find(|e| e.path().is_dir());
        let mut corrupted = 0;
        for e in std::fs::read_dir(tier.expect("tier dir").path())
            .unwrap()
            .flatten()
        {
            if e.path().extension().is_some_and(|x| x == "state") {
                let mut bytes = std::fs::read(e.path()).unwrap();
                let n = bytes.len();
                bytes[n - 1] ^= 0x55;
                std::fs::write(e.path(), bytes).unwrap();
                corrupted += 1;
            }
        }
        assert!(corrupted > 0, "{name}: no checkpoint files");
        {
            let mut eng = core(&model, &tok, cfg.clone());
            let out_d = run_batch(&mut eng, vec![request(d.clone(), 12)]).remove(0);
            let st = eng.stats();
            assert!(st.ssd.state_read_errors >= 1, "{name}: {:?}", st.ssd);
            same(
                name,
                "D over corrupt checkpoints",
                &out_d,
                &fresh(&model, &tok, &d, 12),
            );
            eprintln!(
                "{name}: D cached {} after {} read errors",
                out_d.finish.usage.cached_tokens, st.ssd.state_read_errors
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
