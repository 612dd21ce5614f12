//! The SDK's overhead, measured (JSON on stdout):
//! - `ttft`: time to the first answer text of a greedy chat in process, and, with
//!   `--http URL` (a running `tempo9 serve` of the same model and settings, which
//!   has served nothing else), of the same request streamed over HTTP;
//! - `tg`: then single-stream decode through [`Model::complete`], as `tempo9
//!   bench` measures it (one prompt token, then N tokens one step each, EOG
//!   ignored), each rep paired with the same run on an `EngineCore` stepped in
//!   this thread as `tempo9 bench` does, on a second copy of the model (MODEL must
//!   be a file path here).
//!
//!
//! With `--alone`, decode runs through the SDK only (no second engine in the
//! process, whose idle CPU thread pool could take cores from the first): compare it
//! with `tempo9 bench` run as a process of its own, alternating the two.
//!
//! `cargo run --release -p tempo9 --example bench -- MODEL [--tg 128] [--reps 3]
//!  [--threads N] [--http http://127.0.0.1:11435] [--alone] [--cached] [--no-ssd]
//!  [--device cpu|cuda|auto]`
//!
//! `--cached` sends each question once both ways, untimed, before its timed pair:
//! both engines then have its prompt in their prefix cache (an agent's next turn),
//! the first token is one step rather than a prefill, and what the in-process path
//! saves (the HTTP request, JSON, SSE framing) is no longer lost in a prefill's
//! spread.
//!
//! `--no-ssd` loads without the SSD tier, as `tempo9 serve --no-kv-ssd` runs (compare
//! like with like).
//!
//! `--device` (default cpu) places the SDK's model; the in-process reference
//! engine runs on the CPU, so use `--alone` with a GPU.

use std::io::{BufRead, BufReader, Write};
use std::time::Instant;

