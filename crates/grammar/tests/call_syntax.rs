//! Forced tool calls (`tool_choice` required / named) in the families whose calls
//! are not one JSON object: Qwen3.5 XML, GPT-OSS harmony and Gemma 4, on the real
//! vocabularies where llama.cpp ships them (Qwen3.5, Gemma 4; harmony's o200k is
//! not shipped, so its markup is text in Qwen2.5's).

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{tokenizer, QWEN};
use serde_json::json;
use tempo9_grammar::{
    Constraint, GrammarCompiler, ToolCallFormat, ToolCallGrammar, ToolChoice, ToolSpec,
};
use tempo9_tokenizer::Tokenizer;

/// A vocab-only GGUF of llama.cpp's (`scripts/fetch-models.sh vocab`), like a
/// real model: missing fails the test unless TEMPO9_SKIP_MODEL_TESTS=1.
fn vocab(file: &str) -> Option<Arc<Tokenizer>> {
    let dir = std::env::var_os("TEMPO9_VOCAB")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/vocab")
        });
    let p = dir.join(file);
    if !p.exists() {
        if std::env::var("TEMPO9_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
            eprintln!("skipping: {} missing", p.display());
            return None;
        }
        panic!("{} missing: run scripts/fetch-models.sh vocab", p.display());
    }
    let f = tempo9_gguf::GgufFile::open(&p).expect("open gguf");
    Some(Arc::new(Tokenizer::from_gguf(&f).expect("tokenizer")))
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer"}
                },
                "required": ["location", "unit"],
                "additionalProperties": false
            })),
            strict: false,
        },
        ToolSpec {
            name: "ping".into(),
            parameters: None,
            strict: false,
        },
    ]
}

fn compile(tok: &Arc<Tokenizer>, format: ToolCallFormat, choice: ToolChoice) -> Constraint {
    let req = ToolCallGrammar {
        format,
        tools: tools(),
        choice,
        parallel: true,
    };
    let g = req.build(tok).unwrap_or_else(|e| panic!("{e}"));
    GrammarCompiler::for_tokenizer(tok)
        .unwrap()
        .compile(&g)
        .unwrap()
}

/// [`common::accepts`] of text as a model writes markup.
fn accepts(c: &mut Constraint, tok: &Tokenizer, text: &str) -> bool {
    common::accepts(c, tok, text, true)
}

/// Each case: (output, accepted?) under `tool_choice: required`.
fn check(tok: &Arc<Tokenizer>, format: &ToolCallFormat, cases: &[(&str, bool)]) {
    for (text, want) in cases {
        let mut c = compile(tok, format.clone(), ToolChoice::Required);
        assert_eq!(accepts(&mut c, tok, text), *want, "{format:?}: {text:?}");
    }
}

#[test]
fn qwen_xml_calls_follow_the_parameters() {
    let Some(tok) = vocab("ggml-vocab-qwen35.gguf") else {
        return;
    };
    let f = ToolCallFormat::qwen_xml();
    let weather = "<tool_call>\n<function=get_weather>\n<parameter=location>\nNew York\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";
    check(
        &tok,
        &f,
        &[
            (weather, true),
            // Optional `days` as JSON, two calls in a row, a call without parameters.
            ("<tool_call>\n<function=get_weather>\n<parameter=location>\nParis, \"France\"\n</parameter>\n<parameter=unit>\nfahrenheit\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>", true),
            (&format!("{weather}\n<tool_call>\n<function=ping>\n</function>\n</tool_call>"), true),
            // Not an enum value; a required parameter missing; a string for an
            // integer; an unknown tool; text instead of a call.
            ("<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=unit>\nkelvin\n</parameter>\n</function>\n</tool_call>", false),
            ("<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n</function>\n</tool_call>", false),
            ("<tool_call>\n<function=get_weather>\n<parameter=location>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>", false),
            ("<tool_call>\n<function=get_time>\n</function>\n</tool_call>", false),
            ("It is sunny.", false),
        ],
    );
    // The server's forced prefixes (required, named) fit.
    let mut c = compile(&tok, f.clone(), ToolChoice::Required);
    c.advance_text("<tool_call>\n<function=").unwrap();
    assert!(accepts(&mut c, &tok, "ping>\n</function>\n</tool_call>"));
    let mut c = compile(&tok, f, ToolChoice::Named("get_weather".into()));
    c.advance_text("<tool_call>\n<function=get_weather>\n")
        .unwrap();
    assert!(accepts(
        &mut c,
        &tok,
        &weather["<tool_call>\n<function=get_weather>\n".len()..]
    ));
}

