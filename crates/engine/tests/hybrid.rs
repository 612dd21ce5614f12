//! A hybrid model (Qwen3.5: gated-DeltaNet layers with a recurrent state, gated
//! attention every fourth layer) in the engine, on the synthetic `qwen35-tiny` file:
//! every running request owns a state slot, counted in the KV budget and freed when
//! it ends or is preempted; a preempted request resumes from its newest state
//! checkpoint (or its prompt) and yields what it yields alone; a repeated prompt
//! resumes at its prompt's last checkpoint (`hybrid_prefix.rs` tests prefix reuse).

mod common;

use std::sync::Arc;

use common::*;
use tempo9_engine::{EngineConfig, EngineCore, Request};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn qwen35() -> Option<(Arc<Model>, Arc<Tokenizer>)> {
    let model = load(SYNTH_MODELS[2].1)?;
    let tok = tokenizer(&model);
    Some((model, tok))
}

/// Batch-invariant numbers (outputs are compared bit for bit across batch
/// compositions), two threads, `kv_bytes` of KV memory, `max_running` requests.
fn core(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    kv_bytes: usize,
    max_running: usize,
) -> EngineCore {
    EngineCore::new(model.clone(), tok.clone(), config(kv_bytes, max_running)).expect("engine")
}

fn config(kv_bytes: usize, max_running: usize) -> EngineConfig {
    EngineConfig {
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(kv_bytes),
        max_running,
        ..EngineConfig::default()
    }
}

fn greedy(prompt: Vec<u32>, n: usize) -> Request {
    let mut r = Request::new(prompt, n);
    r.stop.eog = false;
    r
}

/// Prompts of 40 to 300 tokens (ids from the vocabulary's ordinary range).
fn prompts() -> Vec<Vec<u32>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    [40usize, 300, 75, 130, 64, 210]
        .iter()
        .map(|&n| (0..n).map(|_| 100 + rng.below(20_000) as u32).collect())
        .collect()
}

#[test]
fn state_slots_are_counted_freed_and_preemption_recomputes() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = qwen35() else { return };
    let ps = prompts();
    let alone: Vec<Output> = ps
        .iter()
        .map(|p| {
            let mut c = core(&model, &tok, 64 << 20, 8);
            run_batch(&mut c, vec![greedy(p.clone(), 24)]).remove(0)
        })
        .collect();

    // One slot per running request, in the budget; all free again when idle.
    let mut c = core(&model, &tok, 64 << 20, 8);
    let st = c.stats();
    let ssm = model.hparams().ssm.expect("hybrid");
    let recurrent_layers = model.hparams().is_recurrent.iter().filter(|&&r| r).count();
    // Eight live slots, and checkpoint slots from the rest of the budget.
    assert!(st.recurrent.n_slots > 8 + 16, "{:?}", st.recurrent);
    assert_eq!(
        st.state_slot_bytes,
        recurrent_layers * 4 * (ssm.conv_state_len() + ssm.ssm_state_len())
    );
    let out = run_batch(&mut c, ps.iter().map(|p| greedy(p.clone(), 24)).collect());
    for (i, (o, a)) in out.iter().zip(&alone).enumerate() {
        assert_eq!(o.tokens, a.tokens, "batched: prompt {i} differs from alone");
    }
    let st = c.stats();
    assert_eq!(
        (
            st.recurrent.live,
            st.recurrent.free + st.recurrent.checkpoints
        ),
        (0, st.recurrent.n_slots),
        "{:?}",
        st.recurrent
    );
    assert_eq!(st.kv_pages_used, 0);

    // The same prompt again: a hit up to its last checkpoint (the last page
    // boundary at least 16 tokens before its end), the same tokens.
    let again = run_batch(&mut c, vec![greedy(ps[1].clone(), 24)]).remove(0);
    assert_eq!(again.finish.usage.cached_tokens, 256);
    assert_eq!(again.tokens, alone[1].tokens);

    // A budget of the states plus 8 pages (the 300-token prompt needs 5 with its
    // output): later requests are preempted and recompute from their prompts.
    // (Checkpoint slots take part of any budget: grow it until 8 pages remain.)
    let page_bytes = st.page_bytes;
    let mut budget = 4 * st.state_slot_bytes + 8 * page_bytes;
    let mut tight = loop {
        let c = EngineCore::new(model.clone(), tok.clone(), config(budget, 4));
        match c {
            Ok(c) if c.stats().kv_pages_total >= 8 => break c,
            _ => budget += page_bytes,
        }
    };
    let out = run_batch(
        &mut tight,
        ps.iter().map(|p| greedy(p.clone(), 24)).collect(),
    );
    let preempted: u32 = out.iter().map(|o| o.finish.usage.preemptions).sum();
    assert!(preempted > 0, "the tight pool should force preemption");
    for (i, (o, a)) in out.iter().zip(&alone).enumerate() {
        assert_eq!(
            o.tokens, a.tokens,
            "preempted run: prompt {i} differs from alone"
        );
    }
    let st = tight.stats().recurrent;
    assert_eq!(st.live, 0);
    eprintln!("{preempted} preemptions, all outputs identical to alone; {st:?}");
}

/// A budget below two running requests' states is a configuration error; one that
/// holds a few runs fewer requests at once (their states take at most half of it),
/// with the same outputs.
#[test]
fn a_small_budget_runs_fewer_requests_and_one_below_the_states_is_refused() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((model, tok)) = qwen35() else { return };
    let config = EngineConfig {
        kv_budget_bytes: Some(100_000),
        max_running: 8,
        ..EngineConfig::default()
    };
    let err = EngineCore::new(model.clone(), tok.clone(), config)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("recurrent states"), "{err}");

    let st = core(&model, &tok, 64 << 20, 8).stats();
    let (slot, page) = (st.state_slot_bytes, st.page_bytes);
    let budget = 6 * slot + 16 * page;
    let fit = budget / 2 / slot;
    assert!(
        fit < 8,
        "premise: the budget holds fewer than 8 live states ({fit})"
    );
    let mut small = core(&model, &tok, budget, 8);
    assert_eq!(small.config().max_running, fit);
    let ps = prompts();
    let out = run_batch(
        &mut small,
        ps.iter().map(|p| greedy(p.clone(), 16)).collect(),
    );
    for (i, (o, p)) in out.iter().zip(&ps).enumerate() {
        let mut c = core(&model, &tok, 64 << 20, 8);
        let alone = run_batch(&mut c, vec![greedy(p.clone(), 16)]).remove(0);
        assert_eq!(o.tokens, alone.tokens, "prompt {i} differs from alone");
    }
    assert_eq!(small.stats().recurrent.live, 0);
}
