//! Properties of the three real models beyond the recorded fixtures: special
//! tokens and EOG sets (as llama-server logs them), streaming over byte
//! fallback, and speed.

mod common;

use std::time::{Duration, Instant};

use common::{open_model, MODELS};
use tempo9_tokenizer::{ChatTemplate, StreamDecoder, Tokenizer, TokenizerKind};

fn load(i: usize) -> Option<Tokenizer> {
    let gguf = open_model(MODELS[i].1)?;
    Some(Tokenizer::from_gguf(&gguf).expect("tokenizer"))
}

/// Generous in debug builds; release must be fast.
fn budget(release: Duration) -> Duration {
    if cfg!(debug_assertions) {
        release * 20
    } else {
        release
    }
}

#[test]
fn smollm2_special_tokens() {
    let Some(t) = load(0) else { return };
    assert_eq!(t.kind(), TokenizerKind::Bpe);
    assert_eq!(t.vocab_size(), 49152);
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert_eq!(t.eot(), Some(0));
    // llama-server: EOG = <|endoftext|>, <|im_end|>, <reponame>.
    assert_eq!(t.eog_tokens(), vec![0, 2, 4]);
    assert!(!t.add_bos());
    assert!(t.is_control(1));
    assert_eq!(t.token_text(1), Some("<|im_start|>"));
    assert_eq!(t.encode("<|im_start|>user", false, true)[0], 1);
}

#[test]
fn qwen_special_tokens() {
    let Some(t) = load(1) else { return };
    assert_eq!(t.vocab_size(), 151936);
    assert_eq!(t.eos(), Some(151645));
    let eog: Vec<&str> = t
        .eog_tokens()
        .iter()
        .map(|&i| t.token_text(i).unwrap())
        .collect();
    // As llama-server logs it, including the plain-text "</s>" it promotes.
    assert_eq!(
        eog,
        [
            "</s>",
            "<|endoftext|>",
            "<|im_end|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>"
        ]
    );
    // <tool_call> is user-defined: recognised even without parse_special.
    let tc = t.token_id("<tool_call>").unwrap();
    assert!(t.is_user_defined(tc));
    assert_eq!(t.encode("<tool_call>", false, false), vec![tc]);
    assert_eq!(t.token_bytes(tc), b"<tool_call>");
    // Control text stays text without parse_special.
    assert!(t.encode("<|im_end|>", false, false).len() > 1);
    assert_eq!(t.encode("<|im_end|>", false, true), vec![151645]);
    assert_eq!(t.token_bytes(151645), b"");
    assert_eq!(t.token_piece(151645, true), b"<|im_end|>");
}

#[test]
fn gemma3_special_tokens() {
    let Some(t) = load(2) else { return };
    assert_eq!(t.kind(), TokenizerKind::Spm);
    assert_eq!(t.vocab_size(), 262144);
    assert_eq!(t.bos(), Some(2));
    assert_eq!(t.eos(), Some(1));
    assert!(t.add_bos());
    let eot = t.token_id("<end_of_turn>").unwrap();
    assert_eq!(t.eot(), Some(eot));
    assert_eq!(t.eog_tokens(), vec![1, eot, 212]);
    assert_eq!(t.token_text(212), Some("</s>"));
    assert_eq!(t.encode("hi", true, true)[0], 2);
}

#[test]
fn gemma3_streams_byte_fallback_emoji() {
    let Some(t) = load(2) else { return };
    // 🦩 and 🧌 are not in the vocabulary: four <0xXX> tokens each.
    let text = "Flamingo 🦩 and troll 🧌, done.";
    let ids = t.encode(text, true, false);
    assert!(ids.iter().filter(|&&i| t.is_byte(i)).count() >= 8);
    let whole = t.decode(&ids, true);
    assert_eq!(whole, text);
    let mut d = StreamDecoder::new(&t, true);
    let mut acc = String::new();
    for &i in &ids {
        let delta = d.push(&t, i);
        assert!(!delta.contains('\u{FFFD}'), "broken UTF-8 after {i}");
        acc.push_str(&delta);
        assert!(whole.starts_with(&acc));
    }
    acc.push_str(&d.finish(&t));
    assert_eq!(acc, whole);
}

fn long_prompt() -> String {
    let mut s = String::new();
    let para = "fn main() {\n    let v: Vec<u32> = (0..100).map(|x| x * 2).collect();\n    println!(\"{:?} — naïve café, 東京 😀\", v);\n}\n\nThe quick brown fox jumps over the lazy dog; 3.14159 × 2 = 6.28318.\n{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}\n\t\t  indented   text  \n";
    while s.len() < 60_000 {
        s.push_str(para);
    }
    s
}

#[test]
fn encoding_a_long_prompt_is_fast() {
    let text = long_prompt();
    for (i, (name, _)) in MODELS.iter().enumerate() {
        let Some(t) = load(i) else { continue };
        let _ = t.encode(&text[..1000], true, true);
        let t0 = Instant::now();
        let ids = t.encode(&text, true, true);
        let took = t0.elapsed();
        eprintln!("{}: {} tokens in {took:?}", name, ids.len());
        assert!(ids.len() > 10_000, "{}: {}", name, ids.len());
        assert!(
            took < budget(Duration::from_millis(300)),
            "{}: {took:?}",
            name
        );
        assert_eq!(t.decode(&ids, true).trim_start(), text);
    }
}

#[test]
fn building_tokenizers_is_fast() {
    for (dir, file) in MODELS {
        let Some(gguf) = open_model(file) else {
            continue;
        };
        let t0 = Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
        let took = t0.elapsed();
        eprintln!("{dir}: built {} tokens in {took:?}", tok.vocab_size());
        assert!(took < budget(Duration::from_millis(900)), "{dir}: {took:?}");
        let tmpl = ChatTemplate::from_gguf(&gguf, &tok).expect("template");
        assert_eq!(tmpl.is_some(), dir != "gemma3", "{dir}");
        // gemma3 has no template: ChatML with its own BOS/EOS text.
        let any = ChatTemplate::for_model(&gguf, &tok).expect("template");
        if dir == "gemma3" {
            assert_eq!(any.source(), ChatTemplate::chatml().source());
            assert_eq!((any.bos_token(), any.eos_token()), ("<bos>", "<eos>"));
        }
    }
}
