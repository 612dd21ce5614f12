//! Speculative decoding on the real models: n-gram drafts on the three test models
//! and draft-model drafts on the real pair (Qwen2.5-Coder-1.5B drafted by the 0.5B):
//! greedy tokens and their log-probabilities are bit for bit those of decoding
//! without drafts, at every draft depth, alone and batched with three other
//! requests; rejected drafts leave the page accounting sound; sampled tokens keep
//! their distribution.

mod common;

use std::sync::Arc;

use common::*;
use tempo9_engine::{
    DraftModel, EngineConfig, EngineCore, EngineError, Request, SamplingParams, SpecConfig,
    SpecMode,
};
use tempo9_models::Model;
use tempo9_tokenizer::Tokenizer;

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A deterministic (batch-invariant) engine, with n-gram drafts of depth `k`
/// (0: none).
fn engine(model: &Arc<Model>, tok: &Arc<Tokenizer>, k: usize) -> EngineCore {
    EngineCore::new(model.clone(), tok.clone(), config(k, None)).expect("engine")
}

/// [`engine`], drafting with `mode` (n-gram or the model's MTP head).
fn engine_mode(model: &Arc<Model>, tok: &Arc<Tokenizer>, k: usize, mode: SpecMode) -> EngineCore {
    let mut c = config(k, None);
    if let Some(s) = c.speculation.as_mut() {
        s.mode = mode;
    }
    EngineCore::new(model.clone(), tok.clone(), c).expect("engine")
}

/// A deterministic engine's settings, with drafts of depth `k` (0: none) from
/// `draft` (None: n-gram drafts), always `k` deep where drafts are found.
fn config(k: usize, draft: Option<&Arc<Model>>) -> EngineConfig {
    EngineConfig {
        deterministic: true,
        threads: 2,
        kv_budget_bytes: Some(64 << 20),
        speculation: (k > 0).then_some(SpecConfig {
            mode: if draft.is_some() {
                SpecMode::Draft
            } else {
                SpecMode::Ngram
            },
            k,
            max_batch: 16,
            // Depth k for real (the checks here are of verification at that depth);
            // the planned depths run in `drafts_are_exact`'s last batch.
            fixed_depth: true,
        }),
        draft_model: draft.map(|d| DraftModel(d.clone())),
        ..EngineConfig::default()
    }
}

/// Prompts whose answers repeat their context (so n-gram drafts are proposed and
/// often accepted), raw and chat-templated.
fn prompts(tok: &Tokenizer, chat: bool) -> Vec<Vec<u32>> {
    let code = "fn add(a: i32, b: i32) -> i32 {\n    a + b\n}\n\nfn sub(a: i32, b: i32) -> i32 {\n    a - b\n}\n\n";
    let texts = [
        format!("Copy this code exactly:\n{code}\nCopy:\n"),
        "The list: apple, banana, cherry, apple, banana, cherry, apple, banana,".to_string(),
        "{\"name\": \"tempo9\", \"tags\": [\"fast\", \"local\"]}\nRepeat the JSON above:\n"
            .to_string(),
        "Count: one two three four five, one two three four five, one two".to_string(),
    ];
    texts
        .iter()
        .map(|t| {
            if chat {
                let text = format!("<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n");
                tok.encode(&text, true, true)
            } else {
                tok.encode(t, true, false)
            }
        })
        .collect()
}

fn request(prompt: &[u32], n: usize) -> Request {
    let mut r = Request::new(prompt.to_vec(), n);
    r.stop.eog = false;
    r.logprobs = true;
    r.top_logprobs = 4;
    r
}

const N_GEN: usize = 32;

/// Per real model: four prompts (two raw, two chat-templated) decoded greedily
/// without drafts, each alone; then with drafts of depth 1 and 4 each alone, and of
/// depth 2 and 3 all four batched together: the same tokens and top-4
/// log-probabilities bit for bit, some drafts accepted and some rejected, and no
/// page left held.
#[test]
fn drafts_change_no_greedy_token_or_logprob() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for &(_, file) in &MODELS {
        if !drafts_are_exact(file, false, SpecMode::Ngram) {
            return;
        }
    }
}

