//! Every case of `tests/fixtures/<model>/tokenize.json` (recorded from
//! llama.cpp's llama-server) must match exactly: ids (add_special,
//! parse_special), ids_plain (neither), and the detokenization of ids_plain
//! (the server concatenates per-token pieces with special = true).

mod common;

use common::{clip, load_fixture, open_model, CODER_1_5B, MODELS};
use tempo9_tokenizer::{StreamDecoder, Tokenizer};

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn check_model(dir: &str, file: &str) {
    let Some(gguf) = open_model(file) else {
        return;
    };
    let t0 = std::time::Instant::now();
    let tok = Tokenizer::from_gguf(&gguf).expect("tokenizer");
    eprintln!("{dir}: built in {:?}", t0.elapsed());
    let fixture = load_fixture(dir, "tokenize.json");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 300, "{dir}: only {} cases", cases.len());

    let mut failures = Vec::new();
    let (mut ok_ids, mut ok_plain, mut ok_detok) = (0, 0, 0);
    for (i, case) in cases.iter().enumerate() {
        let text = case["text"].as_str().expect("text");
        let want_ids = ids(&case["ids"]);
        let want_plain = ids(&case["ids_plain"]);
        let want_detok = case["detok"].as_str().expect("detok");

        let got_ids = tok.encode(text, true, true);
        if got_ids == want_ids {
            ok_ids += 1;
        } else {
            failures.push(format!(
                "case {i} ids {}: want {want_ids:?} got {got_ids:?}",
                clip(text)
            ));
        }
        let got_plain = tok.encode(text, false, false);
        if got_plain == want_plain {
            ok_plain += 1;
        } else {
            failures.push(format!(
                "case {i} ids_plain {}: want {want_plain:?} got {got_plain:?}",
                clip(text)
            ));
        }
        // The server's /detokenize: pieces with special = true, concatenated.
        let mut bytes = Vec::new();
        for &id in &want_plain {
            bytes.extend_from_slice(tok.token_piece(id, true));
        }
        let got_detok = String::from_utf8_lossy(&bytes);
        if got_detok == want_detok {
            ok_detok += 1;
        } else {
            failures.push(format!(
                "case {i} detok: want {} got {}",
                clip(want_detok),
                clip(&got_detok)
            ));
        }
        // Our decode and the streaming decoder agree with each other.
        let decoded = tok.decode(&want_plain, false);
        let mut sd = StreamDecoder::new(&tok, false);
        let mut streamed = String::new();
        for &id in &want_plain {
            streamed.push_str(&sd.push(&tok, id));
        }
        streamed.push_str(&sd.finish(&tok));
        assert_eq!(streamed, decoded, "{dir} case {i}: stream != decode");
    }
    eprintln!(
        "{dir}: {} cases: ids {ok_ids}, ids_plain {ok_plain}, detok {ok_detok} match",
        cases.len()
    );
    for f in failures.iter().take(30) {
        eprintln!("  {f}");
    }
    assert!(failures.is_empty(), "{dir}: {} mismatches", failures.len());
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model(MODELS[0].0, MODELS[0].1);
}

#[test]
fn qwen25_coder_matches_llama_cpp() {
    check_model(MODELS[1].0, MODELS[1].1);
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model(MODELS[2].0, MODELS[2].1);
}

#[test]
fn qwen25_coder_1_5b_matches_llama_cpp() {
    check_model(CODER_1_5B.0, CODER_1_5B.1);
}
