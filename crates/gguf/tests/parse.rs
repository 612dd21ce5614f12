//! Parsing of valid files and rejection of specific hostile ones.

mod common;

use common::{sample, ty, Builder, Val, T};
use tempo9_gguf::{ArrayValue, GgmlType, GgufError, GgufFile, Value};

fn parse(b: &Builder) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(b.build().bytes)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn valid_file_round_trips() {
    let built = sample().build();
    let len = built.bytes.len();
    let f = GgufFile::from_bytes(built.bytes.clone()).unwrap();
    assert_eq!(f.version(), 3);
    assert_eq!(f.alignment(), 32);
    assert_eq!(f.data_offset(), built.data_offset as u64);
    assert_eq!(f.data_offset() % 32, 0);
    assert_eq!(f.bytes().len(), len);
    assert_eq!(f.architecture().unwrap(), "llama");

    let md = f.metadata();
    assert_eq!(md.len(), 16);
    assert!(!md.is_empty());
    let keys: Vec<&str> = md.iter().map(|(k, _)| k).collect();
    assert_eq!(keys[0], "general.architecture");
    assert_eq!(keys[15], "some.u8");
    assert_eq!(md.get_str("general.name").unwrap(), Some("tiny ✓"));
    assert_eq!(md.get_u32("llama.block_count").unwrap(), Some(2));
    assert_eq!(md.get_u32("llama.context_length").unwrap(), Some(4096));
    assert_eq!(md.get_u64("llama.block_count").unwrap(), Some(2));
    assert_eq!(md.get_f32("llama.rope.freq_base").unwrap(), Some(10000.0));
    assert_eq!(
        md.get_f32("llama.attention.layer_norm_rms_epsilon")
            .unwrap(),
        Some(1e-5)
    );
    assert_eq!(
        md.get_i32_array("llama.head_count_kv").unwrap(),
        Some(&[2, 4][..])
    );
    assert_eq!(
        md.get_u32_array("llama.head_count_kv").unwrap(),
        Some(&[2, 4][..])
    );
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap(),
        ["<s>", "</s>", "a", "é"]
    );
    assert_eq!(
        md.get_f32_array("tokenizer.ggml.scores").unwrap(),
        Some(&[0.0, -1.0, -2.5, 3.0][..])
    );
    assert_eq!(
        md.get_bool_array("some.flags").unwrap(),
        Some(&[true, false][..])
    );
    assert_eq!(md.get_bool("some.bool").unwrap(), Some(true));
    assert_eq!(md.get("some.i8"), Some(&Value::I8(-3)));
    assert_eq!(md.get("some.u16"), Some(&Value::U16(65535)));
    assert_eq!(md.get("some.i16"), Some(&Value::I16(-300)));
    assert_eq!(md.get_i32("some.i64").unwrap(), Some(-5));
    assert_eq!(md.get_u32("some.u8").unwrap(), Some(200));
    assert!(matches!(
        md.get_u32("some.i64"),
        Err(GgufError::MetadataType { .. })
    ));
    assert!(matches!(
        md.get_str("llama.block_count"),
        Err(GgufError::MetadataType { .. })
    ));
    assert_eq!(md.get_u32("absent").unwrap(), None);

    assert_eq!(f.tensors().len(), 3);
    let emb = f.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.shape, [4, 3]);
    assert_eq!(emb.dtype, GgmlType::F32);
    assert_eq!(emb.n_bytes, 48);
    assert_eq!(emb.offset, f.data_offset());
    assert_eq!(emb.n_elements(), 12);
    assert_eq!(emb.ne(), [4, 3, 1, 1]);
    assert_eq!(
        f32s(f.tensor_bytes(emb)),
        (0..12).map(|i| i as f32).collect::<Vec<_>>()
    );

    let q = f.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!(q.dtype, GgmlType::Q4_0);
    assert_eq!(q.n_bytes, 72);
    assert_eq!(q.offset, f.data_offset() + 64);
    assert_eq!(f.tensor_bytes(q), &sample().tensors[1].data[..]);

    let norm = f.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.offset + norm.n_bytes, len as u64);
    assert_eq!(f32s(f.tensor_bytes(norm)), [0.0, 1.0, 2.0, 3.0, 4.0]);
    assert!(f.tensor("missing").is_none());
}

#[test]
fn open_from_disk_matches_from_bytes() {
    let built = sample().build();
    let dir = std::env::temp_dir().join(format!("tempo9-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sample.gguf");
    std::fs::write(&path, &built.bytes).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let g = GgufFile::from_bytes(built.bytes).unwrap();
    assert_eq!(f.tensors(), g.tensors());
    assert_eq!(f.bytes(), g.bytes());
    assert_eq!(f.metadata().len(), g.metadata().len());

    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        GgufFile::open(&path),
        Err(GgufError::Truncated { .. })
    ));
    std::fs::remove_dir_all(&dir).unwrap();

    let err = GgufFile::open(dir.join("nope.gguf")).unwrap_err();
    assert!(matches!(err, GgufError::Io { .. }));
    assert!(err.to_string().contains("nope.gguf"), "{err}");
}