/// As [`drafts_change_no_greedy_token_or_logprob`], on the synthetic hybrids
/// (Qwen3.5 dense and MoE): a verifying request's rows carry one recurrent state
/// through, and a rejected draft's state is rolled back to the last valid row's.
/// Their random weights repeat nothing, so the drafts come from a predicted output:
/// the answer decoded without drafts with two of every five tokens changed.
#[test]
fn hybrid_drafts_change_no_greedy_token_or_logprob() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for &(_, file) in &SYNTH_MODELS[2..4] {
        if !drafts_are_exact(file, true, SpecMode::Ngram) {
            return;
        }
    }
}

/// As [`hybrid_drafts_change_no_greedy_token_or_logprob`], with drafts from the
/// models' own MTP heads (synthetic Qwen3.5 dense and MoE files with an MTP block):
/// its drafts alone (a random head's, nearly all rejected), and with predicted
/// outputs drafting first (accepted where they hold).
#[test]
fn mtp_drafts_change_no_greedy_token_or_logprob() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for file in MTP_MODELS {
        for predicted in [false, true] {
            if !drafts_are_exact(file, predicted, SpecMode::Mtp) {
                return;
            }
        }
    }
}

/// The MTP head drafts what llama.cpp's does (`--spec-type draft-mtp`, the same
/// build as the parity fixtures): on the synthetic files with an MTP block, three
/// prompts decoded greedily with 3 drafts a step, each draft recorded by
/// `scripts/fixtures/mtp_drafts.py` from llama.cpp's log. Compared where both
/// engines drafted after the same tokens, up to a draft that llama.cpp picked by
/// less than [`MTP_TIE`] of probability over its runner-up (a near tie that float
/// rounding may order either way), or up to a differing draft (the next depends
/// on it). Steps where ours rest after repeated misses are skipped.
#[test]
fn mtp_drafts_match_llama_cpp() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for file in MTP_MODELS {
        let dir = file.trim_end_matches(".gguf");
        let fixtures = std::fs::read_dir(fixtures_dir().join(dir).join("mtp"))
            .unwrap_or_else(|e| panic!("{dir}: no MTP fixtures: {e}"));
        // This kernel set's fixture when there is one, else another's (where the
        // model's own tokens may part sooner: fewer drafts are then compared).
        let ks = tempo9_ggml::KernelSet::current();
        let all: Vec<serde_json::Value> = fixtures
            .map(|e| e.expect("fixture").path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .map(|p| serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap())
            .collect();
        let cg = common::codegen();
        let own = all.iter().find(|f| {
            f["kernel_set"]["fingerprint"].as_str() == Some(ks.fingerprint().as_str())
                && f["codegen"].as_str().is_none_or(|c| c == cg)
        });
        let Some(fx) = own.or(all.first()) else {
            panic!("{dir}: no MTP fixture");
        };
        let Some(model) = load(file) else {
            return;
        };
        let tok = tokenizer(&model);
        let k = fx["k"].as_u64().unwrap() as usize;
        let (mut compared, mut same) = (0, 0);
        for run in fx["runs"].as_array().unwrap() {
            let prompt = ids(&run["prompt"]);
            let theirs = ids(&run["tokens"]);
            let (ours, steps) = drafts_of(&model, &tok, k, &prompt, theirs.len());
            // Both contexts: the prompt, then each engine's tokens.
            let agree = ours.iter().zip(&theirs).take_while(|(a, b)| a == b).count();
            for step in run["steps"].as_array().unwrap() {
                let n = step["n_tokens"].as_u64().unwrap() as usize;
                let last = step["last"].as_u64().unwrap() as u32;
                // Only where our context is theirs, up to and including `last`.
                if n < prompt.len() || n - prompt.len() + 1 > agree {
                    continue;
                }
                // Ours rest after 8 misses in a row (llama.cpp's do not).
                let Some((_, got)) = steps.iter().find(|(m, _)| *m == n) else {
                    assert!(
                        steps.len() >= 8,
                        "{file}: drafts in only {} steps; none after {n} tokens ({last})",
                        steps.len()
                    );
                    continue;
                };
                for (i, d) in step["drafts"].as_array().unwrap().iter().enumerate() {
                    let (want, p0, p1) = (
                        d[0].as_u64().unwrap() as u32,
                        d[1].as_f64().unwrap(),
                        d[3].as_f64().unwrap(),
                    );
                    if p0 - p1 < MTP_TIE || i >= got.len() {
                        break;
                    }
                    compared += 1;
                    if got[i] != want {
                        eprintln!("{file}: after {n} tokens, draft {i}: {} vs llama.cpp's {want} ({p0:.3} over {p1:.3})", got[i]);
                        break;
                    }
                    same += 1;
                }
            }
        }
        eprintln!("{file}: {same} of {compared} drafts compared equal llama.cpp's");
        let least = if own.is_some() { 20 } else { 1 };
        assert!(compared >= least, "{file}: only {compared} drafts compared");
        assert_eq!(same, compared, "{file}: drafts differ from llama.cpp's");
    }
}

