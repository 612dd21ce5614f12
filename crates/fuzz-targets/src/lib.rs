//! Fuzz targets over every parser of untrusted input: GGUF files, text to tokenize,
//! chat templates, API request JSON, model output through the streaming tool-call
//! parsers, JSON schemas compiled to grammars, and SSD tier files.
//!
//! Each target takes arbitrary bytes and must return (an `Err` inside is fine)
//! without panicking, hanging or overflowing the stack; some also check a property
//! (a tool parser gives the same pieces however its input is split). The cargo-fuzz
//! crate in `fuzz/` calls them under libFuzzer (nightly, `scripts/fuzz.sh`); the
//! stable test `tests/seeded.rs` feeds them the committed seed corpus
//! (`fuzz/corpus/<target>/`) and seeded mutations of it ([`mutate`]).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use serde_json::{json, Value};
use tempo9_gguf::GgufFile;
use tempo9_grammar::{Grammar, GrammarCompiler, SchemaMode};
use tempo9_server::error::Family;
use tempo9_server::tools::{Piece, ToolFormat};
use tempo9_tokenizer::{ChatTemplate, Tokenizer};

mod ssd;
pub use ssd::ssd_files;

/// A fuzz target: arbitrary bytes in, a panic on a failure.
pub type Target = fn(&[u8]);

/// Every target by name (the names of `fuzz/fuzz_targets/*.rs` and corpus folders).
pub const TARGETS: &[(&str, Target)] = &[
    ("gguf", gguf),
    ("tokenizer", tokenizer),
    ("chat_template", chat_template),
    ("requests", requests),
    ("tool_parsers", tool_parsers),
    ("json_schema", json_schema),
    ("ssd_files", ssd_files),
];

/// Where the real test models are (`scripts/fetch-models.sh`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("TEMPO9_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/tempo9/models")
        })
}

/// SmolLM2-135M's tokenizer (byte-level BPE with ChatML control tokens), loaded once.
pub fn smol_tokenizer() -> &'static Arc<Tokenizer> {
    static TOK: OnceLock<Arc<Tokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let path = models_dir().join("smollm2-135m-instruct-q4_1.gguf");
        let f = GgufFile::open(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run scripts/fetch-models.sh)", path.display()));
        Arc::new(Tokenizer::from_gguf(&f).expect("SmolLM2's tokenizer"))
    })
}

fn grammar_compiler() -> &'static GrammarCompiler {
    static C: OnceLock<GrammarCompiler> = OnceLock::new();
    C.get_or_init(|| GrammarCompiler::for_tokenizer(smol_tokenizer()).expect("grammar compiler"))
}

/// Splits `data` at the first `sep` byte: (before, after).
fn split_at_byte(data: &[u8], sep: u8) -> (&[u8], &[u8]) {
    match data.iter().position(|&b| b == sep) {
        Some(i) => (&data[..i], &data[i + 1..]),
        None => (data, &[]),
    }
}

/// A GGUF file: parse it, read every tensor's bytes, and build a tokenizer and a
/// chat template from its metadata.
pub fn gguf(data: &[u8]) {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for (k, v) in f.metadata().iter() {
        let _ = (k.len(), v.type_name(), v.as_integer());
    }
    for t in f.tensors() {
        let _ = (t.n_elements(), f.tensor_bytes(t).len());
    }
    let _ = f.architecture();
    if let Ok(tok) = Tokenizer::from_gguf(&f) {
        let ids = tok.encode("Hello <|im_start|> wörld 123", true, true);
        let _ = tok.decode(&ids, false);
        if let Ok(Some(t)) = ChatTemplate::from_gguf(&f, &tok) {
            let _ = t.render(&[json!({"role": "user", "content": "hi"})], None, true);
        }
    }
}

/// Text through SmolLM2's tokenizer with and without special-token parsing, and
/// arbitrary token ids through the decoder. Plain text must decode to its own
/// bytes, less those SmolLM2's vocabulary has no token for (0x04 and 0xF2 among
/// them: it drops them, as llama.cpp does).
pub fn tokenizer(data: &[u8]) {
    let tok = smol_tokenizer();
    let text = String::from_utf8_lossy(data);
    for (add, parse) in [(false, false), (true, true), (false, true)] {
        let ids = tok.encode(&text, add, parse);
        if !add && !parse {
            let want: Vec<u8> = text.bytes().filter(|&b| byte_has_token(tok, b)).collect();
            assert_eq!(
                String::from_utf8_lossy(&tok.decode_bytes(&ids, false)),
                String::from_utf8_lossy(&want),
                "plain text must round-trip"
            );
        }
    }
    let _ = tok.encode_prompt(&text, true);
    // Arbitrary ids, including ones past the vocabulary.
    let ids: Vec<u32> = data
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32 * 2)
        .collect();
    let _ = tok.decode(&ids, true);
    let _ = tok.decode_bytes(&ids, false);
    let mut stream = tempo9_tokenizer::StreamDecoder::new(tok, false);
    for &id in &ids {
        let _ = stream.push(tok, id);
    }
    let _ = stream.finish(tok);
}