/// `tool_choice: auto` on Qwen3.5: free text (and reasoning) until the model
/// opens `<tool_call>` outside `<think>`, then calls that follow the tools.
#[test]
fn qwen_xml_auto_leaves_text_free_until_a_call_opens() {
    let Some(tok) = vocab("ggml-vocab-qwen35.gguf") else {
        return;
    };
    let weather = "<tool_call>\n<function=get_weather>\n<parameter=location>\nOslo\n</parameter>\n<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>";
    for starts_inside in [false, true] {
        let mut f = ToolCallFormat::qwen_xml();
        f.reasoning = Some(tempo9_grammar::ReasoningMarkup {
            open: "<think>".into(),
            close: "</think>".into(),
            starts_inside,
        });
        // The prompt's open `<think>` (thinking on) or none.
        let think = if starts_inside {
            "I could write <tool_call> here.\n</think>\n\n"
        } else {
            "<think>\nI could write <tool_call> here.\n</think>\n\n"
        };
        let cases: &[(String, bool)] = &[
            (format!("{think}It is sunny."), true),
            (format!("{think}Let me look.\n{weather}"), true),
            (format!("{think}{weather}\n{weather}"), true),
            // An unknown tool; a value outside the enum; prose after the calls.
            (
                format!("{think}<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
                false,
            ),
            (
                format!("{think}{}", weather.replace("celsius", "kelvin")),
                false,
            ),
            (format!("{think}{weather}\nDone."), false),
        ];
        for (text, want) in cases {
            let mut c = compile(&tok, f.clone(), ToolChoice::Auto);
            assert_eq!(accepts(&mut c, &tok, text), *want, "{text:?}");
        }
    }
}

#[test]
fn harmony_calls_name_the_tool_in_the_header() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let f = ToolCallFormat::harmony();
    let head = "<|channel|>commentary to=functions.";
    let weather = format!("{head}get_weather <|constrain|>json<|message|>{{\"location\": \"Paris\", \"unit\": \"celsius\"}}<|call|>");
    check(
        &tok,
        &f,
        &[
            (&weather, true),
            (&format!("{head}ping <|constrain|>json<|message|>{{}}<|call|>"), true),
            (&format!("{head}get_weather <|constrain|>json<|message|>{{\"location\": \"Paris\"}}<|call|>"), false),
            (&format!("{head}get_time <|constrain|>json<|message|>{{}}<|call|>"), false),
            ("<|channel|>final<|message|>Sunny.<|return|>", false),
        ],
    );
    // One call per message (the server asks harmony for no parallel calls):
    // nothing may follow `<|call|>`.
    let req = ToolCallGrammar {
        format: f.clone(),
        tools: tools(),
        choice: ToolChoice::Required,
        parallel: false,
    };
    let g = req.build(&tok).unwrap();
    let mut c = GrammarCompiler::for_tokenizer(&tok)
        .unwrap()
        .compile(&g)
        .unwrap();
    assert!(!accepts(&mut c, &tok, &format!("{weather}{weather}")));
    let mut c = compile(&tok, f, ToolChoice::Named("ping".into()));
    c.advance_text(&format!("{head}ping <|constrain|>json<|message|>"))
        .unwrap();
    assert!(accepts(&mut c, &tok, "{}<|call|>"));
}

#[test]
fn gemma4_calls_use_gemma_notation() {
    let Some(tok) = vocab("ggml-vocab-gemma-4.gguf") else {
        return;
    };
    for markup in ["<|tool_call>", "<tool_call|>", "<|\"|>"] {
        let ids = tok.encode(markup, false, true);
        // One user-defined token each (text to the grammar, not control tokens).
        assert_eq!(ids.len(), 1, "{markup} is one token");
        assert!(!tok.is_control(ids[0]));
    }
    let f = ToolCallFormat::gemma4();
    let weather = "<|tool_call>call:get_weather{location:<|\"|>New York, \"NY\"<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>";
    check(
        &tok,
        &f,
        &[
            (weather, true),
            ("<|tool_call>call:get_weather{location:<|\"|>Oslo<|\"|>,unit:<|\"|>fahrenheit<|\"|>,days:-2}<tool_call|>", true),
            (&format!("{weather}<|tool_call>call:ping{{}}<tool_call|>"), true),
            // JSON instead of Gemma's notation; a float for an integer; a missing
            // required key.
            ("<|tool_call>call:get_weather{\"location\": \"Oslo\", \"unit\": \"celsius\"}<tool_call|>", false),
            ("<|tool_call>call:get_weather{location:<|\"|>Oslo<|\"|>,unit:<|\"|>celsius<|\"|>,days:1.5}<tool_call|>", false),
            ("<|tool_call>call:get_weather{unit:<|\"|>celsius<|\"|>}<tool_call|>", false),
        ],
    );
    // The server's forced prefixes (required, named) fit.
    let mut c = compile(&tok, f.clone(), ToolChoice::Required);
    c.advance_text("<|tool_call>call:").unwrap();
    assert!(accepts(&mut c, &tok, "ping{}<tool_call|>"));
    let mut c = compile(&tok, f, ToolChoice::Named("get_weather".into()));
    c.advance_text("<|tool_call>call:get_weather{").unwrap();
    assert!(accepts(
        &mut c,
        &tok,
        "location:<|\"|>Rome<|\"|>,unit:<|\"|>celsius<|\"|>}<tool_call|>"
    ));
}