/// Probability by which llama.cpp's draft must beat its runner-up to be compared.
const MTP_TIE: f64 = 0.02;

/// Decodes `n` tokens after `prompt` greedily with `k` MTP drafts a step; returns
/// the tokens and each step's drafts, by the number of tokens before the token
/// they follow (from the engine's `tempo9_engine::drafts` trace events).
fn drafts_of(
    model: &Arc<Model>,
    tok: &Arc<Tokenizer>,
    k: usize,
    prompt: &[u32],
    n: usize,
) -> (Vec<u32>, Vec<(usize, Vec<u32>)>) {
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Log {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("tempo9_engine::drafts=trace")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        let mut eng = engine_mode(model, tok, k, SpecMode::Mtp);
        let mut r = request(prompt, n);
        r.logprobs = false;
        r.top_logprobs = 0;
        run_batch(&mut eng, vec![r]).remove(0)
    });
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    let steps = text
        .lines()
        .filter_map(|l| {
            let field = |name: &str| {
                let at = l.find(&format!("{name}="))? + name.len() + 1;
                Some(&l[at..])
            };
            let n: usize = field("n_tokens")?.split_whitespace().next()?.parse().ok()?;
            let list = field("drafts")?;
            let list = &list[1..list.find(']')?];
            let drafts = list
                .split(", ")
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            Some((n, drafts))
        })
        .collect();
    (out.tokens, steps)
}

/// The synthetic Qwen3.5 files with an MTP block (`synth-gguf --mtp`).
const MTP_MODELS: [&str; 2] = ["qwen35-tiny-mtp.gguf", "qwen35moe-tiny-mtp.gguf"];

