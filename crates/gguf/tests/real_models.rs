//! Opens the real test models. These tests FAIL when the files are missing,
//! unless `TEMPO9_SKIP_MODEL_TESTS=1` is set. The model directory is
//! `$TEMPO9_MODELS` or `~/.cache/tempo9/models`.

use std::path::PathBuf;

use tempo9_gguf::{GgmlType, GgufFile};

fn model_path(file: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("TEMPO9_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").expect("HOME is not set"))
            .join(".cache/tempo9/models"),
    };
    let path = dir.join(file);
    if path.exists() {
        return Some(path);
    }
    if std::env::var("TEMPO9_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!(
            "skipping: {} missing and TEMPO9_SKIP_MODEL_TESTS=1",
            path.display()
        );
        return None;
    }
    panic!(
        "test model {} is missing (set TEMPO9_MODELS, or TEMPO9_SKIP_MODEL_TESTS=1 to skip)",
        path.display()
    );
}

struct Expect {
    file: &'static str,
    arch: &'static str,
    n_tensors: usize,
    n_kv: usize,
    vocab: usize,
    block_count: u32,
    embedding: u32,
    bos: u32,
    eos: u32,
    tokenizer_model: &'static str,
}

fn check(e: &Expect) {
    let Some(path) = model_path(e.file) else {
        return;
    };
    let f = GgufFile::open(&path).unwrap_or_else(|err| panic!("{}: {err}", e.file));
    let md = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.architecture().unwrap(), e.arch);
    assert_eq!(f.tensors().len(), e.n_tensors);
    assert_eq!(md.len(), e.n_kv);
    let tokens = md.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), e.vocab);
    assert_eq!(
        md.get_str("tokenizer.ggml.model").unwrap(),
        Some(e.tokenizer_model)
    );
    let arch = e.arch;
    assert_eq!(
        md.get_u32(&format!("{arch}.block_count")).unwrap(),
        Some(e.block_count)
    );
    assert_eq!(
        md.get_u32(&format!("{arch}.embedding_length")).unwrap(),
        Some(e.embedding)
    );
    assert_eq!(
        md.get_u32("tokenizer.ggml.bos_token_id").unwrap(),
        Some(e.bos)
    );
    assert_eq!(
        md.get_u32("tokenizer.ggml.eos_token_id").unwrap(),
        Some(e.eos)
    );
    if let Some(types) = md.get_i32_array("tokenizer.ggml.token_type").unwrap() {
        assert_eq!(types.len(), e.vocab);
    }

    let emb = f.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(emb.shape, [u64::from(e.embedding), e.vocab as u64]);
    for i in 0..e.block_count {
        assert!(
            f.tensor(&format!("blk.{i}.attn_q.weight")).is_some(),
            "blk.{i}.attn_q.weight"
        );
    }
    let norm = f.tensor("output_norm.weight").expect("output_norm.weight");
    assert_eq!(norm.dtype, GgmlType::F32);
    assert_eq!(norm.shape, [u64::from(e.embedding)]);
    let w: Vec<f32> = f
        .tensor_bytes(norm)
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(w.len(), e.embedding as usize);
    assert!(w.iter().all(|x| x.is_finite()));

    // Tensors tile the data section in file order, each padded to the alignment.
    let mut expected = f.data_offset();
    for t in f.tensors() {
        assert_eq!(t.offset, expected, "{}", t.name);
        expected = (t.offset + t.n_bytes).next_multiple_of(f.alignment());
    }
    assert!(expected >= f.bytes().len() as u64);
}

#[test]
fn smollm2_135m() {
    check(&Expect {
        file: "smollm2-135m-instruct-q4_1.gguf",
        arch: "llama",
        n_tensors: 272,
        n_kv: 33,
        vocab: 49152,
        block_count: 30,
        embedding: 576,
        bos: 1,
        eos: 2,
        tokenizer_model: "gpt2",
    });
}

#[test]
fn qwen25_coder_05b() {
    check(&Expect {
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        arch: "qwen2",
        n_tensors: 291,
        n_kv: 26,
        vocab: 151936,
        block_count: 24,
        embedding: 896,
        bos: 151643,
        eos: 151645,
        tokenizer_model: "gpt2",
    });
}

#[test]
fn gemma3_270m() {
    check(&Expect {
        file: "gemma-3-270m-q4_k_m.gguf",
        arch: "gemma3",
        n_tensors: 236,
        n_kv: 33,
        vocab: 262144,
        block_count: 18,
        embedding: 640,
        bos: 2,
        eos: 1,
        tokenizer_model: "llama",
    });
}