#[test]
fn version_2_and_custom_alignment() {
    let mut b = sample().kv("general.alignment", Val::u32(64));
    b.version = 2;
    b.align = 64;
    let f = parse(&b).unwrap();
    assert_eq!(f.version(), 2);
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    for t in f.tensors() {
        assert_eq!((t.offset - f.data_offset()) % 64, 0);
    }
}

#[test]
fn no_tensors_no_kvs() {
    let f = parse(&Builder::default()).unwrap();
    assert!(f.metadata().is_empty());
    assert!(f.tensors().is_empty());
    assert_eq!(f.data_offset(), 24);
    assert!(matches!(
        f.architecture(),
        Err(GgufError::MissingKey { .. })
    ));
}

#[test]
fn zero_sized_tensor_is_allowed() {
    let mut t = T::f32("empty", &[0, 7]);
    t.offset_override = Some(0); // shares its offset with token_embd.weight: no bytes, no overlap
    let f = parse(&sample().tensor(t)).unwrap();
    let t = f.tensor("empty").unwrap();
    assert_eq!(t.n_bytes, 0);
    assert!(f.tensor_bytes(t).is_empty());
}

#[test]
fn nested_arrays_within_limit() {
    let inner = Val::nested(&[Val::i32s(&[1, 2]), Val::i32s(&[3])]);
    let f = parse(&sample().kv("nested", inner)).unwrap();
    let a = f.metadata().get_array("nested").unwrap().unwrap();
    assert_eq!(
        a,
        &ArrayValue::Array(vec![ArrayValue::I32(vec![1, 2]), ArrayValue::I32(vec![3])])
    );
    assert!(f.metadata().get_i32_array("nested").is_err());
}

#[test]
fn nesting_too_deep() {
    let mut v = Val::i32s(&[1]);
    for _ in 0..tempo9_gguf::MAX_ARRAY_DEPTH {
        v = Val::nested(&[v]);
    }
    let err = parse(&sample().kv("deep", v)).unwrap_err();
    assert!(
        matches!(err, GgufError::NestingTooDeep { ref key, .. } if key == "deep"),
        "{err}"
    );
}

fn expect_err(b: &Builder, check: impl Fn(&GgufError) -> bool) {
    match parse(b) {
        Ok(_) => panic!("hostile file accepted"),
        Err(e) => {
            assert!(check(&e), "unexpected error: {e:?}");
            assert!(!e.to_string().is_empty());
        }
    }
}

#[test]
fn bad_magic() {
    let mut bytes = sample().build().bytes;
    bytes[0] = b'X';
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(matches!(err, GgufError::BadMagic { found } if &found == b"XGUF"));
}

#[test]
fn bad_versions() {
    for v in [0, 1, 4, 0x0300_0000, u32::MAX] {
        let mut b = sample();
        b.version = v;
        expect_err(
            &b,
            |e| matches!(e, GgufError::UnsupportedVersion { version } if *version == v),
        );
    }
}

#[test]
fn absurd_tensor_count_fails_fast() {
    for n in [1u64 << 60, u64::MAX, 1 << 20] {
        let mut b = sample();
        b.tensor_count_override = Some(n);
        expect_err(
            &b,
            |e| matches!(e, GgufError::CountTooLarge { count, offset: 8, .. } if *count == n),
        );
    }
}

#[test]
fn absurd_kv_count_fails_fast() {
    let mut b = sample();
    b.kv_count_override = Some(1 << 60);
    expect_err(&b, |e| {
        matches!(e, GgufError::CountTooLarge { offset: 16, .. })
    });
}

#[test]
fn absurd_string_length() {
    // Key length of 2^60.
    let mut bytes = sample().build().bytes;
    bytes[24..32].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let err = GgufFile::from_bytes(bytes).unwrap_err();
    assert!(
        matches!(err, GgufError::Truncated { offset: 32, needed, .. } if needed == 1 << 60),
        "{err:?}"
    );
    // String value of 2^60 bytes.
    let mut payload = (1u64 << 60).to_le_bytes().to_vec();
    payload.extend_from_slice(b"abc");
    let mut v = ty::STRING.to_le_bytes().to_vec();
    v.extend_from_slice(&payload);
    expect_err(&sample().kv("huge", Val(v)), |e| {
        matches!(e, GgufError::Truncated { .. })
    });
    // String array element count of 2^60.
    expect_err(
        &sample().kv("arr", Val::array_raw(ty::STRING, 1 << 60, b"")),
        |e| matches!(e, GgufError::CountTooLarge { .. }),
    );
    // u64 array that would need 2^63 * 8 bytes (multiplication overflows).
    expect_err(
        &sample().kv("arr", Val::array_raw(ty::U64, 1 << 63, b"")),
        |e| {
            matches!(
                e,
                GgufError::CountTooLarge {
                    min_bytes: u64::MAX,
                    ..
                }
            )
        },
    );
}

