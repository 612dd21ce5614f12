//! Every case of `tests/fixtures/<model>/chat.json` (rendered by llama.cpp's
//! llama-server `/apply-template`, jinja mode) must render byte-for-byte the
//! same. Models without `chat.json` are covered only if the file exists;
//! models without a template use the ChatML fallback like llama.cpp.

mod common;

use common::{clip, fixtures_dir, load_fixture, open_model, vocab_file, CODER_1_5B, MODELS};
use tempo9_tokenizer::{ChatTemplate, TemplateOptions, Tokenizer};

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
fn qwen25_coder_1_5b_chat_matches_llama_cpp() {
    check_model(CODER_1_5B.0, CODER_1_5B.1, true);
}

#[test]
fn gemma3_chat_matches_llama_cpp() {
    check_model(MODELS[2].0, MODELS[2].1, false);
}

/// A template recorded without its model (`tests/fixtures/<dir>/chat.json`,
/// `make_fixtures.py --only templates`), read from the vocab cache, with the
/// request's thinking switch and `chat_template_kwargs`.
fn check_template(dir: &str) {
    let fixture = load_fixture(dir, "chat.json");
    let file = fixture["template_file"].as_str().expect("template_file");
    let Some(path) = vocab_file(&format!("templates/{file}")) else {
        return;
    };
    let source = std::fs::read_to_string(&path).expect("template");
    // llama-server drops a template file's final newline (Llama 3.1's has one).
    let recorded = fixture["chat_template"].as_str().expect("chat_template");
    assert!(
        same_template(&source, recorded),
        "{dir}: {} is not the template the fixture was recorded with",
        path.display()
    );
    let props = &fixture["server"]["props"];
    let tmpl = ChatTemplate::new(
        &source,
        props["bos_token"].as_str().unwrap_or(""),
        props["eos_token"].as_str().unwrap_or(""),
    )
    .expect("template compiles");
    let caps = &props["chat_template_caps"];
    assert_eq!(
        Some(tmpl.uses_object_arguments()),
        caps["supports_object_arguments"].as_bool(),
        "{dir}: object arguments cap"
    );
    assert_eq!(
        Some(tmpl.supports_system_role()),
        caps["supports_system_role"].as_bool(),
        "{dir}: system role cap"
    );

    let cases = fixture["cases"].as_array().expect("cases");
    let mut failures = Vec::new();
    let mut thinking_off = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let messages = case["messages"].as_array().expect("messages");
        let tools = case["tools"].as_array().map(Vec::as_slice);
        let agp = case["add_generation_prompt"].as_bool().unwrap_or(true);
        let extra = &case["request_extra"];
        let mut opts = TemplateOptions::default();
        if let Some(kw) = extra["chat_template_kwargs"].as_object() {
            opts.kwargs = kw.clone();
            opts.enable_thinking = kw.get("enable_thinking").and_then(|v| v.as_bool());
        }
        // llama-server: `reasoning_effort: "none"` turns thinking off.
        if extra["reasoning_effort"] == "none" {
            opts.enable_thinking = Some(false);
        }
        if opts.enable_thinking == Some(false) {
            thinking_off += 1;
        }
        // Llama 3.x templates print today's date (`strftime_now`): compare without
        // it, as the fixture holds the day it was recorded.
        let got = tmpl
            .render_with(messages, tools, agp, &opts)
            .map(|g| undated(&g));
        let want = case["rendered"].as_str().map(undated);
        match (got, want.as_deref(), case["error"].as_str()) {
            (Ok(got), Some(want), _) if got == want => {}
            (Ok(got), Some(want), _) => failures.push(format!(
                "{name}: want {}\n      got  {}",
                clip(&want[want.len().saturating_sub(300)..]),
                clip(&got[got.len().saturating_sub(300)..])
            )),
            (Err(_), None, Some(_)) => {}
            (Err(e), _, _) => failures.push(format!("{name}: error {e}")),
            (Ok(_), None, want) => failures.push(format!("{name}: rendered, llama.cpp: {want:?}")),
        }
    }
    assert!(thinking_off >= 3, "{dir}: too few thinking-off cases");
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

/// Whether `recorded` (llama-server's `/props` template) is `source`, allowing the
/// rewrite llama.cpp makes to the gpt-oss and Ministral 3 templates before
/// rendering (common/chat.cpp): a condition that only guards a `raise_exception`
/// becomes `{%- if false %}`. Such checks only decide which inputs are refused, and
/// the refusals are compared case by case.
fn same_template(source: &str, recorded: &str) -> bool {
    let source = source.trim_end_matches('\n');
    let recorded = recorded.trim_end_matches('\n');
    let (a, b): (Vec<&str>, Vec<&str>) = (source.lines().collect(), recorded.lines().collect());
    a.len() == b.len()
        && a.iter().zip(&b).enumerate().all(|(i, (x, y))| {
            x == y
                || (y.trim() == "{%- if false %}"
                    && x.trim_start().starts_with("{%- if ")
                    && a.get(i + 1).is_some_and(|n| n.contains("raise_exception(")))
        })
}

/// `text` with each "Today Date: 03 Dec 2026" made "Today Date: <today>".
fn undated(text: &str) -> String {
    const KEY: &str = "Today Date: ";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find(KEY) {
        let after = &rest[i + KEY.len()..];
        // "dd Mon yyyy": 11 characters, all ASCII.
        let date = after.get(..11).filter(|d| {
            d.bytes().enumerate().all(|(j, b)| {
                if j == 2 || j == 6 {
                    b == b' '
                } else {
                    b.is_ascii_alphanumeric()
                }
            })
        });
        out.push_str(&rest[..i + KEY.len()]);
        match date {
            Some(_) => {
                out.push_str("<today>");
                rest = &after[11..];
            }
            None => rest = after,
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn qwen3_template_matches_llama_cpp() {
    check_template("qwen3-template");
}

#[test]
fn qwen35_template_matches_llama_cpp() {
    check_template("qwen35-template");
}

#[test]
fn llama3_template_matches_llama_cpp() {
    check_template("llama3-template");
}

#[test]
fn gemma4_template_matches_llama_cpp() {
    check_template("gemma4-template");
}

#[test]
fn gpt_oss_template_matches_llama_cpp() {
    check_template("gpt-oss-template");
}

#[test]
fn ministral3_template_matches_llama_cpp() {
    check_template("ministral3-template");
}
