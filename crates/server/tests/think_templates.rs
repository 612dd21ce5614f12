//! The real Qwen3 / Qwen3.5 / Qwen3-Coder chat templates (llama.cpp's
//! `models/templates`, copied to `~/.cache/tempo9/vocab/templates/` by
//! `scripts/fetch-models.sh vocab`) against the reasoning and tool-call
//! detection: which templates reason in `<think>` tags, which prompts leave
//! the output inside an open `<think>`, and a reply parsed the way the server
//! parses it.

use std::path::PathBuf;

use serde_json::{json, Value};
use tempo9_server::tools::think::{self, PromptEnd};
use tempo9_server::tools::{Piece, ThinkParser, ToolCall, ToolFormat, ToolParser};
use tempo9_tokenizer::{ChatTemplate, TemplateOptions};

fn template(file: &str) -> Option<ChatTemplate> {
    let dir = match std::env::var_os("TEMPO9_VOCAB") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/vocab"),
    };
    let path = dir.join("templates").join(file);
    let Ok(src) = std::fs::read_to_string(&path) else {
        eprintln!(
            "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
             !! SKIPPED: {} is missing: run scripts/fetch-models.sh vocab\n\
             !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n",
            path.display()
        );
        return None;
    };
    Some(ChatTemplate::new(&src, "", "<|im_end|>").expect("template compiles"))
}

fn prompt(t: &ChatTemplate, thinking: Option<bool>) -> String {
    let messages = [json!({"role": "user", "content": "Weather in Oslo?"})];
    let opts = TemplateOptions {
        enable_thinking: thinking,
        ..Default::default()
    };
    t.render_with(&messages, None, true, &opts).expect("render")
}

fn tools() -> Vec<Value> {
    vec![
        json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
    ]
}

/// Parses `reply` as the server does for this template and prompt.
fn parse(t: &ChatTemplate, prompt: &str, reply: &str) -> Vec<Piece> {
    let format = ToolFormat::detect(t.source(), "qwen3");
    let inner = format.parser(&tools(), true);
    let mut p = ThinkParser::new(inner, think::prompt_end(prompt));
    let mut out = Vec::new();
    // Token-sized deltas, so tags arrive split.
    let chars: Vec<char> = reply.chars().collect();
    for chunk in chars.chunks(3) {
        p.push(&chunk.iter().collect::<String>(), &mut out);
    }
    p.finish(&mut out);
    let mut merged: Vec<Piece> = Vec::new();
    for piece in out {
        match (merged.last_mut(), piece) {
            (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (_, p) => merged.push(p),
        }
    }
    merged
}

fn oslo() -> Piece {
    Piece::Call(ToolCall {
        name: "get_weather".into(),
        arguments: r#"{"city":"Oslo"}"#.into(),
    })
}

#[test]
fn qwen35_generation_prompt_opens_reasoning_when_thinking() {
    let Some(t) = template("Qwen3.5-4B.jinja") else {
        return;
    };
    assert!(think::detect(t.source()));
    assert_eq!(
        ToolFormat::detect(t.source(), "qwen35"),
        ToolFormat::QwenXml
    );
    let on = prompt(&t, None);
    assert!(on.ends_with("<think>\n"), "{on:?}");
    assert_eq!(think::prompt_end(&on), PromptEnd::Opened);
    assert_eq!(prompt(&t, Some(true)), on);
    let off = prompt(&t, Some(false));
    assert_eq!(think::prompt_end(&off), PromptEnd::Outside);
    // Closing the open block (forced calls, response formats) gives exactly
    // the template's own thinking-off prompt.
    let mut closed = on.clone();
    think::close_reasoning(&mut closed);
    assert_eq!(closed, off);

    let reply = "The user wants Oslo's weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n\
                 <parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
    assert_eq!(
        parse(&t, &on, reply),
        vec![
            Piece::Reasoning("The user wants Oslo's weather.".into()),
            oslo()
        ]
    );
    // A prefilled turn with reasoning only is continued inside it.
    let prefill = [
        json!({"role": "user", "content": "Weather in Oslo?"}),
        json!({"role": "assistant", "content": "", "reasoning_content": "Let me"}),
    ];
    let cont = t.render(&prefill, None, true).expect("render");
    assert!(cont.ends_with("<think>\nLet me"), "{cont:?}");
    assert_eq!(think::prompt_end(&cont), PromptEnd::Continued);
    assert_eq!(
        parse(&t, &cont, " think.\n</think>\n\nSunny."),
        vec![
            Piece::Reasoning(" think.".into()),
            Piece::Text("Sunny.".into())
        ]
    );
    // Thinking off: the answer is all content.
    assert_eq!(
        parse(&t, &off, "It is sunny."),
        vec![Piece::Text("It is sunny.".into())]
    );
}

#[test]
fn qwen3_model_opens_its_own_reasoning() {
    let Some(t) = template("Qwen-Qwen3-0.6B.jinja") else {
        return;
    };
    assert!(think::detect(t.source()));
    assert_eq!(ToolFormat::detect(t.source(), "qwen3"), ToolFormat::Hermes);
    let on = prompt(&t, None);
    assert!(on.ends_with("<|im_start|>assistant\n"), "{on:?}");
    assert_eq!(think::prompt_end(&on), PromptEnd::Outside);
    let off = prompt(&t, Some(false));
    assert!(off.ends_with("<think>\n\n</think>\n\n"), "{off:?}");
    assert_eq!(think::prompt_end(&off), PromptEnd::Outside);

    let reply = "<think>\nMaybe <tool_call> now?\n</think>\n\n<tool_call>\n\
                 {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
    assert_eq!(
        parse(&t, &on, reply),
        vec![Piece::Reasoning("Maybe <tool_call> now?".into()), oslo()]
    );
}

#[test]
fn qwen3_coder_does_not_reason() {
    let Some(t) = template("Qwen3-Coder.jinja") else {
        return;
    };
    assert!(!think::detect(t.source()));
    assert_eq!(
        ToolFormat::detect(t.source(), "qwen3moe"),
        ToolFormat::QwenXml
    );
}
