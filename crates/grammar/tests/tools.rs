//! Tool-call grammars at the token level on real vocabularies.

mod common;

use common::{tokenizer, QWEN, SMOLLM2};
use serde_json::json;
use tempo9_grammar::{
    Constraint, GrammarCompiler, GrammarError, ReasoningMarkup, ToolCallFormat, ToolCallGrammar,
    ToolChoice, ToolSpec,
};
use tempo9_tokenizer::Tokenizer;

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {
                    "location": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
                },
                "required": ["location", "unit"],
                "additionalProperties": false
            })),
            strict: true,
        },
        ToolSpec {
            name: "get_time".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"]
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

fn request(choice: ToolChoice, parallel: bool) -> ToolCallGrammar {
    ToolCallGrammar {
        format: ToolCallFormat::hermes(),
        tools: tools(),
        choice,
        parallel,
    }
}

/// [`common::accepts`] of text as plain text.
fn accepts(c: &mut Constraint, tok: &Tokenizer, text: &str) -> bool {
    common::accepts(c, tok, text, false)
}

const WEATHER: &str = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>";
const TIME: &str =
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"UTC\"}}\n</tool_call>";
const PING: &str = "<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>";

#[test]
fn required_and_named_tool_calls() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let check = |req: &ToolCallGrammar, text: &str| {
        let g = req.build(&tok).expect("grammar");
        let mut c = compiler.compile(&g).expect("compile");
        accepts(&mut c, &tok, text)
    };
    let required = request(ToolChoice::Required, true);
    assert!(check(&required, WEATHER));
    assert!(check(&required, TIME));
    assert!(check(&required, PING));
    assert!(
        check(&required, &format!("{WEATHER}\n{TIME}")),
        "parallel calls"
    );
    assert!(
        !check(&required, "Sure, let me check."),
        "text is not a call"
    );
    assert!(!check(&required, ""), "a call is required");
    assert!(
        !check(&required, "<tool_call>\n{\"name\": \"get_wether\""),
        "unknown tool name"
    );
    assert!(
        !check(&required, &WEATHER.replace("celsius", "kelvin")),
        "arguments must follow the schema"
    );
    assert!(
        !check(&required, &PING.replace("{}", "{\"x\": 1}")),
        "no parameters means an empty object"
    );
    let single = request(ToolChoice::Required, false);
    assert!(check(&single, WEATHER));
    assert!(
        !check(&single, &format!("{WEATHER}\n{TIME}")),
        "one call only"
    );
    let named = request(ToolChoice::Named("get_time".into()), true);
    assert!(check(&named, TIME));
    assert!(!check(&named, WEATHER), "only the named tool");
}

#[test]
fn auto_tool_choice_engages_at_the_opening_markup() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let g = request(ToolChoice::Auto, true).build(&tok).unwrap();
    let check = |text: &str| {
        let mut c = compiler.compile(&g).expect("compile");
        accepts(&mut c, &tok, text)
    };
    assert!(check("The weather in Paris is usually mild."), "free text");
    assert!(check("Multi-line\ntext with {braces} and <tags>."));
    assert!(check(WEATHER), "a call right away");
    assert!(
        check(&format!("Let me check.\n{WEATHER}")),
        "text, then a call"
    );
    assert!(
        check(&format!("Checking.\n{WEATHER}\n{TIME}")),
        "parallel calls"
    );
    assert!(
        !check("Let me check.\n<tool_call>\n{\"name\": \"nope\""),
        "once the call starts it must name a tool"
    );
    assert!(
        !check(&format!(
            "Checking.\n{}",
            WEATHER.replace("Paris\"", "Paris\", \"x\": 1")
        )),
        "and follow its schema"
    );
}

