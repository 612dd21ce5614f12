//! The SDK's overhead, measured (JSON on stdout):
//! - `tg`: single-stream decode through [`Model::complete`], as `tempo9 bench`
//!   measures it (one random prompt token, then N tokens one step each, EOG ignored);
//! - `ttft`: time to the first answer text of a greedy chat in process, and, with
//!   `--http URL` (a running `tempo9 serve` of the same model), of the same
//!   request streamed over HTTP.
//!
//! `cargo run --release -p tempo9 --example bench -- MODEL [--tg 128] [--reps 3]
//!  [--threads N] [--http http://127.0.0.1:11435]`

use std::io::{BufRead, BufReader, Write};
use std::time::Instant;

use serde_json::{json, Value};
use tempo9::{ChatOptions, CompleteOptions, CompletionEvent, Event, LoadOptions, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let source = args.next().ok_or("usage: bench MODEL [options]")?;
    let (mut tg, mut reps, mut threads, mut http) = (128usize, 3usize, None, None);
    while let Some(a) = args.next() {
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--tg" => tg = v.parse()?,
            "--reps" => reps = v.parse()?,
            "--threads" => threads = Some(v.parse()?),
            "--http" => http = Some(v),
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    let model = Model::load(
        &source,
        &LoadOptions {
            threads,
            ..LoadOptions::default()
        },
    )?;
    let vocab = model.tokenize("a b c d e f g h");
    let mut rates = Vec::new();
    for r in 0..reps {
        let opts = CompleteOptions {
            max_tokens: tg,
            stop_at_eog: false,
            ..CompleteOptions::default()
        };
        let prompt = [vocab[r % vocab.len()]];
        let t0 = Instant::now();
        let n = model
            .complete(&prompt, &opts)?
            .filter(|e| matches!(e, CompletionEvent::Token(_)))
            .count();
        rates.push(n as f64 / t0.elapsed().as_secs_f64());
    }
    let mut ttft_sdk = Vec::new();
    let mut ttft_http = Vec::new();
    for r in 0..reps {
        // A new question each time, so neither side serves the answer's prompt from cache.
        let q = format!("Question {r}: name a color.");
        let messages = [json!({"role": "user", "content": q})];
        let t0 = Instant::now();
        let mut s = model.chat(&messages, &[], &ChatOptions::greedy(8))?;
        if s.any(|e| matches!(e, Event::Text(ref t) if !t.is_empty())) {
            ttft_sdk.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        drop(s);
        if let Some(url) = &http {
            let q = format!("Question {r} over HTTP: name a color.");
            ttft_http.push(http_ttft(url, &q)?);
        }
    }
    println!(
        "{}",
        json!({
            "model": source,
            "tg": {"n_tokens": tg, "tok_s": rates},
            "ttft_ms": {"sdk": ttft_sdk, "http": ttft_http},
        })
    );
    Ok(())
}

/// Milliseconds from connecting to the first streamed answer text of a greedy
/// chat completion at `url` (plain HTTP/1.1 on a socket: no client library's
/// own overhead).
fn http_ttft(url: &str, question: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let host = url.trim_start_matches("http://").trim_end_matches('/');
    let body = json!({"messages": [{"role": "user", "content": question}],
                      "temperature": 0, "max_tokens": 8, "stream": true})
    .to_string();
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect(host)?;
    s.set_nodelay(true)?;
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    for line in BufReader::new(s).lines() {
        let line = line?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if v["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
        {
            return Ok(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    Err("the stream ended without text".into())
}
