//! Decode throughput with and without a grammar, through the engine (which
//! computes masks on a worker thread during the forward pass). Timing-sensitive,
//! so ignored by default; run on a quiet machine with
//! `cargo test --release -p tempo9-grammar --test throughput -- --ignored --nocapture`.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use common::{model_path, GrammarClock, Timed, QWEN, SMOLLM2};
use serde_json::json;
use tempo9_engine::{EngineConfig, EngineCore, Event, Request};
use tempo9_ggml::Device;
use tempo9_grammar::{Grammar, GrammarCompiler, SchemaMode};
use tempo9_models::{LoadOptions, Model};
use tempo9_tokenizer::Tokenizer;

const TOKENS: usize = 128;
const REPS: usize = 5;

/// Seconds per generated token of one request (prefill excluded: timed from the
/// first token event).
fn decode_time(core: &mut EngineCore, req: Request) -> (f64, usize) {
    let mut stream = core.submit(req).expect("submit");
    let mut first: Option<Instant> = None;
    let mut n = 0;
    loop {
        let busy = core.step().expect("step");
        while let Some(ev) = stream.try_recv() {
            match ev {
                Event::Token(_) => {
                    n += 1;
                    first.get_or_insert_with(Instant::now);
                }
                Event::Finished(_) => {
                    let dt = first.expect("tokens").elapsed().as_secs_f64();
                    // The first token's step is not in the interval.
                    return (dt / (n - 1) as f64, n);
                }
            }
        }
        assert!(
            busy || core.has_work(),
            "engine idle before the request ended"
        );
    }
}

fn compare(file: &str) {
    let Some(path) = model_path(file) else { return };
    let model = Arc::new(Model::load(&path, LoadOptions::new(Device::cpu())).expect("load"));
    let tok = Arc::new(Tokenizer::from_gguf(model.gguf()).expect("tokenizer"));
    let compiler = GrammarCompiler::for_tokenizer(&tok).expect("compiler");
    let config = EngineConfig {
        kv_budget_bytes: Some(256 << 20),
        max_context: Some(1024),
        ..EngineConfig::default()
    };
    let mut core = EngineCore::new(model, tok.clone(), config).expect("engine");
    // Long enough that the grammar never completes within TOKENS.
    let schema = json!({
        "type": "array", "minItems": 200, "maxItems": 200,
        "items": {"type": "object",
                  "properties": {"name": {"type": "string", "maxLength": 20},
                                 "score": {"type": "integer", "minimum": 0, "maximum": 100}},
                  "required": ["name", "score"], "additionalProperties": false}
    });
    let g = Grammar::json_schema(&schema, SchemaMode::Strict).unwrap();
    let prompt = tok.encode("List players and their scores as JSON:", true, false);
    let mut free = Vec::new();
    let mut constrained = Vec::new();
    let clock = Arc::new(GrammarClock::default());
    for _ in 0..REPS {
        let mut r = Request::new(prompt.clone(), TOKENS);
        r.banned_tokens = tok.eog_tokens();
        let (t, n) = decode_time(&mut core, r);
        assert_eq!(n, TOKENS);
        free.push(t);
        let mut r = Request::new(prompt.clone(), TOKENS);
        r.constraint = Some(Box::new(Timed::new(
            compiler.compile(&g).unwrap(),
            clock.clone(),
        )));
        let (t, n) = decode_time(&mut core, r);
        assert_eq!(n, TOKENS);
        constrained.push(t);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (f, c) = (median(&mut free), median(&mut constrained));
    let cost = c / f - 1.0;
    let in_grammar =
        clock.total_nanos.load(Ordering::Relaxed) as f64 * 1e-9 / (REPS * TOKENS) as f64;
    // Even if masks were computed after the forward pass instead of during it,
    // decoding would slow down by at most this much.
    let serial_bound = in_grammar / f;
    eprintln!(
        "{file}: unconstrained {:.1} tok/s, constrained {:.1} tok/s, cost {:+.1} %; \
         grammar {:.1} µs/token = {:.2} % of a decode step",
        1.0 / f,
        1.0 / c,
        cost * 100.0,
        in_grammar * 1e6,
        serial_bound * 100.0
    );
    assert!(
        cost <= 0.10,
        "constrained decoding costs {:.1} %",
        cost * 100.0
    );
    assert!(
        serial_bound <= 0.10,
        "grammar work is {:.1} % of a decode step",
        serial_bound * 100.0
    );
}

#[test]
#[ignore = "timing; run on a quiet machine"]
fn throughput_cost_smollm2() {
    compare(SMOLLM2);
}

#[test]
#[ignore = "timing; run on a quiet machine"]
fn throughput_cost_qwen() {
    compare(QWEN);
}