/// The checks of [`drafts_change_no_greedy_token_or_logprob`] on one model file,
/// drafting from the context or, with `predicted`, from a predicted output (the
/// plain answer with two of every five tokens changed); false when the file is missing
/// (skipped).
fn drafts_are_exact(file: &str, predicted: bool, mode: SpecMode) -> bool {
    let Some(model) = load(file) else {
        return false;
    };
    let tok = tokenizer(&model);
    let raw = prompts(&tok, false);
    let chat = prompts(&tok, true);
    let ps = [&raw[0], &raw[2], &chat[1], &chat[3]];
    let plain: Vec<Output> = ps
        .iter()
        .map(|p| run_batch(&mut engine(&model, &tok, 0), vec![request(p, N_GEN)]).remove(0))
        .collect();
    let edited = |i: usize| -> Vec<u32> {
        let mut t = plain[i].tokens.clone();
        for (j, x) in t.iter_mut().enumerate() {
            if j % 5 >= 3 {
                *x ^= 1;
            }
        }
        t
    };
    let req = |i: usize| {
        let mut r = request(ps[i], N_GEN);
        if predicted {
            r.prediction = edited(i);
        }
        r
    };
    let alone = |k: usize, i: usize| {
        run_batch(&mut engine_mode(&model, &tok, k, mode), vec![req(i)]).remove(0)
    };
    let check = |k: usize, i: usize, got: &Output, how: &str| {
        assert_eq!(
            got.tokens, plain[i].tokens,
            "{file} k={k} {how} prompt {i}: tokens"
        );
        assert_eq!(
            got.top_logprobs, plain[i].top_logprobs,
            "{file} k={k} {how} prompt {i}: logprobs"
        );
        assert_eq!(got.finish.usage.completion_tokens, N_GEN);
    };
    for k in [1, 4] {
        let (mut drafted, mut accepted) = (0, 0);
        for i in 0..ps.len() {
            let got = alone(k, i);
            check(k, i, &got, "alone");
            drafted += got.finish.usage.draft_tokens;
            accepted += got.finish.usage.accepted_draft_tokens;
        }
        eprintln!("{file} {mode:?} k={k} alone: {accepted} of {drafted} drafts accepted");
        // A random MTP head's drafts are rejected.
        assert!(
            accepted > 0 || (mode == SpecMode::Mtp && !predicted),
            "{file} k={k}: no draft was accepted"
        );
        assert!(accepted < drafted, "{file} k={k}: no draft was rejected");
    }
    // Batched: all four, each speculating (with k = 0, the engine's own batch
    // invariance, which the drafted runs rely on).
    for k in [0, 2, 3] {
        let mut eng = engine_mode(&model, &tok, k, mode);
        let reqs = (0..ps.len()).map(req).collect();
        let got = run_batch(&mut eng, reqs);
        for (i, g) in got.iter().enumerate() {
            check(k, i, g, "batched");
        }
        let st = eng.stats();
        eprintln!(
            "{file} k={k} batched: {} of {} drafts accepted",
            st.accepted_draft_tokens_total, st.draft_tokens_total
        );
        assert!(k == 0 || st.draft_tokens_total > 0, "{file}: {st:?}");
        assert_eq!(st.kv_pages_used, 0, "idle engine holds no pages: {st:?}");
    }
    // The same four with depths planned per step (up to 4) from acceptance and the
    // measured step cost, as the server runs by default: still the same tokens.
    let mut c = config(4, None);
    if let Some(s) = c.speculation.as_mut() {
        s.mode = mode;
        s.fixed_depth = false;
    }
    let mut eng = EngineCore::new(model.clone(), tok.clone(), c).expect("engine");
    let got = run_batch(&mut eng, (0..ps.len()).map(req).collect());
    for (i, g) in got.iter().enumerate() {
        check(4, i, g, "batched, planned depths");
    }
    let st = eng.stats();
    eprintln!(
        "{file} planned depths batched: {} of {} drafts accepted",
        st.accepted_draft_tokens_total, st.draft_tokens_total
    );
    assert_eq!(st.kv_pages_used, 0, "idle engine holds no pages: {st:?}");
    true
}