use serde_json::{json, Value};
use tempo9::{ChatOptions, CompleteOptions, CompletionEvent, Event, LoadOptions, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let source = args.next().ok_or("usage: bench MODEL [options]")?;
    let (mut tg, mut reps, mut threads, mut http) = (128usize, 3usize, None, None);
    let mut alone = false;
    let mut cached = false;
    let mut ssd = true;
    let mut device = tempo9::DeviceChoice::Cpu;
    while let Some(a) = args.next() {
        if a == "--alone" {
            alone = true;
            continue;
        }
        if a == "--cached" {
            cached = true;
            continue;
        }
        if a == "--no-ssd" {
            ssd = false;
            continue;
        }
        let v = args.next().ok_or(format!("{a} needs a value"))?;
        match a.as_str() {
            "--tg" => tg = v.parse()?,
            "--reps" => reps = v.parse()?,
            "--threads" => threads = Some(v.parse()?),
            "--http" => http = Some(v),
            "--device" => {
                device = match v.as_str() {
                    "cpu" => tempo9::DeviceChoice::Cpu,
                    "cuda" => tempo9::DeviceChoice::Cuda,
                    "auto" => tempo9::DeviceChoice::Auto,
                    _ => return Err(format!("--device {v}: cpu, cuda or auto").into()),
                }
            }
            _ => return Err(format!("unknown option {a}").into()),
        }
    }
    let model = Model::load(
        &source,
        &LoadOptions {
            threads,
            device,
            ssd: if ssd {
                LoadOptions::default().ssd
            } else {
                None
            },
            ..LoadOptions::default()
        },
    )?;
    let mut ttft_sdk = Vec::new();
    let mut ttft_http = Vec::new();
    // One untimed request each way first (first-use costs: page faults, thread wake-ups).
    let sdk = |q: &str| -> Result<Option<f64>, Box<dyn std::error::Error>> {
        let messages = [json!({"role": "user", "content": q})];
        let t0 = Instant::now();
        let mut s = model.chat(&messages, &[], &ChatOptions::greedy(8))?;
        let first = s.any(|e| matches!(e, Event::Text(ref t) if !t.is_empty()));
        Ok(first.then(|| t0.elapsed().as_secs_f64() * 1e3))
    };
    sdk("Warm-up: name a color.")?;
    if let Some(url) = &http {
        http_ttft(url, "Warm-up: name a color.")?;
    }
    for r in 0..reps {
        // A new question each time, so neither side serves it from its prefix
        // cache; the same question both ways (two engines with the same history);
        // the order alternates between reps.
        let q = format!("Question {r}: name a color.");
        if cached {
            sdk(&q)?;
            settle();
            if let Some(url) = &http {
                http_ttft(url, &q)?;
                settle();
            }
        }
        let http_first = r % 2 == 1;
        if let (true, Some(url)) = (http_first, &http) {
            ttft_http.push(http_ttft(url, &q)?);
            settle();
        }
        ttft_sdk.extend(sdk(&q)?);
        settle();
        if let (false, Some(url)) = (http_first, &http) {
            ttft_http.push(http_ttft(url, &q)?);
            settle();
        }
    }
    // Decode after the latency runs, so both engines had the same history then;
    // each rep runs `tempo9 bench`'s loop (an EngineCore stepped on this thread, no
    // engine thread, no channels) and then the SDK's, so load on a shared machine
    // hits both alike.
    let mut core = if alone {
        None
    } else {
        let direct = tempo9_models::Model::load(
            std::path::Path::new(&source),
            tempo9_models::LoadOptions::new(tempo9_ggml::Device::cpu()),
        )?;
        let tok = std::sync::Arc::new(tempo9_tokenizer::Tokenizer::from_gguf(direct.gguf())?);
        Some(tempo9_engine::EngineCore::new(
            std::sync::Arc::new(direct),
            tok,
            tempo9_engine::EngineConfig {
                threads: threads.unwrap_or_else(tempo9_engine::default_threads),
                ..tempo9_engine::EngineConfig::default()
            },
        )?)
    };
    let vocab = model.tokenize("a b c d e f g h");
    let (mut rates, mut core_rates) = (Vec::new(), Vec::new());
    for r in 0..=reps {
        let prompt = [vocab[r % vocab.len()]];
        let core_rate = match core.as_mut() {
            Some(core) => {
                let mut req = tempo9_engine::Request::new(prompt.to_vec(), tg);
                req.stop.eog = false;
                let t0 = Instant::now();
                let stream = core.submit(req)?;
                core.run_until_idle()?;
                drop(stream);
                Some(tg as f64 / t0.elapsed().as_secs_f64())
            }
            None => None,
        };
        let opts = CompleteOptions {
            max_tokens: tg,
            stop_at_eog: false,
            ..CompleteOptions::default()
        };
        let t0 = Instant::now();
        let n = model
            .complete(&prompt, &opts)?
            .filter(|e| matches!(e, CompletionEvent::Token(_)))
            .count();
        let rate = n as f64 / t0.elapsed().as_secs_f64();
        // The first rep warms both up (first use of every kernel and buffer).
        if r > 0 {
            core_rates.extend(core_rate);
            rates.push(rate);
        }
    }
    let ratios: Vec<f64> = rates.iter().zip(&core_rates).map(|(s, c)| s / c).collect();
    // Pair by pair: how much sooner the first token came in process.
    let saved: Vec<f64> = ttft_http
        .iter()
        .zip(&ttft_sdk)
        .map(|(h, s)| h - s)
        .collect();
    println!(
        "{}",
        json!({
            "model": source,
            "tg": {"n_tokens": tg, "sdk_tok_s": rates, "sdk_median": median(&rates),
                   "core_tok_s": core_rates, "sdk_over_core": ratios,
                   "median_ratio": median(&ratios)},
            "ttft_ms": {"sdk": ttft_sdk, "http": ttft_http,
                        "sdk_median": median(&ttft_sdk), "http_median": median(&ttft_http),
                        "cached": cached, "http_minus_sdk_median": median(&saved),
                        "sdk_sooner": saved.iter().filter(|&&d| d > 0.0).count(),
                        "pairs": saved.len()},
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

/// Waits until the engine that was just timed has stopped computing for that
/// request, so that it does not share the cores with the next measurement: a
/// server learns that a client closed the connection only at its next write, and
/// goes on decoding the request until then (two processes on two cores: that
/// doubled some in-process first tokens).
fn settle() {
    std::thread::sleep(std::time::Duration::from_millis(300));
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    (!s.is_empty()).then(|| s[s.len() / 2])
}
