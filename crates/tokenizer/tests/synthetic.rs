//! Model-free tests on small hand-built vocabularies.

use tempo9_tokenizer::{
    SpecialTokenIds, StreamDecoder, Tokenizer, TokenizerConfig, TokenizerError, TokenizerKind,
};

/// A tiny SPM vocabulary: control tokens, all 256 byte tokens, a few pieces.
fn spm() -> Tokenizer {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32; 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    for (piece, score) in [
        ("▁", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("▁a", -0.5),
        ("ab", -0.4),
        ("▁ab", -0.1),
        ("<user>", 0.0),
    ] {
        tokens.push(piece.to_string());
        types.push(if piece == "<user>" { 4 } else { 1 });
        scores.push(score);
    }
    Tokenizer::from_config(TokenizerConfig {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        add_space_prefix: Some(true),
        ..Default::default()
    })
    .unwrap()
}

fn id(t: &Tokenizer, s: &str) -> u32 {
    t.token_id(s).unwrap_or_else(|| panic!("no token {s:?}"))
}

#[test]
fn spm_merges_by_score_with_space_prefix() {
    let t = spm();
    assert_eq!(t.kind(), TokenizerKind::Spm);
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert!(t.is_eog(2));
    // " ab" → "▁ab" (prefix space added, BOS added by default for SPM).
    assert_eq!(t.encode("ab", true, false), vec![1, id(&t, "▁ab")]);
    assert_eq!(t.encode("ab", false, false), vec![id(&t, "▁ab")]);
    // "▁a" + "b": "▁ab" reached via "▁a"+"b"? No: "ab" (-0.4) beats "▁a" (-0.5)
    // first, then "▁"+"ab" = "▁ab".
    assert_eq!(
        t.encode("ab a", false, false),
        vec![id(&t, "▁ab"), id(&t, "▁a")]
    );
    // Unknown characters fall back to bytes.
    let e = t.encode("é", false, false);
    assert_eq!(e, vec![id(&t, "▁"), id(&t, "<0xC3>"), id(&t, "<0xA9>")]);
    assert_eq!(t.decode(&e, false), "é");
    // User-defined tokens are cut out even without parse_special; the text
    // after any special token gets the space prefix again (llama.cpp).
    let e = t.encode("a<user>b", false, false);
    assert_eq!(
        e,
        vec![id(&t, "▁a"), id(&t, "<user>"), id(&t, "▁"), id(&t, "b")]
    );
    // Control text is only special when asked.
    assert_eq!(t.encode("</s>", false, true), vec![2]);
    assert_ne!(t.encode("</s>", false, false), vec![2]);
}

#[test]
fn spm_decode_strips_first_space_and_hides_control() {
    let t = spm();
    // Only the very first token loses its leading space; with BOS in front
    // (rendered or not) the space stays, as in llama.cpp's detokenize.
    let ids = t.encode("ab a", false, false);
    assert_eq!(t.decode(&ids, true), "ab a");
    let with_bos = t.encode("ab a", true, false);
    assert_eq!(t.decode(&with_bos, true), " ab a");
    assert_eq!(t.decode(&with_bos, false), "<s> ab a");
    assert_eq!(t.token_bytes(1), b"");
    assert_eq!(t.token_piece(1, true), b"<s>");
    assert_eq!(t.token_bytes(id(&t, "<0x41>")), b"A");
    assert_eq!(t.token_bytes(id(&t, "▁ab")), b" ab");
    assert_eq!(t.token_bytes(99_999), b"");
}

#[test]
fn stream_decoder_never_splits_utf8() {
    let t = spm();
    let text = "ab 😀é a中文🦩";
    let ids = t.encode(text, false, false);
    // The emoji really is spread over byte tokens.
    assert!(ids.iter().filter(|&&i| t.is_byte(i)).count() >= 8);
    let whole = t.decode(&ids, true);
    assert_eq!(whole, text);
    let mut d = StreamDecoder::new(&t, true);
    let mut acc = String::new();
    for &i in &ids {
        let delta = d.push(&t, i);
        // Every delta is a complete string on its own (it is a `String`), and
        // nothing is emitted mid-character: the accumulated text is always a
        // prefix of the final text.
        acc.push_str(&delta);
        assert!(whole.starts_with(&acc), "{acc:?}");
        assert!(!delta.contains('\u{FFFD}'));
    }
    acc.push_str(&d.finish(&t));
    assert_eq!(acc, whole);
}

#[test]
fn stream_decoder_flushes_truncated_utf8_like_decode() {
    let t = spm();
    let ids = t.encode("x😀", false, false);
    let cut = &ids[..ids.len() - 1];
    let mut d = StreamDecoder::new(&t, true);
    let mut acc = String::new();
    for &i in cut {
        acc.push_str(&d.push(&t, i));
    }
    assert_eq!(acc, "x");
    acc.push_str(&d.finish(&t));
    assert_eq!(acc, t.decode(cut, true));
    assert!(acc.ends_with('\u{FFFD}'));
}

/// A tiny byte-level BPE vocabulary with the GPT-2 pre-tokenizer and space
/// clean-up (`tokenizer.ggml.pre` = `gpt-2`).
fn bpe() -> Tokenizer {
    // GPT-2 byte → char map for the bytes used here.
    let mut tokens: Vec<String> = (b'!'..=b'~').map(|b| char::from(b).to_string()).collect();
    tokens.push("Ġ".into()); // space
    for t in [
        "Ġh",
        "Ġhe",
        "ll",
        "Ġhell",
        "Ġhello",
        "<|endoftext|>",
        "<|im_start|>",
    ] {
        tokens.push(t.into());
    }
    let n = tokens.len();
    let mut types = vec![1; n];
    types[n - 2] = 3;
    types[n - 1] = 3;
    let merges = ["Ġ h", "Ġh e", "l l", "Ġhe ll", "Ġhell o"]
        .map(String::from)
        .to_vec();
    Tokenizer::from_config(TokenizerConfig {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types: Some(types),
        merges: Some(merges),
        special: SpecialTokenIds {
            eos: Some((n - 2) as u32),
            bos: Some((n - 2) as u32),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn bpe_merges_by_rank_and_cleans_spaces() {
    let t = bpe();
    assert_eq!(t.kind(), TokenizerKind::Bpe);
    let hello = id(&t, "Ġhello");
    assert_eq!(t.encode(" hello", false, false), vec![hello]);
    // add_bos defaults to false for the GPT-2 pre-tokenizer.
    assert_eq!(t.encode(" hello", true, false), vec![hello]);
    let ids = t.encode("hi , there ' s", false, false);
    assert_eq!(t.decode(&ids, true), "hi, there's");
    assert!(t.is_eog(id(&t, "<|endoftext|>")));
    assert!(!t.is_eog(id(&t, "<|im_start|>")));
    assert_eq!(
        t.encode("<|im_start|> hello", false, true),
        vec![id(&t, "<|im_start|>"), hello]
    );
    // Streaming with the clean-up gives the same text as decode.
    let mut d = StreamDecoder::new(&t, true);
    let mut s = String::new();
    for &i in &ids {
        s.push_str(&d.push(&t, i));
    }
    s.push_str(&d.finish(&t));
    assert_eq!(s, "hi, there's");
}

#[test]
fn unsupported_vocabularies_are_errors() {
    let cfg = |model: &str, pre: Option<&str>| TokenizerConfig {
        model: model.into(),
        pre: pre.map(String::from),
        tokens: vec!["a".into()],
        merges: Some(vec![]),
        ..Default::default()
    };
    assert!(matches!(
        Tokenizer::from_config(cfg("bert", None)),
        Err(TokenizerError::UnsupportedModel(m)) if m == "bert"
    ));
    assert!(matches!(
        Tokenizer::from_config(cfg("gpt2", Some("nonsense"))),
        Err(TokenizerError::UnsupportedPreTokenizer(_))
    ));
    let mut no_merges = cfg("gpt2", Some("gpt-2"));
    no_merges.merges = None;
    assert!(matches!(
        Tokenizer::from_config(no_merges),
        Err(TokenizerError::MissingKey(_))
    ));
    assert!(Tokenizer::from_config(TokenizerConfig {
        model: "llama".into(),
        ..Default::default()
    })
    .is_err());
}

/// A tiny Gemma-4 style BPE vocabulary: `▁` for spaces, raw UTF-8 pieces,
/// `<0xXX>` byte fallback, newline runs as whole tokens.
fn gemma4_like() -> Tokenizer {
    let mut tokens = vec!["<pad>".to_string(), "<eos>".into(), "<bos>".into()];
    let mut types = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    for t in ["▁", "h", "i", "▁h", "▁hi", "\n", "\n\n", "x"] {
        tokens.push(t.into());
        types.push(1);
    }
    Tokenizer::from_config(TokenizerConfig {
        model: "gemma4".into(),
        tokens,
        token_types: Some(types),
        merges: Some(vec!["▁ h".into(), "▁h i".into(), "\n \n".into()]),
        special: SpecialTokenIds {
            bos: Some(2),
            eos: Some(1),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap()
}

#[test]
fn gemma4_style_bpe() {
    let t = gemma4_like();
    assert_eq!(t.kind(), TokenizerKind::Bpe);
    // BOS is always added for Gemma-4 vocabularies.
    assert!(t.add_bos());
    let ids = t.encode(" hi\n\nxé", true, false);
    assert_eq!(
        ids,
        vec![
            2,
            id(&t, "▁hi"),
            id(&t, "\n\n"),
            id(&t, "x"),
            id(&t, "<0xC3>"),
            id(&t, "<0xA9>")
        ]
    );
    assert_eq!(t.decode(&ids, true), " hi\n\nxé");
}
