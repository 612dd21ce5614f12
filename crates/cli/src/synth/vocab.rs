//! The vocabulary of a synthetic model: a made-up byte-level BPE one, or the
//! `tokenizer.*` keys of a real (vocab-only) GGUF.

use std::path::Path;

use anyhow::{bail, Context as _, Result};
use tempo9_gguf::{ArrayValue, GgufFile, GgufWriter, Value};

use super::shapes::SynthArch;

/// The GPT-2 byte-to-character map of byte-level BPE vocabularies.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| {
        (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
    };
    let mut out = ['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        out[b as usize] = if printable(b) {
            char::from_u32(b).expect("latin-1")
        } else {
            extra += 1;
            char::from_u32(255 + extra).expect("small code point")
        };
    }
    out
}

/// A byte-level BPE vocabulary of `n` tokens: the 256 byte tokens, merges of
/// lower-case letter pairs (so text encodes into fewer tokens than bytes), filler
/// tokens, and three control tokens at the end (BOS, EOS, end of turn).
pub fn synthetic(n: u64, arch: SynthArch, w: &mut GgufWriter) -> Result<()> {
    let n = n as usize;
    let llama = matches!(
        arch,
        SynthArch::Llama | SynthArch::Mistral3 | SynthArch::GptOss
    );
    let chars = byte_chars();
    let mut tokens: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
    let mut merges = Vec::new();
    for a in b'a'..=b'z' {
        for b in b'a'..=b'z' {
            merges.push(format!("{} {}", a as char, b as char));
            tokens.push(format!("{}{}", a as char, b as char));
        }
    }
    let specials = if llama {
        ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    } else {
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    };
    if n < tokens.len() + specials.len() + 1 {
        bail!("vocabulary of {n} tokens is too small");
    }
    while tokens.len() < n - specials.len() {
        tokens.push(format!("[syn{}]", tokens.len()));
    }
    let first_special = tokens.len() as u32;
    tokens.extend(specials.iter().map(|s| s.to_string()));
    let mut types = vec![1i32; n];
    types[first_special as usize..].fill(3);
    let (pre, bos, eos, eot) = if llama {
        (
            "llama-bpe",
            first_special,
            first_special + 1,
            first_special + 2,
        )
    } else {
        ("qwen2", first_special, first_special + 2, first_special + 2)
    };
    let s = |x: &str| Value::String(x.into());
    w.set("tokenizer.ggml.model", s("gpt2"))
        .set("tokenizer.ggml.pre", s(pre))
        .set(
            "tokenizer.ggml.tokens",
            Value::Array(ArrayValue::String(tokens)),
        )
        .set(
            "tokenizer.ggml.token_type",
            Value::Array(ArrayValue::I32(types)),
        )
        .set(
            "tokenizer.ggml.merges",
            Value::Array(ArrayValue::String(merges)),
        )
        .set("tokenizer.ggml.bos_token_id", Value::U32(bos))
        .set("tokenizer.ggml.eos_token_id", Value::U32(eos))
        .set("tokenizer.ggml.eot_token_id", Value::U32(eot))
        .set("tokenizer.ggml.add_bos_token", Value::Bool(llama));
    Ok(())
}

/// The `tokenizer.*` keys of a GGUF file (e.g. llama.cpp's
/// `models/ggml-vocab-qwen35.gguf`), in file order, and its token count.
pub fn from_file(path: &Path) -> Result<(Vec<(String, Value)>, u64)> {
    let f = GgufFile::open(path).with_context(|| format!("reading {}", path.display()))?;
    let n = f
        .metadata()
        .get_str_array("tokenizer.ggml.tokens")?
        .with_context(|| format!("{} has no tokenizer.ggml.tokens", path.display()))?
        .len() as u64;
    let keys = f
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    Ok((keys, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_tokenizer_keys_in_order() {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::String("qwen2".into()));
        synthetic(1000, SynthArch::Qwen3, &mut w).unwrap();
        w.set("tokenizer.chat_template", Value::String("{{ x }}".into()));
        let path = std::env::temp_dir().join(format!("tempo9-vocab-{}.gguf", std::process::id()));
        std::fs::write(&path, w.to_bytes(|_| Vec::new()).unwrap()).unwrap();
        let (keys, n) = from_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(n, 1000);
        let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names[..3],
            [
                "tokenizer.ggml.model",
                "tokenizer.ggml.pre",
                "tokenizer.ggml.tokens"
            ]
        );
        assert_eq!(names.last(), Some(&"tokenizer.chat_template"));
        assert!(names.iter().all(|k| k.starts_with("tokenizer.")));
    }

    #[test]
    fn byte_chars_match_gpt2() {
        let c = byte_chars();
        assert_eq!(c[b'A' as usize], 'A');
        assert_eq!(c[b' ' as usize], 'Ġ');
        assert_eq!(c[b'\n' as usize], 'Ċ');
        let mut all: Vec<char> = c.to_vec();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 256);
    }
}
