//! llama.cpp's vocab-only GGUFs (`ggml-vocab-<name>.gguf` from its `models/`,
//! copied to `~/.cache/tempo9/vocab/` by `scripts/fetch-models.sh vocab`):
//! llama.cpp's own test vectors beside each file (`.inp` / `.out`, as
//! `tests/test-tokenizer-0.cpp` reads them: no special tokens added, special
//! text not parsed), and the corpus as llama.cpp's `llama-tokenize` split it
//! (`tests/fixtures/<name>-vocab/tokenize.json`, recorded by
//! `scripts/fixtures/tokenize_vocab.py`).

mod common;

use common::{clip, load_fixture, vocab_file};
use tempo9_gguf::GgufFile;
use tempo9_tokenizer::Tokenizer;

fn open(name: &str) -> Option<Tokenizer> {
    let path = vocab_file(&format!("ggml-vocab-{name}.gguf"))?;
    let gguf = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Some(Tokenizer::from_gguf(&gguf).expect("tokenizer"))
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// `.inp` holds the texts separated by `\n__ggml_vocab_test__\n`; `.out`
/// one line of space-separated ids per text.
fn check_test_vectors(name: &str) {
    let Some(tok) = open(name) else {
        return;
    };
    let inp = vocab_file(&format!("ggml-vocab-{name}.gguf.inp")).expect("test inputs");
    let out = vocab_file(&format!("ggml-vocab-{name}.gguf.out")).expect("test outputs");
    let inp = std::fs::read_to_string(inp).expect("inp");
    let out = std::fs::read_to_string(out).expect("out");
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let mut texts: Vec<&str> = inp.split(SEP).collect();
    if texts.last() == Some(&"") {
        texts.pop();
    }
    let wants: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(texts.len(), wants.len(), "{name}: .inp and .out disagree");
    assert!(
        texts.len() >= 40,
        "{name}: only {} test vectors",
        texts.len()
    );
    let mut failures = Vec::new();
    for (text, want) in texts.iter().zip(&wants) {
        let got = tok.encode(text, false, false);
        if &got != want {
            failures.push(format!("{}: want {want:?} got {got:?}", clip(text)));
        }
    }
    eprintln!(
        "{name}: {}/{} llama.cpp test vectors match",
        texts.len() - failures.len(),
        texts.len()
    );
    for f in &failures {
        eprintln!("  {f}");
    }
    assert!(failures.is_empty(), "{name}: {} mismatches", failures.len());
}

fn check_corpus(name: &str) {
    let Some(tok) = open(name) else {
        return;
    };
    let fixture = load_fixture(&format!("{name}-vocab"), "tokenize.json");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 300, "{name}: only {} cases", cases.len());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().expect("text");
        for (key, special) in [("ids", true), ("ids_plain", false)] {
            let want = ids(&case[key]);
            let got = tok.encode(text, special, special);
            if got != want {
                failures.push(format!(
                    "case {i} {key} {}: want {want:?} got {got:?}",
                    clip(text)
                ));
            }
        }
        // Byte-level BPE is lossless: the plain ids spell the text again.
        let mut bytes = Vec::new();
        for id in ids(&case["ids_plain"]) {
            bytes.extend_from_slice(tok.token_piece(id, true));
        }
        if bytes != text.as_bytes() {
            failures.push(format!("case {i} does not round-trip: {}", clip(text)));
        }
    }
    eprintln!(
        "{name}: {} corpus cases, {} mismatches",
        cases.len(),
        failures.len()
    );
    for f in failures.iter().take(30) {
        eprintln!("  {f}");
    }
    assert!(failures.is_empty(), "{name}: {} mismatches", failures.len());
}

#[test]
fn qwen35_test_vectors_match_llama_cpp() {
    check_test_vectors("qwen35");
}

#[test]
fn qwen35_corpus_matches_llama_tokenize() {
    check_corpus("qwen35");
}

#[test]
fn qwen2_test_vectors_match_llama_cpp() {
    check_test_vectors("qwen2");
}

#[test]
fn qwen2_corpus_matches_llama_tokenize() {
    check_corpus("qwen2");
}

#[test]
fn llama_bpe_test_vectors_match_llama_cpp() {
    check_test_vectors("llama-bpe");
}

#[test]
fn llama_bpe_corpus_matches_llama_tokenize() {
    check_corpus("llama-bpe");
}

#[test]
fn gemma_4_test_vectors_match_llama_cpp() {
    check_test_vectors("gemma-4");
}

#[test]
fn gemma_4_corpus_matches_llama_tokenize() {
    check_corpus("gemma-4");
}