#[test]
fn invalid_utf8() {
    let mut v = ty::STRING.to_le_bytes().to_vec();
    v.extend_from_slice(&2u64.to_le_bytes());
    v.extend_from_slice(&[0xC3, 0x28]);
    expect_err(
        &sample().kv("bad", Val(v)),
        |e| matches!(e, GgufError::InvalidUtf8 { what, .. } if what.contains("'bad'")),
    );
    let mut bytes = sample().build().bytes;
    bytes[32] = 0xFF; // first byte of the first key
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::InvalidUtf8 { offset: 32, .. })
    ));
}

#[test]
fn empty_and_duplicate_keys() {
    expect_err(&sample().kv("", Val::u8(1)), |e| {
        matches!(e, GgufError::EmptyKey { index: 16, .. })
    });
    expect_err(
        &sample().kv("llama.block_count", Val::u32(3)),
        |e| matches!(e, GgufError::DuplicateKey { key, .. } if key == "llama.block_count"),
    );
}

#[test]
fn invalid_value_types() {
    for t in [13u32, 100, u32::MAX] {
        expect_err(
            &sample().kv("x", Val(t.to_le_bytes().to_vec())),
            |e| matches!(e, GgufError::InvalidValueType { type_id, .. } if *type_id == t),
        );
        expect_err(
            &sample().kv("x", Val::array_raw(t, 0, b"")),
            |e| matches!(e, GgufError::InvalidValueType { type_id, .. } if *type_id == t),
        );
    }
}

#[test]
fn bad_alignment() {
    for a in [0u32, 3, 48, u32::MAX] {
        let b = sample().kv("general.alignment", Val::u32(a));
        expect_err(&b, |e| matches!(e, GgufError::BadAlignment { .. }));
    }
    expect_err(
        &sample().kv("general.alignment", Val::u64(32)),
        |e| matches!(e, GgufError::BadAlignment { reason } if reason.contains("u64")),
    );
}

#[test]
fn duplicate_tensor_names() {
    expect_err(
        &sample().tensor(T::f32("output_norm.weight", &[2])),
        |e| matches!(e, GgufError::DuplicateTensor { name, .. } if name == "output_norm.weight"),
    );
}

#[test]
fn tensor_name_too_long() {
    let long = "x".repeat(64);
    expect_err(&sample().tensor(T::f32(&long, &[2])), |e| {
        matches!(e, GgufError::TensorNameTooLong { len: 64, .. })
    });
    assert!(parse(&sample().tensor(T::f32(&"y".repeat(63), &[2]))).is_ok());
}

#[test]
fn bad_dimension_counts() {
    for shape in [vec![], vec![1, 1, 1, 1, 1]] {
        let mut t = T::f32("t", &[1]);
        t.shape = shape.clone();
        expect_err(
            &sample().tensor(t),
            |e| matches!(e, GgufError::InvalidDims { n_dims, .. } if *n_dims as usize == shape.len()),
        );
    }
    assert!(parse(&sample().tensor(T::f32("t4", &[1, 2, 1, 2]))).is_ok());
}

#[test]
fn bad_shapes() {
    let mut t = T::f32("neg", &[1]);
    t.shape = vec![2, u64::MAX];
    expect_err(&sample().tensor(t), |e| {
        matches!(e, GgufError::InvalidShape { .. })
    });
    let mut t = T::f32("ovf", &[1]);
    t.shape = vec![1 << 32, 1 << 32];
    expect_err(&sample().tensor(t), |e| {
        matches!(e, GgufError::InvalidShape { .. })
    });
    // Overflow before a later zero dimension is still rejected (as in ggml).
    let mut t = T::f32("ovf0", &[1]);
    t.shape = vec![1 << 62, 4, 0];
    expect_err(&sample().tensor(t), |e| {
        matches!(e, GgufError::InvalidShape { .. })
    });
    // Huge but representable element count: byte range cannot be inside the file.
    let mut t = T::f32("huge", &[1]);
    t.shape = vec![1 << 40];
    expect_err(&sample().tensor(t), |e| {
        matches!(e, GgufError::TensorOutOfBounds { .. })
    });
}