/// Whether byte-level BPE has a token for byte `b` (GPT-2's byte-to-character map:
/// printable Latin-1 bytes stand for themselves, the others for U+0100 onwards).
fn byte_has_token(tok: &Tokenizer, b: u8) -> bool {
    let printable = |x: u8| matches!(x, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let c = if printable(b) {
        char::from(b)
    } else {
        let n = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + n).expect("a character")
    };
    tok.token_id(&c.to_string()).is_some()
}

/// A chat template (before the first NUL byte) rendering a conversation whose
/// message text is the rest: must end (fuel, output and recursion limits), and its
/// prompt must tokenize.
pub fn chat_template(data: &[u8]) {
    let (src, rest) = split_at_byte(data, 0);
    let src = String::from_utf8_lossy(src);
    let text = String::from_utf8_lossy(rest);
    let Ok(t) = ChatTemplate::new(&src, "<s>", "</s>") else {
        return;
    };
    let messages = [
        json!({"role": "system", "content": text}),
        json!({"role": "user", "content": "What is 2+2? <|im_end|>"}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": "f", "arguments": {"x": text}}}]}),
        json!({"role": "tool", "content": text}),
    ];
    let tools = [
        json!({"type": "function", "function": {"name": "f", "description": text,
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}),
    ];
    if let Ok(prompt) = t.render(&messages, Some(&tools), true) {
        let _ = smol_tokenizer().encode_prompt(&prompt, true);
    }
}

/// A request body as each API reads it: every conversion from request JSON to the
/// engine's parameters and the template's messages, then the ChatML rendering and
/// tokenization of the messages that were accepted.
pub fn requests(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    use tempo9_server::{anthropic, ollama, openai, responses};
    for family in [Family::OpenAi, Family::Anthropic, Family::Ollama] {
        let _ = openai::sampling(&v, family);
        let _ = openai::chat_tools(&v, family);
        let _ = openai::template_options(&v, family);
        let _ = openai::tool_choice(&v, family);
        let _ = openai::stop_strings(&v, "stop", family);
        let _ = openai::response_format(&v, family);
    }
    // The handlers' private glue (Ollama options and format, Anthropic tool choice).
    tempo9_server::request_glue(&v);
    let mut conversations = Vec::new();
    conversations.extend(openai::check_messages(&v).ok());
    conversations.extend(anthropic::to_openai_messages(&v).ok());
    conversations.extend(ollama::to_openai_messages(&v).ok());
    conversations.extend(responses::to_messages(&v).ok());
    let tools: Vec<Vec<Value>> = [
        openai::chat_tools(&v, Family::OpenAi).ok(),
        anthropic::to_openai_tools(&v).ok(),
        responses::to_tools(&v).ok(),
    ]
    .into_iter()
    .flatten()
    .collect();
    let t = ChatTemplate::chatml();
    for m in &conversations {
        let tools = tools.first().filter(|t| !t.is_empty());
        if let Ok(prompt) = t.render(m, tools.map(|t| t.as_slice()), true) {
            let _ = smol_tokenizer().encode_prompt(&prompt, true);
        }
    }
}

/// Merges adjacent text and adjacent reasoning pieces (a split may cut one piece
/// in two; that is not a difference).
fn merged(pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for p in pieces {
        match (out.last_mut(), p) {
            (Some(Piece::Text(a)), Piece::Text(b)) => a.push_str(&b),
            (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
            (Some(Piece::CallArgs(a)), Piece::CallArgs(b)) => a.push_str(&b),
            (_, p) => out.push(p),
        }
    }
    out.retain(|p| !matches!(p, Piece::Text(s) | Piece::Reasoning(s) if s.is_empty()));
    out
}

/// Checks the promise of a parser that streams calls: a `CallStart` is followed
/// by its `CallArgs` and then its `Call`, with the same name and arguments that
/// begin with the streamed text and are a JSON object.
fn check_streamed_calls(pieces: &[Piece]) {
    let mut open: Option<(&str, String)> = None;
    for p in pieces {
        match (p, &mut open) {
            (Piece::CallStart(n), None) => open = Some((n, String::new())),
            (Piece::CallArgs(a), Some((_, sent))) => sent.push_str(a),
            (Piece::Call(c), Some((name, sent))) => {
                assert_eq!(c.name, *name, "{pieces:?}");
                assert!(c.arguments.starts_with(sent.as_str()), "{pieces:?}");
                let v = serde_json::from_str::<Value>(&c.arguments);
                assert!(v.is_ok_and(|v| v.is_object()), "{pieces:?}");
                open = None;
            }
            (Piece::Call(_) | Piece::Text(_) | Piece::Reasoning(_), None) => {}
            (p, o) => panic!("{p:?} with {o:?} open in {pieces:?}"),
        }
    }
    assert!(open.is_none(), "unfinished call in {pieces:?}");
}

/// Model output through each family's streaming tool-call parser, whole and split
/// at arbitrary points: the pieces must be the same, with calls whole and with
/// calls streamed ([`tempo9_server::tools::ToolParser::stream_calls`]); streamed
/// calls must keep the parser's promise, and a parser that streamed no call
/// must give what it gives with calls whole. Byte 0 picks the format, byte 1
/// the split seed; the rest is the output.
pub fn tool_parsers(data: &[u8]) {
    if data.len() < 2 {
        return;
    }
    const FORMATS: [ToolFormat; 7] = [
        ToolFormat::Hermes,
        ToolFormat::QwenXml,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Harmony,
        ToolFormat::Gemma4,
        ToolFormat::None,
    ];
    let format = FORMATS[data[0] as usize % FORMATS.len()];
    let text = String::from_utf8_lossy(&data[2..]);
    let tools = [
        json!({"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
            "days": {"type": "integer"}}}}}),
    ];
    let run = |chunks: &[&str], stream: bool| {
        let mut p = format.parser(&tools, true);
        if stream {
            p.stream_calls();
        }
        let mut out = Vec::new();
        for c in chunks {
            p.push(c, &mut out);
            let _ = p.in_reasoning();
        }
        p.finish(&mut out);
        merged(out)
    };
    let whole = run(&[&text], false);
    // Split points on char boundaries, from a small generator seeded by byte 1.
    let mut seed = data[1] as u64 | 0x100;
    let mut chunks = Vec::new();
    let mut at = 0;
    while at < text.len() {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut end = (at + 1 + (seed >> 60) as usize).min(text.len());
        while !text.is_char_boundary(end) {
            end += 1;
        }
        chunks.push(&text[at..end]);
        at = end;
    }
    let split = run(&chunks, false);
    assert_eq!(
        whole, split,
        "{format:?} parsed {text:?} differently in chunks {chunks:?}"
    );
    let streamed = run(&[&text], true);
    check_streamed_calls(&streamed);
    let split = run(&chunks, true);
    assert_eq!(
        streamed, split,
        "{format:?} streamed {text:?} differently in chunks {chunks:?}"
    );
    if !streamed.iter().any(|p| matches!(p, Piece::CallStart(_))) {
        assert_eq!(whole, streamed, "{format:?} streamed {text:?}");
    }
}