/// Sampling at temperature 1 with drafts gives tokens from the same distribution
/// as without: per position of the first eight tokens, the frequencies of the
/// tokens seen over 200 samples each, compared by a chi-square test summed over the
/// positions (tokens seen fewer than 10 times at a position pooled into one bin).
/// Checked to fail when a rejected draft's KV is kept (the later tokens then follow
/// the draft's context, not the sampled one's).
#[test]
fn sampled_tokens_keep_their_distribution() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(model) = load(MODELS[0].1) else {
        return;
    };
    let tok = tokenizer(&model);
    let prompt = tok.encode(
        "The list: apple, banana, cherry, apple, banana, cherry, apple, banana, cherry, apple,",
        true,
        false,
    );
    const N: usize = 200;
    const LEN: usize = 8;
    let sample = |k: usize, seed0: u64| -> Vec<Vec<u32>> {
        // At most 16 run at once, so every running request may draft (drafting
        // stops above `max_batch` 16 decoding requests; with the ~44 this KV budget
        // admits, almost none drafted and the rejection path went untested).
        let mut c = config(k, None);
        c.max_running = 16;
        let mut eng = EngineCore::new(model.clone(), tok.clone(), c).expect("engine");
        let reqs = (0..N as u64)
            .map(|i| {
                let mut r = Request::new(prompt.clone(), LEN);
                r.stop.eog = false;
                r.sampling = SamplingParams {
                    temperature: 1.0,
                    seed: Some(seed0 + i),
                    ..SamplingParams::default()
                };
                r
            })
            .collect();
        let out = run_batch(&mut eng, reqs);
        if k > 0 {
            let st = eng.stats();
            assert!(st.accepted_draft_tokens_total > 0, "{st:?}");
            assert!(
                st.accepted_draft_tokens_total < st.draft_tokens_total,
                "{st:?}"
            );
        }
        out.into_iter().map(|o| o.tokens).collect()
    };
    let plain = sample(0, 1_000);
    let spec = sample(4, 9_000);
    let (mut chi2, mut dof) = (0.0f64, 0.0f64);
    for pos in 0..LEN {
        let mut counts: std::collections::BTreeMap<u32, (f64, f64)> = Default::default();
        for t in &plain {
            counts.entry(t[pos]).or_default().0 += 1.0;
        }
        for t in &spec {
            counts.entry(t[pos]).or_default().1 += 1.0;
        }
        let mut bins: Vec<(f64, f64)> = Vec::new();
        let mut rest = (0.0, 0.0);
        for &(a, b) in counts.values() {
            if a + b >= 10.0 {
                bins.push((a, b));
            } else {
                rest.0 += a;
                rest.1 += b;
            }
        }
        if rest.0 + rest.1 > 0.0 {
            bins.push(rest);
        }
        // Two samples of equal size: chi2 = sum (a - b)^2 / (a + b).
        chi2 += bins
            .iter()
            .map(|&(a, b)| (a - b).powi(2) / (a + b))
            .sum::<f64>();
        dof += bins.len().saturating_sub(1) as f64;
    }
    // Above the 99.9th percentile of chi-square with `dof` degrees of freedom
    // (Wilson-Hilferty, rounded up).
    let limit = dof + 3.1 * (2.0 * dof).sqrt() + 7.0;
    eprintln!("{dof} degrees of freedom, chi2 {chi2:.1}, limit {limit:.1}");
    assert!(dof >= 8.0, "too few distinct outcomes to compare");
    assert!(
        chi2 < limit,
        "distributions differ: chi2 {chi2:.1} >= {limit:.1}"
    );
}

/// The real pair: Qwen2.5-Coder-1.5B-Instruct drafted by the 0.5B (same vocabulary).
/// Four prompts decoded greedily without drafts, each alone; then with draft-model
/// drafts of depth 1..4 each alone, and of depth 2 and 3 all four batched: the same
/// tokens and top-4 log-probabilities bit for bit, drafts accepted and rejected,
/// and no page left held in the model's pool.
#[test]
fn draft_model_drafts_change_no_greedy_token_or_logprob() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (Some(model), Some(draft)) = (load(TARGET_1_5B), load(MODELS[1].1)) else {
        panic!(
            "{TARGET_1_5B} and {} are needed (scripts/fetch-models.sh)",
            MODELS[1].1
        );
    };
    let tok = tokenizer(&model);
    let raw = prompts(&tok, false);
    let chat = prompts(&tok, true);
    let ps = [&raw[0], &raw[2], &chat[1], &chat[3]];
    let plain: Vec<Output> = ps
        .iter()
        .map(|p| run_batch(&mut engine(&model, &tok, 0), vec![request(p, N_GEN)]).remove(0))
        .collect();
    let check = |k: usize, i: usize, got: &Output, how: &str| {
        assert_eq!(
            got.tokens, plain[i].tokens,
            "k={k} {how} prompt {i}: tokens"
        );
        assert_eq!(
            got.top_logprobs, plain[i].top_logprobs,
            "k={k} {how} prompt {i}: logprobs"
        );
        assert_eq!(got.finish.usage.completion_tokens, N_GEN);
    };
    let drafting = |k: usize| {
        EngineCore::new(model.clone(), tok.clone(), config(k, Some(&draft))).expect("engine")
    };
    for k in 1..=4 {
        let (mut drafted, mut accepted) = (0, 0);
        for (i, p) in ps.iter().enumerate() {
            let mut eng = drafting(k);
            let got = run_batch(&mut eng, vec![request(p, N_GEN)]).remove(0);
            check(k, i, &got, "alone");
            drafted += got.finish.usage.draft_tokens;
            accepted += got.finish.usage.accepted_draft_tokens;
            assert_eq!(eng.stats().kv_pages_used, 0);
        }
        eprintln!("1.5B drafted by 0.5B, k={k} alone: {accepted} of {drafted} drafts accepted");
        assert!(accepted > 0, "k={k}: no draft was accepted");
        assert!(k == 1 || accepted < drafted, "k={k}: no draft was rejected");
    }
    for k in [2, 3] {
        let mut eng = drafting(k);
        let reqs = ps.iter().map(|p| request(p, N_GEN)).collect();
        let got = run_batch(&mut eng, reqs);
        for (i, g) in got.iter().enumerate() {
            check(k, i, g, "batched");
        }
        let st = eng.stats();
        eprintln!(
            "1.5B drafted by 0.5B, k={k} batched: {} of {} drafts accepted",
            st.accepted_draft_tokens_total, st.draft_tokens_total
        );
        assert!(st.accepted_draft_tokens_total > 0, "{st:?}");
        assert_eq!(st.kv_pages_used, 0, "idle engine holds no pages: {st:?}");
    }
}

