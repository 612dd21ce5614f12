//! Token-level checks of the schema suite on real vocabularies: valid instances,
//! tokenized the way the model would, are accepted token by token and complete
//! the grammar; invalid ones are rejected. Also times mask computation.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{cases, schema_valid, tokenizer, GEMMA, QWEN, SMOLLM2};
use tempo9_grammar::{Constraint, Grammar, GrammarCompiler, SchemaMode};
use tempo9_tokenizer::Tokenizer;

/// How feeding a text to a constraint went.
#[derive(Debug, PartialEq)]
enum Fed {
    /// Every token allowed and the grammar complete at the end (after an
    /// end-of-generation token if it still allowed more).
    Complete,
    /// Token `i` of the text was not in the mask (or failed to commit).
    Rejected(usize),
    /// Every token allowed but the grammar cannot end there.
    Incomplete,
}

struct Timing {
    total: Duration,
    masks: usize,
}

fn feed(c: &mut Constraint, tok: &Tokenizer, text: &str, timing: &mut Timing) -> Fed {
    let ids = tok.encode(text, false, false);
    for (i, &t) in ids.iter().enumerate() {
        let t0 = Instant::now();
        let mask = c.compute_mask_words();
        timing.total += t0.elapsed();
        timing.masks += 1;
        let Ok(mask) = mask else {
            return Fed::Rejected(i);
        };
        if mask[t as usize / 32] & (1 << (t % 32)) == 0 {
            return Fed::Rejected(i);
        }
        if c.accept_token(t).is_err() {
            return Fed::Rejected(i);
        }
    }
    if c.is_finished() {
        return Fed::Complete;
    }
    // The grammar could go on (e.g. more digits): it is complete if it allows an
    // end-of-generation token here, and is then finished.
    let mask = c.compute_mask_words().expect("mask at the end");
    let eos = tok.eos().expect("eos");
    if mask[eos as usize / 32] & (1 << (eos % 32)) == 0 {
        return Fed::Incomplete;
    }
    c.accept_token(eos).expect("accept eos");
    assert!(c.is_finished(), "finished after end-of-generation");
    Fed::Complete
}

fn check_suite(file: &str) {
    let Some(tok) = tokenizer(file) else { return };
    let t0 = Instant::now();
    let compiler = GrammarCompiler::for_tokenizer(&tok).expect("compiler");
    let build = t0.elapsed();
    let mut timing = Timing {
        total: Duration::ZERO,
        masks: 0,
    };
    let mut compile = Duration::ZERO;
    let suite = cases();
    assert!(suite.len() >= 30, "the suite has {} schemas", suite.len());
    for case in &suite {
        let g = Grammar::json_schema(&case.schema, SchemaMode::Strict)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let mut with_ws = case.schema.clone();
        if let Some(o) = with_ws.as_object_mut() {
            o.insert(
                "x-guidance".into(),
                serde_json::json!({"whitespace_flexible": true}),
            );
        }
        let flexible = Grammar::json_schema(&with_ws, SchemaMode::Strict)
            .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for v in &case.valid {
            assert!(
                schema_valid(&case.schema, v),
                "{}: suite instance {v} is not valid",
                case.name
            );
            // The default output is compact JSON with ", " and ": "; with flexible
            // whitespace asked for (llguidance's x-guidance), any layout.
            let texts = [
                (&g, spaced(v)),
                (&flexible, serde_json::to_string(v).unwrap()),
                (&flexible, serde_json::to_string_pretty(v).unwrap()),
            ];
            for (g, text) in texts {
                let t1 = Instant::now();
                let mut c = compiler.compile(g).expect("compile");
                compile += t1.elapsed();
                assert_eq!(
                    feed(&mut c, &tok, &text, &mut timing),
                    Fed::Complete,
                    "{}: valid instance {text:?} not accepted",
                    case.name
                );
            }
        }
        for v in &case.invalid {
            assert!(
                !schema_valid(&case.schema, v),
                "{}: suite instance {v} is valid",
                case.name
            );
            let text = serde_json::to_string(v).unwrap();
            let mut c = compiler.compile(&g).expect("compile");
            let fed = feed(&mut c, &tok, &text, &mut timing);
            assert_ne!(
                fed,
                Fed::Complete,
                "{}: invalid instance {text} accepted",
                case.name
            );
        }
    }
    eprintln!(
        "{file}: vocab {}, compiler built in {:.1} ms, {} masks at {:.1} µs/token, grammar compile {:.2} ms avg",
        tok.vocab_size(),
        build.as_secs_f64() * 1e3,
        timing.masks,
        timing.total.as_secs_f64() * 1e6 / timing.masks as f64,
        compile.as_secs_f64() * 1e3 / suite.iter().map(|c| 2 * c.valid.len()).sum::<usize>() as f64,
    );
    // Generous bound: the engine overlaps masks with the forward pass, which takes
    // milliseconds; a mask costing this much would be a regression.
    let per_token = timing.total / timing.masks as u32;
    assert!(
        per_token < Duration::from_millis(2),
        "{per_token:?} per mask"
    );
}