/// A JSON schema (or an OpenAI `response_format`, an Ollama `format`, a regex or a
/// Lark grammar, by the first byte) compiled to a grammar for SmolLM2's vocabulary,
/// and its first token masks computed.
pub fn json_schema(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let grammar = match mode % 6 {
        0 | 1 => serde_json::from_slice::<Value>(rest).ok().and_then(|v| {
            let m = if mode % 6 == 0 {
                SchemaMode::Strict
            } else {
                SchemaMode::Lenient
            };
            Grammar::json_schema(&v, m).ok()
        }),
        2 => serde_json::from_slice::<Value>(rest)
            .ok()
            .and_then(|v| Grammar::from_openai_response_format(&v).ok().flatten()),
        3 => serde_json::from_slice::<Value>(rest)
            .ok()
            .and_then(|v| Grammar::from_ollama_format(&v).ok().flatten()),
        4 => Grammar::regex(&String::from_utf8_lossy(rest)).ok(),
        _ => Grammar::lark(&String::from_utf8_lossy(rest)).ok(),
    };
    let Some(g) = grammar else {
        return;
    };
    let _ = g.bounds();
    let Ok(mut c) = grammar_compiler().compile(&g) else {
        return;
    };
    // A few steps: the mask, then its first allowed token.
    for _ in 0..4 {
        let Ok(mask) = c.compute_mask_words() else {
            return;
        };
        let Some(t) = mask
            .iter()
            .enumerate()
            .find(|(_, w)| **w != 0)
            .map(|(i, w)| i as u32 * 32 + w.trailing_zeros())
        else {
            return;
        };
        if c.accept_token(t).is_err() || c.is_finished() {
            return;
        }
    }
}

/// A small deterministic generator (SplitMix64) for [`mutate`] and the tests.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.bits() % n as u64) as usize
    }
}

