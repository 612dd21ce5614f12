//! Chat-template behaviour that does not need a model.

use serde_json::{json, Value};
use tempo9_tokenizer::{ChatTemplate, TokenizerError};

fn msgs(v: Value) -> Vec<Value> {
    v.as_array().unwrap().clone()
}

fn render(src: &str, messages: Value, tools: Option<Value>, agp: bool) -> String {
    let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
    let tools = tools.map(|t| t.as_array().unwrap().clone());
    t.render(&msgs(messages), tools.as_deref(), agp).unwrap()
}

#[test]
fn syntax_errors_report_the_line() {
    let err = ChatTemplate::new("line one\n{% if x %}\n{{ y }\n", "", "").unwrap_err();
    match err {
        TokenizerError::TemplateSyntax { line, message } => {
            assert_eq!(line, 3, "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(matches!(
        ChatTemplate::new("{% for %}", "", ""),
        Err(TokenizerError::TemplateSyntax { .. })
    ));
}

#[test]
fn render_errors_are_errors_not_panics() {
    let t = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    let err = t
        .render(
            &msgs(json!([{"role": "system", "content": "x"}])),
            None,
            true,
        )
        .unwrap_err();
    match err {
        TokenizerError::TemplateRender { message, line } => {
            assert!(message.contains("first must be user"), "{message}");
            assert_eq!(line, Some(1));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(
        t.render(&msgs(json!([{"role": "user", "content": "x"}])), None, true)
            .unwrap(),
        "ok"
    );
    let t = ChatTemplate::new("{{ messages[0].content + 1 }}", "", "").unwrap();
    assert!(matches!(
        t.render(&msgs(json!([{"role": "user", "content": "x"}])), None, true),
        Err(TokenizerError::TemplateRender { .. })
    ));
    // Malformed input messages are input errors.
    let t = ChatTemplate::chatml();
    for bad in [
        json!([{"content": "no role"}]),
        json!([{"role": "user"}]),
        json!([{"role": "user", "content": 5}]),
        json!(["not an object"]),
    ] {
        assert!(matches!(
            t.render(&msgs(bad.clone()), None, true),
            Err(TokenizerError::InvalidMessage(_))
        ));
    }
}

#[test]
fn chatml_fallback() {
    let out = render(
        ChatTemplate::chatml().source(),
        json!([{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]),
        None,
        true,
    );
    assert_eq!(
        out,
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn tojson_like_llama_cpp() {
    let src = "{{ messages[0].content | tojson }}|{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ 'é\"\\n' | tojson(ensure_ascii=true) }}|{{ {'a': 1.5, 'b': none, 'c': true} | tojson(separators=(',', ':')) }}";
    let out = render(
        src,
        json!([{"role": "user", "content": "naïve <b> & 'q'"}]),
        Some(
            json!([{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": [1, 2.0]}}}]),
        ),
        false,
    );
    let parts: Vec<&str> = out.split('|').collect();
    assert_eq!(parts[0], "\"naïve <b> & 'q'\"");
    assert_eq!(
        parts[1],
        "[{\"type\": \"function\", \"function\": {\"name\": \"f\", \"description\": \"\", \"parameters\": {\"z\": 1, \"a\": [1, 2]}}}]"
    );
    assert_eq!(
        parts[2],
        "{\n  \"type\": \"function\",\n  \"function\": {\n    \"name\": \"f\",\n    \"description\": \"\",\n    \"parameters\": {\n      \"z\": 1,\n      \"a\": [\n        1,\n        2\n      ]\n    }\n  }\n}"
    );
    assert_eq!(parts[3], "\"\\u00e9\\\"\\n\"");
    assert_eq!(parts[4], "{\"a\":1.5,\"b\":null,\"c\":true}");
}

#[test]
fn python_methods_namespace_loop_controls_and_dates() {
    let src = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}[{{ m.content.strip().upper() }}|{{ m.content.startswith(' a') }}|{{ m.content.split(',') | length }}]{% endfor %}{{ ns.n }}|{{ strftime_now('%Y') | length }}|{{ bos_token }}{{ eos_token }}|{{ undefined_var }}|{{ undefined_var.attr }}{{ true }}";
    let out = render(
        src,
        json!([
            {"role": "user", "content": " a,b "},
            {"role": "assistant", "content": "c"},
            {"role": "user", "content": "d"}
        ]),
        None,
        true,
    );
    // Booleans print the Python way, as in llama.cpp and Jinja2.
    assert_eq!(out, "[A,B|True|2][C|False|1]2|4|<s></s>||True");
}

#[test]
fn tool_calls_arguments_follow_template_usage() {
    // Uses arguments as an object: string arguments are parsed first.
    let object_tmpl = "{% for m in messages %}{% for tc in m.tool_calls %}{{ tc.function.name }}={{ tc.function.arguments | tojson }};{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(object_tmpl, "", "").unwrap();
    assert!(t.uses_object_arguments());
    // Prints arguments as they are: object arguments are serialized compactly.
    let string_tmpl = "{% for m in messages %}{% for tc in m.tool_calls %}{{ tc.function.name }}={{ tc.function.arguments }};{% endfor %}{% endfor %}";
    let s = ChatTemplate::new(string_tmpl, "", "").unwrap();
    assert!(!s.uses_object_arguments());

    let conv = |args: Value| {
        msgs(json!([
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ]))
    };
    let as_string = conv(json!("{\"x\": [1, \"ü\"], \"y\": {\"z\": null}}"));
    let as_object = conv(json!({"x": [1, "ü"], "y": {"z": null}}));
    let want_obj = "f={\"x\": [1, \"ü\"], \"y\": {\"z\": null}};";
    assert_eq!(t.render(&as_string, None, false).unwrap(), want_obj);
    assert_eq!(t.render(&as_object, None, false).unwrap(), want_obj);
    assert_eq!(
        s.render(&as_string, None, false).unwrap(),
        "f={\"x\": [1, \"ü\"], \"y\": {\"z\": null}};"
    );
    assert_eq!(
        s.render(&as_object, None, false).unwrap(),
        "f={\"x\":[1,\"ü\"],\"y\":{\"z\":null}};"
    );
    // Unparseable string arguments for an object-using template are an error.
    assert!(matches!(
        t.render(&conv(json!("{not json")), None, false),
        Err(TokenizerError::InvalidMessage(_))
    ));
}

#[test]
fn message_normalization() {
    let src = "{% for m in messages %}<{{ m.role }}:{{ m.content }}{% if m.name %} name={{ m.name }}{% endif %}{% if m.tool_call_id %} id={{ m.tool_call_id }}{% endif %}>{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}";
    let out = render(
        src,
        json!([
            {"role": "developer", "content": "dev"},
            {"role": "user", "content": [
                {"type": "text", "text": "a"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "b"}
            ]},
            {"role": "tool", "content": "r", "name": "f", "tool_call_id": "c1"},
            {"role": "user", "content": null, "tool_calls": []}
        ]),
        None,
        true,
    );
    assert_eq!(
        out,
        "<system:dev><user:a\nb><tool:r name=f id=c1><user:><gen>"
    );
}

#[test]
fn system_prompt_merged_when_template_ignores_system() {
    let src = "{% for m in messages %}{% if m.role != 'system' %}[{{ m.role }}:{{ m.content }}]{% endif %}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    assert!(!t.supports_system_role());
    let out = t
        .render(
            &msgs(json!([
                {"role": "system", "content": "S"},
                {"role": "user", "content": "U"}
            ])),
            None,
            false,
        )
        .unwrap();
    assert_eq!(out, "[user:S\nU]");
}

#[test]
fn trailing_assistant_message_is_continued() {
    let src = ChatTemplate::chatml().source().to_string();
    let conv = json!([
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "The sky is"}
    ]);
    let want = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nThe sky is";
    assert_eq!(render(&src, conv.clone(), None, true), want);
    assert_eq!(render(&src, conv.clone(), None, false), want);
    let t = ChatTemplate::chatml();
    assert_eq!(
        t.render_plain(&msgs(conv), None, false).unwrap(),
        "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\nThe sky is<|im_end|>\n"
    );
}

#[test]
fn templates_are_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ChatTemplate>();
    assert_send_sync::<tempo9_tokenizer::Tokenizer>();
}