#[test]
fn suite_smollm2_vocab() {
    check_suite(SMOLLM2);
}

#[test]
fn suite_qwen_vocab() {
    check_suite(QWEN);
}

#[test]
fn suite_gemma_vocab() {
    check_suite(GEMMA);
}

#[test]
fn token_env_marks_control_tokens_and_is_canonical() {
    for file in [SMOLLM2, QWEN, GEMMA] {
        let Some(tok) = tokenizer(file) else { return };
        let compiler = GrammarCompiler::for_tokenizer(&tok).expect("compiler");
        let again = GrammarCompiler::for_tokenizer(&tok).expect("compiler");
        assert!(
            Arc::ptr_eq(compiler.tok_env(), again.tok_env()),
            "{file}: env is cached per tokenizer"
        );
        let env = compiler.tok_env();
        assert!(env.tokenize_is_canonical(), "{file}: encode is canonical");
        let trie = env.tok_trie();
        assert_eq!(trie.vocab_size(), tok.vocab_size());
        let mut n_control = 0;
        for id in 0..tok.vocab_size() as u32 {
            if tok.is_control(id) {
                n_control += 1;
                assert!(trie.is_special_token(id), "{file}: control {id} is special");
            } else if !tok.token_bytes(id).is_empty() {
                assert_eq!(trie.token(id), tok.token_bytes(id), "{file}: token {id}");
            }
        }
        assert!(n_control > 0, "{file}: has control tokens");
        for e in tok.eog_tokens() {
            assert!(
                trie.eos_tokens().contains(&e),
                "{file}: eog {e} ends grammars"
            );
        }
        // A control token's text in a grammar literal is text, never the token.
        let g = Grammar::regex(r"[a-z<>|_/ ]{1,40}").unwrap();
        let mut c = compiler.compile(&g).unwrap();
        let mask = c.compute_mask_words().unwrap();
        for id in 0..tok.vocab_size() as u32 {
            if tok.is_control(id) && !tok.is_eog(id) {
                assert_eq!(mask[id as usize / 32] & (1 << (id % 32)), 0, "{file}: {id}");
            }
        }
    }
}

#[test]
fn mask_allows_eog_only_when_accepting() {
    let Some(tok) = tokenizer(SMOLLM2) else {
        return;
    };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let g = Grammar::regex("[0-9]{2,4}").unwrap();
    let mut c = compiler.compile(&g).unwrap();
    let eos = tok.eos().unwrap();
    let allowed = |m: &[u32], t: u32| m[t as usize / 32] & (1 << (t % 32)) != 0;
    let m = c.compute_mask_words().unwrap();
    assert!(!allowed(&m, eos));
    let one = tok.encode("1", false, false);
    assert_eq!(one.len(), 1);
    c.accept_token(one[0]).unwrap();
    assert!(!allowed(&c.compute_mask_words().unwrap(), eos));
    c.accept_token(one[0]).unwrap();
    let m = c.compute_mask_words().unwrap();
    assert!(allowed(&m, eos), "two digits may end");
    assert!(allowed(&m, one[0]), "or go on");
    assert!(!c.is_finished());
    c.accept_token(one[0]).unwrap();
    c.accept_token(one[0]).unwrap();
    // Four digits: nothing more is possible.
    assert!(c.is_finished());
    // A token outside the mask is refused with a reason.
    let mut c = compiler.compile(&g).unwrap();
    let a = tok.encode("a", false, false)[0];
    assert!(c.accept_token(a).is_err());
}