#[test]
fn auto_tool_choice_ignores_markup_while_reasoning() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let mut req = request(ToolChoice::Auto, true);
    req.format.reasoning = Some(ReasoningMarkup {
        open: "<think>".into(),
        close: "</think>".into(),
        starts_inside: false,
    });
    let g = req.build(&tok).unwrap();
    let check = |text: &str| {
        let mut c = compiler.compile(&g).expect("compile");
        accepts(&mut c, &tok, text)
    };
    let musing = "<think>\nI could write <tool_call> here.\n</think>\n\n";
    assert!(check(musing), "a trigger inside reasoning is text");
    assert!(check(&format!("{musing}Sure.")));
    assert!(
        check(&format!("{musing}{WEATHER}")),
        "a call after reasoning"
    );
    assert!(
        !check(&format!("{musing}<tool_call>\nhello")),
        "after reasoning the trigger engages the grammar"
    );
    assert!(check(WEATHER), "a call without reasoning");
    assert!(!check("Hi <tool_call>\nhello"), "and text before it");
    // Without reasoning markup the same musing engages the grammar.
    let plain = request(ToolChoice::Auto, true).build(&tok).unwrap();
    let mut c = compiler.compile(&plain).unwrap();
    assert!(!accepts(&mut c, &tok, musing));

    // The prompt opened `<think>` (Qwen3 thinking templates): the output
    // starts as reasoning, so a trigger before `</think>` is text.
    req.format.reasoning.as_mut().unwrap().starts_inside = true;
    let g = req.build(&tok).unwrap();
    let check = |text: &str| {
        let mut c = compiler.compile(&g).expect("compile");
        accepts(&mut c, &tok, text)
    };
    let musing = "I could write <tool_call> here.\n</think>\n\n";
    assert!(check(musing));
    assert!(check("Hi <tool_call>\nhello"), "still reasoning");
    assert!(check(&format!("{musing}{WEATHER}")));
    assert!(!check(&format!("{musing}<tool_call>\nhello")));
}

#[test]
fn control_token_markup_is_matched_as_the_token() {
    let Some(tok) = tokenizer(SMOLLM2) else {
        return;
    };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let start = tok.token_id("<|im_start|>").unwrap();
    let end = tok.token_id("<|im_end|>").unwrap();
    assert!(tok.is_control(start));
    let req = ToolCallGrammar {
        format: ToolCallFormat {
            open: "<|im_start|>".into(),
            close: "<|im_end|>".into(),
            ..ToolCallFormat::hermes()
        },
        tools: tools(),
        choice: ToolChoice::Required,
        parallel: false,
    };
    let mut c = compiler.compile(&req.build(&tok).unwrap()).unwrap();
    let m = c.compute_mask_words().unwrap();
    let allowed: Vec<u32> = (0..tok.vocab_size() as u32)
        .filter(|&t| m[t as usize / 32] & (1 << (t % 32)) != 0)
        .collect();
    assert_eq!(allowed, vec![start], "only the opening token");
    c.accept_token(start).unwrap();
    for t in tok.encode("{\"name\": \"ping\", \"arguments\": {}}", false, false) {
        c.accept_token(t).unwrap();
    }
    let m = c.compute_mask_words().unwrap();
    assert_ne!(m[end as usize / 32] & (1 << (end % 32)), 0);
    c.accept_token(end).unwrap();
    assert!(c.is_finished());
}

#[test]
fn bad_tool_requests_name_the_problem() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let err = |req: ToolCallGrammar| match req.build(&tok) {
        Err(e @ GrammarError::InvalidTools(_)) => e.to_string(),
        other => panic!("expected an invalid-tools error, got {other:?}"),
    };
    let mut r = request(ToolChoice::Named("nope".into()), true);
    assert!(err(r.clone()).contains("'nope'"));
    r.choice = ToolChoice::Required;
    r.tools.clear();
    assert!(err(r.clone()).contains("no tools"));
    r.tools = tools();
    r.tools[1].parameters = Some(json!({"type": "object", "properties": {"tz": {"type": "txt"}}}));
    let m = err(r.clone());
    assert!(m.contains("get_time") && m.contains("txt"), "{m}");
    r.tools = tools();
    r.tools.push(r.tools[0].clone());
    assert!(err(r.clone()).contains("twice"));
    r.tools = tools();
    r.format = ToolCallFormat::llama3_json();
    r.choice = ToolChoice::Auto;
    assert!(err(r).contains("opening markup"));
}

#[test]
fn list_formats_and_prefilled_prefixes() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    // Mistral-style: one JSON array of calls after the markup.
    let req = ToolCallGrammar {
        format: ToolCallFormat::mistral(),
        ..request(ToolChoice::Required, true)
    };
    let g = req.build(&tok).unwrap();
    let two = "[TOOL_CALLS][{\"name\": \"ping\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {\"timezone\": \"UTC\"}}]";
    assert!(accepts(&mut compiler.compile(&g).unwrap(), &tok, two));
    assert!(!accepts(
        &mut compiler.compile(&g).unwrap(),
        &tok,
        "[TOOL_CALLS]{\"name\": \"ping\"}"
    ));
    // A call start the server put in the prompt is consumed before sampling.
    let g = request(ToolChoice::Required, false).build(&tok).unwrap();
    let mut c = compiler.compile(&g).unwrap();
    c.advance_text("<tool_call>\n{\"name\": \"").unwrap();
    assert!(accepts(
        &mut c,
        &tok,
        "get_time\", \"arguments\": {\"timezone\": \"UTC\"}}\n</tool_call>"
    ));
    let mut c = compiler.compile(&g).unwrap();
    assert!(c.advance_text("Hello").is_err());
}

