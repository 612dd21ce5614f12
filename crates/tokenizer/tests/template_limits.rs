//! Hostile chat templates (a GGUF file's template is code from the internet):
//! an endless loop, a huge output and a recursion bomb each fail with a clear
//! error within their limit, at start-up (`ChatTemplate::new` probes the
//! template) and per render, on a thread with tokio's 2 MiB stack.

use std::time::{Duration, Instant};

use serde_json::json;
use tempo9_tokenizer::{ChatTemplate, TEMPLATE_DEADLINE, TEMPLATE_FUEL};

/// Compiles `src` and renders one user message on a 2 MiB-stack thread; the
/// error and the seconds the whole took.
fn hostile(src: &'static str) -> (String, f64) {
    let t0 = Instant::now();
    let err = std::thread::Builder::new()
        .stack_size(2 << 20)
        .spawn(move || {
            let t = ChatTemplate::new(src, "<s>", "</s>").expect("compiles");
            let msgs = [json!({"role": "user", "content": "Hi"})];
            t.render(&msgs, None, true)
                .expect_err("must fail")
                .to_string()
        })
        .unwrap()
        .join()
        .expect("no crash");
    (err, t0.elapsed().as_secs_f64())
}

#[test]
fn an_endless_loop_runs_out_of_fuel() {
    let (err, secs) = hostile(
        "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i * j %}{% endfor %}{% endfor %}",
    );
    eprintln!("endless loop: {secs:.2} s (start-up probes and one render): {err}");
    assert!(
        err.contains("TEMPLATE_FUEL") && err.contains(&TEMPLATE_FUEL.to_string()),
        "{err}"
    );
    // Seven renders of at most TEMPLATE_FUEL steps each (six probes, one request).
    assert!(secs < 30.0, "{secs} s");
}

#[test]
fn a_huge_output_is_cut_off() {
    let (err, secs) = hostile(
        "{% for i in range(100000) %}{% for j in range(100) %}{{ 'x' * 100000 }}{% endfor %}{% endfor %}",
    );
    eprintln!("huge output: {secs:.2} s: {err}");
    assert!(err.contains("exceeds 64 MiB"), "{err}");
    assert!(secs < 30.0, "{secs} s");
}

#[test]
fn a_recursion_bomb_stops_at_the_limit() {
    let (err, secs) = hostile("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
    eprintln!("recursion: {secs:.2} s: {err}");
    assert!(err.contains("recursion"), "{err}");
    assert!(secs < Duration::from_secs(10).as_secs_f64());
}

#[test]
fn one_render_stays_well_under_its_fuel() {
    // A real template (ChatML) on a long conversation uses a sliver of the
    // budget: the limit does not cut real prompts.
    let t = ChatTemplate::chatml();
    let msgs: Vec<_> = (0..5000)
        .map(|i| json!({"role": if i % 2 == 0 {"user"} else {"assistant"}, "content": format!("message {i}")}))
        .collect();
    let out = t.render(&msgs, None, true).expect("renders");
    assert!(out.contains("message 4999"));
}

#[test]
fn costly_steps_stop_at_the_deadline() {
    // Within its fuel (a few steps per outer item), but each `join` walks
    // 99,999 items: minutes of CPU without the deadline. Only a request asking
    // for it is slow, so the start-up probes pass.
    let (err, secs) = hostile(
        "{% if messages[0].content == 'Hi' %}{% for i in range(100000) %}{% set x = range(99999)|join %}{% endfor %}{% endif %}",
    );
    eprintln!("costly steps: {secs:.2} s: {err}");
    assert!(err.contains("TEMPLATE_DEADLINE"), "{err}");
    let limit = TEMPLATE_DEADLINE.as_secs_f64();
    assert!(secs > limit && secs < limit + 10.0, "{secs} s");
}

#[test]
fn range_keeps_its_meaning() {
    let t = ChatTemplate::new(
        "{{ range(3)|list }}{{ range(1, 7, 2)|join(',') }}{{ range(5, 0, -2)|list }}{{ range(4)|length }}{% for i in range(2) %}[{{ i }}{{ loop.last }}]{% endfor %}",
        "<s>",
        "</s>",
    )
    .expect("compiles");
    let msgs = [json!({"role": "user", "content": "Hi"})];
    assert_eq!(
        t.render(&msgs, None, true).expect("renders"),
        "[0, 1, 2]1,3,5[5, 3, 1]4[0False][1True]"
    );
    let t = ChatTemplate::new("{{ range(200000)|length }}", "<s>", "</s>").expect("compiles");
    let err = t
        .render(&msgs, None, true)
        .expect_err("too long")
        .to_string();
    assert!(err.contains("too many elements"), "{err}");
}

#[test]
fn a_render_past_its_deadline_is_given_up_on() {
    // Costly steps in a loop over a string the template built (no range(), no
    // output): the in-render checks cannot see them, so the caller stops
    // waiting at the deadline and the template renders nothing else until
    // that render ends (minutes here: the test process ends first).
    let t = ChatTemplate::new(
        "{% if messages[0].content == 'Hi' %}{% set s = 'ab' * 500000 %}{% for c in s %}{% set t = s|upper %}{% endfor %}{% endif %}",
        "<s>",
        "</s>",
    )
    .expect("compiles");
    let msgs = [json!({"role": "user", "content": "Hi"})];
    let t0 = Instant::now();
    let err = t
        .render(&msgs, None, true)
        .expect_err("over time")
        .to_string();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("given up on: {secs:.2} s: {err}");
    assert!(err.contains("TEMPLATE_DEADLINE"), "{err}");
    let limit = TEMPLATE_DEADLINE.as_secs_f64();
    assert!(secs > limit && secs < limit + 3.0, "{secs} s");
    let t0 = Instant::now();
    let err = t
        .render(&msgs, None, true)
        .expect_err("refused")
        .to_string();
    assert!(err.contains("still running"), "{err}");
    assert!(t0.elapsed() < Duration::from_millis(500));
}