#[test]
fn lark_and_special_tokens() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let mut timing = Timing {
        total: Duration::ZERO,
        masks: 0,
    };
    let g = Grammar::lark(
        r#"start: "yes" | "no" | "maybe: " NUM
NUM: /[0-9]+/"#,
    )
    .unwrap();
    for (text, ok) in [
        ("yes", true),
        ("maybe: 42", true),
        ("nope", false),
        ("maybe: x", false),
    ] {
        let mut c = compiler.compile(&g).unwrap();
        assert_eq!(
            feed(&mut c, &tok, text, &mut timing) == Fed::Complete,
            ok,
            "{text}"
        );
    }
    // Named special tokens resolve against this vocabulary...
    let g = Grammar::lark(r#"start: "a" <|im_end|>"#).unwrap();
    let mut c = compiler.compile(&g).unwrap();
    let im_end = tok.token_id("<|im_end|>").unwrap();
    c.accept_token(tok.encode("a", false, false)[0]).unwrap();
    let m = c.compute_mask_words().unwrap();
    assert_ne!(m[im_end as usize / 32] & (1 << (im_end % 32)), 0);
    // ...and unknown ones are a compile error naming the token.
    let g = Grammar::lark(r#"start: "a" <|no_such_token|>"#).unwrap();
    let err = compiler.compile(&g).err().expect("unknown special token");
    assert!(err.to_string().contains("no_such_token"), "{err}");
}

#[test]
fn compiler_cache_releases_unused_tokenizers() {
    let (Some(a), Some(b)) = (tokenizer(SMOLLM2), tokenizer(SMOLLM2)) else {
        return;
    };
    let ca = GrammarCompiler::for_tokenizer(&a).unwrap();
    let cb = GrammarCompiler::for_tokenizer(&b).unwrap();
    assert!(
        !Arc::ptr_eq(ca.tokenizer(), cb.tokenizer()),
        "keyed by identity"
    );
    let weak = Arc::downgrade(&a);
    drop(ca);
    // Still in use by this test: kept.
    GrammarCompiler::for_tokenizer(&b).unwrap();
    assert!(weak.upgrade().is_some());
    drop(a);
    // Only the cache refers to it now: released at the next lookup.
    GrammarCompiler::for_tokenizer(&b).unwrap();
    assert!(
        weak.upgrade().is_none(),
        "the cache let go of the tokenizer"
    );
}

#[test]
fn rollback_undoes_accepted_tokens() {
    let Some(tok) = tokenizer(SMOLLM2) else {
        return;
    };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let g = Grammar::regex("1[0-9]{2}|2x").unwrap();
    let id = |s: &str| {
        let v = tok.encode(s, false, false);
        assert_eq!(v.len(), 1, "{s}");
        v[0]
    };
    let mut c = compiler.compile(&g).unwrap();
    let start = c.compute_mask_words().unwrap();
    c.accept_token(id("1")).unwrap();
    let after_one = c.compute_mask_words().unwrap();
    c.accept_token(id("5")).unwrap();
    c.accept_token(id("5")).unwrap();
    assert!(c.is_finished());
    c.rollback(2).unwrap();
    assert!(!c.is_finished());
    assert_eq!(c.compute_mask_words().unwrap(), after_one);
    c.rollback(1).unwrap();
    assert_eq!(c.compute_mask_words().unwrap(), start);
    c.accept_token(id("2")).unwrap();
    assert!(c.accept_token(id("5")).is_err(), "only x may follow 2 now");
}

/// `v` as Tempo9's JSON answers lay it out by default: `", "` between items and
/// members, `": "` after keys, no other whitespace.
fn spaced(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Object(m) => {
            let members: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), spaced(v)))
                .collect();
            format!("{{{}}}", members.join(", "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(spaced).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}
