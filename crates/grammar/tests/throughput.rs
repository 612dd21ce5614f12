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

/// What a `tool_choice: auto` grammar costs per token while the model writes
/// free text (reasoning, then an answer) before any call: the mask of every
/// step, in Qwen3.5's vocabulary, for its XML calls and for Hermes JSON calls
/// (the same trigger, `<tool_call>`). Masks are computed during the forward
/// pass; this is the time they take.
#[test]
#[ignore = "timing; run on a quiet machine"]
fn auto_tool_grammar_cost_per_free_token() {
    use tempo9_grammar::{ReasoningMarkup, ToolCallFormat, ToolCallGrammar, ToolChoice, ToolSpec};
    let dir = std::env::var_os("TEMPO9_VOCAB")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var_os("HOME").expect("HOME"))
                .join(".cache/tempo9/vocab")
        });
    let Ok(f) = tempo9_gguf::GgufFile::open(dir.join("ggml-vocab-qwen35.gguf")) else {
        eprintln!("skipping: no Qwen3.5 vocabulary (scripts/fetch-models.sh vocab)");
        return;
    };
    let tok = Arc::new(Tokenizer::from_gguf(&f).expect("tokenizer"));
    let compiler = GrammarCompiler::for_tokenizer(&tok).expect("compiler");
    let paragraph = "The user wants the weather in Oslo and a packing list. I could call \
        get_weather, but first let me think about what <tool_call> would need: a location \
        and a unit. Oslo in December is cold, often below zero, with snow and short days. ";
    // The answer mentions no call markup (that would open a call).
    let answer = "Oslo in December is cold, often below zero, with snow and short days: \
        pack a warm coat, boots with a good grip, gloves, a hat and a thermos. ";
    let text = format!(
        "<think>\n{}</think>\n\n{}",
        paragraph.repeat(6),
        answer.repeat(8)
    );
    let ids = tok.encode(&text, false, true);
    let tools = vec![ToolSpec {
        name: "get_weather".into(),
        parameters: Some(json!({"type": "object",
            "properties": {"location": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location", "unit"]})),
        strict: false,
    }];
    for (name, mut format) in [
        ("qwen xml", ToolCallFormat::qwen_xml()),
        ("hermes", ToolCallFormat::hermes()),
    ] {
        format.reasoning = Some(ReasoningMarkup {
            open: "<think>".into(),
            close: "</think>".into(),
            starts_inside: false,
        });
        let g = ToolCallGrammar {
            format,
            tools: tools.clone(),
            choice: ToolChoice::Auto,
            parallel: true,
        }
        .build(&tok)
        .expect("grammar");
        let mut times = Vec::new();
        for _ in 0..REPS {
            let mut c = compiler.compile(&g).expect("compile");
            let t0 = Instant::now();
            for &t in &ids {
                let m = c.compute_mask_words().expect("mask");
                let refused = m[t as usize / 32] & (1 << (t % 32)) == 0;
                assert!(!refused, "{name}: {:?} refused", tok.token_piece(t, true));
                c.accept_token(t).expect("accept");
            }
            times.push(t0.elapsed().as_secs_f64() / ids.len() as f64);
        }
        times.sort_by(f64::total_cmp);
        eprintln!(
            "{name}: {} free tokens, grammar {:.1} µs/token (median of {REPS})",
            ids.len(),
            times[REPS / 2] * 1e6
        );
    }
}