/// Tokens that steer mutations towards the parsers' syntax.
const DICTIONARY: &[&[u8]] = &[
    b"<tool_call>",
    b"</tool_call>",
    b"<function=",
    b"<parameter=",
    b"</parameter>",
    b"[TOOL_CALLS]",
    b"[ARGS]",
    b"<|python_tag|>",
    b"<|channel|>",
    b"<|message|>",
    b"<|call|>",
    b"<|tool_call>",
    b"<tool_call|>",
    b"<|\"|>",
    b"<think>",
    b"</think>",
    b"<|im_start|>",
    b"<|im_end|>",
    b"{{",
    b"}}",
    b"{%",
    b"%}",
    b"{% for x in range(999999) %}",
    b"{% macro m() %}{{ m() }}{% endmacro %}",
    b"\"$ref\"",
    b"\"anyOf\"",
    b"\"properties\"",
    b"\"messages\"",
    b"\"content\"",
    b"\"tool_calls\"",
    b"null",
    b"[[[[[[[[",
    b"{\"",
    b"\\u0000",
    b"\xff\xfe",
    b"GGUF",
];

/// A mutation of `input`: byte flips, insertions, deletions, duplications,
/// dictionary tokens and interesting integers, a few at a time.
pub fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let n = v.len();
        match rng.below(8) {
            0 if n > 0 => {
                let i = rng.below(n);
                v[i] ^= 1 << rng.below(8);
            }
            1 if n > 0 => {
                let i = rng.below(n);
                v[i] = rng.bits() as u8;
            }
            2 => {
                let i = rng.below(n + 1);
                v.insert(i, rng.bits() as u8);
            }
            3 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                v.drain(i..i + len);
            }
            4 if n > 0 => {
                let i = rng.below(n);
                let len = 1 + rng.below((n - i).min(64));
                let piece = v[i..i + len].to_vec();
                let at = rng.below(n + 1);
                v.splice(at..at, piece);
            }
            5 | 6 => {
                let tok = DICTIONARY[rng.below(DICTIONARY.len())];
                let i = rng.below(n + 1);
                v.splice(i..i, tok.iter().copied());
            }
            _ if n >= 8 => {
                // An interesting integer over 1, 4 or 8 bytes (sizes, counts, offsets).
                let vals = [
                    0u64,
                    1,
                    0x7f,
                    0xff,
                    0xffff,
                    0x7fff_ffff,
                    u32::MAX as u64,
                    u64::MAX,
                ];
                let x = vals[rng.below(vals.len())];
                let w = [1, 4, 8][rng.below(3)];
                let i = rng.below(n - w + 1);
                v[i..i + w].copy_from_slice(&x.to_le_bytes()[..w]);
            }
            _ => {}
        }
    }
    v.truncate(1 << 16);
    v
}

/// Seeds built in code (binary formats): a small GGUF file with a BPE vocabulary,
/// a chat template and two tensors.
pub fn generated_seeds(target: &str) -> Vec<Vec<u8>> {
    match target {
        "gguf" => vec![small_gguf()],
        _ => Vec::new(),
    }
}

/// A valid GGUF file of a few hundred bytes.
pub fn small_gguf() -> Vec<u8> {
    use tempo9_gguf::{ArrayValue, GgmlType, GgufWriter, Value as G};
    let mut w = GgufWriter::new();
    w.set("general.architecture", G::String("llama".into()));
    w.set("tokenizer.ggml.model", G::String("gpt2".into()));
    w.set("tokenizer.ggml.pre", G::String("smollm".into()));
    let tokens: Vec<String> = ["<|im_start|>", "<|im_end|>", "a", "b", "ab", "Ġ", "Ġa", "c"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    w.set(
        "tokenizer.ggml.tokens",
        G::Array(ArrayValue::String(tokens)),
    );
    w.set(
        "tokenizer.ggml.token_type",
        G::Array(ArrayValue::I32(vec![3, 3, 1, 1, 1, 1, 1, 1])),
    );
    w.set(
        "tokenizer.ggml.merges",
        G::Array(ArrayValue::String(vec!["a b".into(), "Ġ a".into()])),
    );
    w.set("tokenizer.ggml.bos_token_id", G::U32(0));
    w.set("tokenizer.ggml.eos_token_id", G::U32(1));
    w.set(
        "tokenizer.chat_template",
        G::String(
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                .into(),
        ),
    );
    w.add_tensor("a", &[4], GgmlType::F32).expect("tensor");
    w.add_tensor("b", &[2, 2], GgmlType::F32).expect("tensor");
    w.to_bytes(|i| vec![i as u8; 16]).expect("GGUF bytes")
}