#[test]
fn unknown_tensor_types() {
    for id in [4u32, 5, 31, 36, 43, 1000] {
        expect_err(
            &sample().tensor(T::raw("t", &[32], id, 18)),
            |e| matches!(e, GgufError::UnknownType { type_id, .. } if *type_id == id),
        );
    }
}

#[test]
fn ne0_not_multiple_of_block() {
    expect_err(&sample().tensor(T::raw("q", &[33, 2], 2, 36)), |e| {
        matches!(
            e,
            GgufError::NotBlockMultiple {
                ne0: 33,
                block_size: 32,
                ..
            }
        )
    });
    expect_err(&sample().tensor(T::raw("k", &[128], 12, 144)), |e| {
        matches!(
            e,
            GgufError::NotBlockMultiple {
                block_size: 256,
                ..
            }
        )
    });
}

#[test]
fn misaligned_offset() {
    let mut b = sample();
    b.tensors[1].offset_override = Some(48 + 4);
    expect_err(&b, |e| {
        matches!(e, GgufError::MisalignedTensor { offset: 52, .. })
    });
}

#[test]
fn overlapping_tensors() {
    let mut b = sample();
    b.tensors[2].offset_override = Some(64); // onto blk.0.attn_q.weight
    expect_err(&b, |e| {
        matches!(e, GgufError::OverlappingTensors { first, second, .. }
            if first == "blk.0.attn_q.weight" && second == "output_norm.weight")
    });
    let mut b = sample();
    b.tensors[1].offset_override = Some(0); // onto token_embd.weight
    expect_err(&b, |e| matches!(e, GgufError::OverlappingTensors { .. }));
}

#[test]
fn data_past_eof() {
    let mut b = sample();
    b.tensors[2].offset_override = Some(1 << 20);
    expect_err(
        &b,
        |e| matches!(e, GgufError::TensorOutOfBounds { name, .. } if name == "output_norm.weight"),
    );
    let mut b = sample();
    b.tensors[0].offset_override = Some(u64::MAX - 31);
    expect_err(&b, |e| matches!(e, GgufError::TensorOutOfBounds { .. }));
    let mut bytes = sample().build().bytes;
    bytes.pop();
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::TensorOutOfBounds { .. })
    ));
}

#[test]
fn data_section_past_eof() {
    // Tensor infos end at a non-aligned offset and the file stops there.
    let mut b = Builder::default().tensor(T::f32("z", &[0]));
    b.align = 1;
    let bytes = b.build().bytes;
    assert_ne!(bytes.len() % 32, 0);
    assert!(matches!(
        GgufFile::from_bytes(bytes),
        Err(GgufError::DataSectionOutOfBounds { .. })
    ));
    // The same file padded to the alignment is fine.
    let mut bytes = b.build().bytes;
    bytes.resize(bytes.len().next_multiple_of(32), 0);
    assert!(GgufFile::from_bytes(bytes).is_ok());
}

#[test]
fn error_messages_name_the_problem() {
    let mut b = sample();
    b.tensors[1].offset_override = Some(40);
    let msg = parse(&b).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains("40") && msg.contains("32"),
        "{msg}"
    );
    let one_kv = Builder::default().kv("general.architecture", Val::str("llama"));
    let msg = GgufFile::from_bytes(one_kv.build().bytes[..40].to_vec())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("offset 32")
            && msg.contains("metadata key #0")
            && msg.contains("needs 20 bytes"),
        "{msg}"
    );
    let msg = GgufFile::from_bytes(sample().build().bytes[..30].to_vec())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("tensor count 3 at byte offset 8"), "{msg}");
}

#[test]
fn tensor_bytes_of_foreign_info_never_panics() {
    let f = parse(&sample()).unwrap();
    let mut t = f.tensors()[0].clone();
    t.offset = u64::MAX;
    assert!(f.tensor_bytes(&t).is_empty());
    t.offset = 0;
    t.n_bytes = u64::MAX;
    assert!(f.tensor_bytes(&t).is_empty());
}

#[test]
fn file_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync + 'static>(_: &T) {}
    let f = std::sync::Arc::new(parse(&sample()).unwrap());
    assert_send_sync(&f);
    let g = std::sync::Arc::clone(&f);
    let n = std::thread::spawn(move || {
        g.metadata()
            .get_i32_array("llama.head_count_kv")
            .unwrap()
            .unwrap()
            .len()
    })
    .join()
    .unwrap();
    assert_eq!(n, 2);
    // The lazily converted u32 view is built once and shared.
    assert_eq!(
        f.metadata().get_u32_array("llama.head_count_kv").unwrap(),
        Some(&[2, 4][..])
    );
}