/// The call starts the server appends to the prompt for `tool_choice` required /
/// named (its `ToolFormat::forced_prefix`) are where the matching grammars
/// expect them, so the server can compile the grammar and `advance_text` them.
#[test]
fn server_forced_prefixes_fit_the_grammars() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let cases = [
        (ToolCallFormat::hermes(), None, "<tool_call>\n{\"name\": \""),
        (
            ToolCallFormat::hermes(),
            Some("get_time"),
            "<tool_call>\n{\"name\": \"get_time\", \"arguments\": ",
        ),
        (ToolCallFormat::llama3_json(), None, "{\"name\": \""),
        (
            ToolCallFormat::llama3_json(),
            Some("get_time"),
            "{\"name\": \"get_time\", \"parameters\": ",
        ),
        (ToolCallFormat::mistral(), None, "[TOOL_CALLS]"),
        (
            ToolCallFormat::mistral(),
            Some("get_time"),
            "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": ",
        ),
    ];
    for (format, name, prefix) in cases {
        let choice = match name {
            Some(n) => ToolChoice::Named(n.into()),
            None => ToolChoice::Required,
        };
        let req = ToolCallGrammar {
            format: format.clone(),
            ..request(choice, true)
        };
        let mut c = compiler.compile(&req.build(&tok).unwrap()).unwrap();
        c.advance_text(prefix)
            .unwrap_or_else(|e| panic!("{format:?} {name:?}: {e}"));
        // The model continues with the arguments (and the name, if not forced).
        let rest = match name {
            Some(_) => "{\"timezone\": \"UTC\"}}",
            None if format.arguments_key == "parameters" => {
                "get_time\", \"parameters\": {\"timezone\": \"UTC\"}}"
            }
            None if prefix.ends_with("[TOOL_CALLS]") => {
                "[{\"name\": \"get_time\", \"arguments\": {\"timezone\": \"UTC\"}}"
            }
            None => "get_time\", \"arguments\": {\"timezone\": \"UTC\"}}",
        };
        let close = format!("{}{}", format.close, format.end);
        assert!(
            accepts(&mut c, &tok, &format!("{rest}{close}")),
            "{format:?} {name:?}"
        );
    }
}

/// A tool whose schema no value satisfies (BFCL's live sets have an integer whose
/// `enum` lists strings) fails the request only when it is strict; otherwise its
/// arguments are held to its property names and required list, and the other
/// tools keep their schemas.
#[test]
fn unenforceable_lenient_schemas_are_relaxed() {
    let Some(tok) = tokenizer(QWEN) else { return };
    let compiler = GrammarCompiler::for_tokenizer(&tok).unwrap();
    let mut req = request(ToolChoice::Required, false);
    req.tools.push(ToolSpec {
        name: "buy".into(),
        parameters: Some(json!({
            "type": "object",
            "properties": {
                "n": {"type": "integer", "enum": ["1", "2"]},
                "city": {"type": "string"}
            },
            "required": ["n"]
        })),
        strict: false,
    });
    let g = req
        .build(&tok)
        .expect("a lenient tool does not fail the request");
    let check = |text: &str| accepts(&mut compiler.compile(&g).unwrap(), &tok, text);
    let buy = |args: &str| {
        format!("<tool_call>\n{{\"name\": \"buy\", \"arguments\": {args}}}\n</tool_call>")
    };
    assert!(check(&buy("{\"n\": 2, \"city\": \"Oslo\"}")));
    assert!(check(&buy("{\"n\": \"2\"}")));
    assert!(!check(&buy("{\"city\": \"Oslo\"}")), "n stays required");
    assert!(check(WEATHER));
    assert!(
        !check(&WEATHER.replace("celsius", "kelvin")),
        "the other tools keep their schemas"
    );
    req.tools.last_mut().unwrap().strict = true;
    match req.build(&tok) {
        Err(e @ GrammarError::InvalidTools(_)) => {
            let m = e.to_string();
            assert!(m.contains("tool 'buy'") && m.contains("'n'"), "{m}")
        }
        other => panic!("a strict tool's schema must hold: {other:?}"),
    }
}
