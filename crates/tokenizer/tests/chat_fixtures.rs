//! Every case of `tests/fixtures/<model>/chat.json` (rendered by llama.cpp's
//! llama-server `/apply-template`, jinja mode) must render byte-for-byte the
//! same. Models without `chat.json` are covered only if the file exists;
//! models without a template use the ChatML fallback like llama.cpp.

mod common;

use common::{clip, fixtures_dir, load_fixture, open_model, MODELS};
use tempo9_tokenizer::{ChatTemplate, Tokenizer};

fn check_model(dir: &str, file: &str, require_fixture: bool) {
    if !require_fixture && !fixtures_dir().join(dir).join("chat.json").exists() {
        eprintln!("{dir}: no chat.json fixture");
        return;
    }
    let Some(gguf) = open_model(file) else {
        return;
    };
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    let tmpl = ChatTemplate::for_model(&gguf, &tok).expect("template compiles");
    let fixture = load_fixture(dir, "chat.json");
    let props = &fixture["server"]["props"];
    if let Some(bos) = props["bos_token"].as_str() {
        assert_eq!(tmpl.bos_token(), bos, "{dir}: bos_token");
    }
    if let Some(eos) = props["eos_token"].as_str() {
        assert_eq!(tmpl.eos_token(), eos, "{dir}: eos_token");
    }
    let caps = &props["chat_template_caps"];
    if let Some(b) = caps["supports_object_arguments"].as_bool() {
        assert_eq!(
            tmpl.uses_object_arguments(),
            b,
            "{dir}: object arguments cap"
        );
    }
    if let Some(b) = caps["supports_system_role"].as_bool() {
        assert_eq!(tmpl.supports_system_role(), b, "{dir}: system role cap");
    }

    let cases = fixture["cases"].as_array().expect("cases");
    assert!(!cases.is_empty(), "{dir}: no chat cases");
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let messages = case["messages"].as_array().expect("messages");
        let tools = case["tools"].as_array().map(Vec::as_slice);
        // `"default(true)"` means the request left it out (server default true).
        let agp = case["add_generation_prompt"].as_bool().unwrap_or(true);
        let want = case["rendered"].as_str().expect("rendered");
        match tmpl.render(messages, tools, agp) {
            Ok(got) if got == want => {}
            Ok(got) => failures.push(format!(
                "{name}: want {}\n      got  {}",
                clip(&want[want.len().saturating_sub(300)..]),
                clip(&got[got.len().saturating_sub(300)..])
            )),
            Err(e) => failures.push(format!("{name}: error {e}")),
        }
    }
    eprintln!(
        "{dir}: {}/{} chat cases match",
        cases.len() - failures.len(),
        cases.len()
    );
    for f in &failures {
        eprintln!("  {f}");
    }
    assert!(failures.is_empty(), "{dir}: {} mismatches", failures.len());
}

#[test]
fn smollm2_chat_matches_llama_cpp() {
    check_model(MODELS[0].0, MODELS[0].1, true);
}

#[test]
fn qwen25_coder_chat_matches_llama_cpp() {
    check_model(MODELS[1].0, MODELS[1].1, true);
}

#[test]
fn gemma3_chat_matches_llama_cpp() {
    check_model(MODELS[2].0, MODELS[2].1, false);
}