/// A draft model whose vocabulary differs from the model's is refused at start
/// with an error naming the first differing token.
#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let (Some(model), Some(draft)) = (load(MODELS[1].1), load(MODELS[0].1)) else {
        panic!("the test models are needed (scripts/fetch-models.sh)");
    };
    let tok = tokenizer(&model);
    match EngineCore::new(model, tok, config(2, Some(&draft))) {
        Err(EngineError::Config(msg)) => {
            assert!(msg.contains("vocabulary"), "{msg}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a draft model with another vocabulary was accepted"),
    }
}

/// The larger real model of the draft pair (`scripts/fetch-models.sh qwen2.5-coder-1.5b`).
const TARGET_1_5B: &str = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf";

/// Drafts under a constraint: what it forces is drafted first (every such draft
/// taken, in fewer steps), and n-gram drafts it forbids are cut before they are
/// verified (none rejected); the tokens are those of decoding without drafts.
#[test]
fn constrained_requests_draft_what_the_constraint_forces_and_nothing_it_forbids() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(model) = load(MODELS[0].1) else {
        return;
    };
    let tok = tokenizer(&model);
    // A prompt whose n-gram drafts propose its own repetition once the answer's
    // first token continues it, and an answer that departs from it then: the
    // constraint forbids every such draft.
    let text = "one two three four five one two three four five one two";
    let prompt = tok.encode(text, true, false);
    let whole = tok.encode(
        &format!("{text} three seven eight nine ten eleven"),
        true,
        false,
    );
    assert_eq!(whole[..prompt.len()], prompt[..]);
    let answer = whole[prompt.len()..].to_vec();
    let n_vocab = tok.vocab_size();
    let run = |k: usize, tells: bool| {
        let mut core = engine(&model, &tok, k);
        let mut r = request(&prompt, answer.len());
        r.constraint = Some(Box::new(Forced {
            tokens: answer.clone(),
            at: 0,
            n_vocab,
            tells,
        }));
        let out = run_batch(&mut core, vec![r]).remove(0);
        (out, core.stats())
    };
    let (plain, plain_stats) = run(0, true);
    assert_eq!(plain.tokens, answer);
    // Without the constraint's help, n-gram drafts repeat the prompt and are rejected.
    let (blind, blind_stats) = run(4, false);
    assert_eq!(blind.tokens, answer);
    assert!(
        blind_stats.draft_tokens_total > blind_stats.accepted_draft_tokens_total,
        "{blind_stats:?}"
    );
    let (told, told_stats) = run(4, true);
    assert_eq!(told.tokens, plain.tokens);
    assert_eq!(told.top_logprobs, plain.top_logprobs);
    assert!(told_stats.draft_tokens_total > 0, "{told_stats:?}");
    assert_eq!(
        told_stats.draft_tokens_total, told_stats.accepted_draft_tokens_total,
        "a draft the constraint forbids was verified"
    );
    assert!(
        told_stats.steps_total < plain_stats.steps_total,
        "forced drafts took {} steps, decoding {}",
        told_stats.steps_total,
        plain_stats.steps_total
    );
}
