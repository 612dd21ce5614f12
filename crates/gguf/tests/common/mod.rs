//! A small GGUF writer for tests, recording every structural boundary.
#![allow(dead_code)]

/// GGUF value type ids.
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Byte buffer that remembers the offset after every field.
#[derive(Default, Clone)]
pub struct W {
    pub buf: Vec<u8>,
    pub marks: Vec<usize>,
}

impl W {
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self.marks.push(self.buf.len());
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.raw(&[v])
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.raw(s.as_bytes())
    }
}

/// An encoded metadata value: type id followed by payload.
#[derive(Clone)]
pub struct Val(pub Vec<u8>);

impl Val {
    fn with(t: u32, payload: &[u8]) -> Val {
        let mut v = t.to_le_bytes().to_vec();
        v.extend_from_slice(payload);
        Val(v)
    }
    pub fn u8(x: u8) -> Val {
        Val::with(ty::U8, &[x])
    }
    pub fn i8(x: i8) -> Val {
        Val::with(ty::I8, &x.to_le_bytes())
    }
    pub fn u16(x: u16) -> Val {
        Val::with(ty::U16, &x.to_le_bytes())
    }
    pub fn i16(x: i16) -> Val {
        Val::with(ty::I16, &x.to_le_bytes())
    }
    pub fn u32(x: u32) -> Val {
        Val::with(ty::U32, &x.to_le_bytes())
    }
    pub fn i32(x: i32) -> Val {
        Val::with(ty::I32, &x.to_le_bytes())
    }
    pub fn u64(x: u64) -> Val {
        Val::with(ty::U64, &x.to_le_bytes())
    }
    pub fn i64(x: i64) -> Val {
        Val::with(ty::I64, &x.to_le_bytes())
    }
    pub fn f32(x: f32) -> Val {
        Val::with(ty::F32, &x.to_le_bytes())
    }
    pub fn f64(x: f64) -> Val {
        Val::with(ty::F64, &x.to_le_bytes())
    }
    pub fn bool(x: bool) -> Val {
        Val::with(ty::BOOL, &[x as u8])
    }
    pub fn str(s: &str) -> Val {
        let mut p = (s.len() as u64).to_le_bytes().to_vec();
        p.extend_from_slice(s.as_bytes());
        Val::with(ty::STRING, &p)
    }
    /// Array with element type `elem` and pre-encoded element payloads.
    pub fn array_raw(elem: u32, count: u64, payload: &[u8]) -> Val {
        let mut p = elem.to_le_bytes().to_vec();
        p.extend_from_slice(&count.to_le_bytes());
        p.extend_from_slice(payload);
        Val::with(ty::ARRAY, &p)
    }
    pub fn i32s(xs: &[i32]) -> Val {
        let p: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        Val::array_raw(ty::I32, xs.len() as u64, &p)
    }
    pub fn u32s(xs: &[u32]) -> Val {
        let p: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        Val::array_raw(ty::U32, xs.len() as u64, &p)
    }
    pub fn f32s(xs: &[f32]) -> Val {
        let p: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        Val::array_raw(ty::F32, xs.len() as u64, &p)
    }
    pub fn bools(xs: &[bool]) -> Val {
        let p: Vec<u8> = xs.iter().map(|&x| x as u8).collect();
        Val::array_raw(ty::BOOL, xs.len() as u64, &p)
    }
    pub fn strs(xs: &[&str]) -> Val {
        let mut p = Vec::new();
        for s in xs {
            p.extend_from_slice(&(s.len() as u64).to_le_bytes());
            p.extend_from_slice(s.as_bytes());
        }
        Val::array_raw(ty::STRING, xs.len() as u64, &p)
    }
    /// Array of arrays; `inner` are full `Val`s of type ARRAY (their type id is stripped).
    pub fn nested(inner: &[Val]) -> Val {
        let mut p = Vec::new();
        for v in inner {
            assert_eq!(v.0[..4], ty::ARRAY.to_le_bytes());
            p.extend_from_slice(&v.0[4..]);
        }
        Val::array_raw(ty::ARRAY, inner.len() as u64, &p)
    }
}

/// A tensor to write.
#[derive(Clone)]
pub struct T {
    pub name: String,
    pub shape: Vec<u64>,
    pub type_id: u32,
    pub data: Vec<u8>,
    /// Relative offset to write instead of the computed one.
    pub offset_override: Option<u64>,
}

impl T {
    /// An F32 tensor whose elements are 0, 1, 2, ...
    pub fn f32(name: &str, shape: &[u64]) -> T {
        let n: u64 = shape.iter().product();
        let data = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
        T {
            name: name.into(),
            shape: shape.to_vec(),
            type_id: 0,
            data,
            offset_override: None,
        }
    }
    /// A tensor of type `type_id` with `n_bytes` bytes of pattern data.
    pub fn raw(name: &str, shape: &[u64], type_id: u32, n_bytes: usize) -> T {
        T {
            name: name.into(),
            shape: shape.to_vec(),
            type_id,
            data: (0..n_bytes).map(|i| (i * 7 + 3) as u8).collect(),
            offset_override: None,
        }
    }
}

/// A GGUF file under construction.
#[derive(Clone)]
pub struct Builder {
    pub version: u32,
    pub kvs: Vec<(String, Val)>,
    pub tensors: Vec<T>,
    /// Alignment used for layout (must match `general.alignment` if set).
    pub align: u64,
    /// Override of the tensor count written in the header.
    pub tensor_count_override: Option<u64>,
    /// Override of the kv count written in the header.
    pub kv_count_override: Option<u64>,
}

/// A built file with the offsets of its structural boundaries.
pub struct Built {
    pub bytes: Vec<u8>,
    /// Offsets just after each header/kv/tensor-info field, the data start and each tensor end.
    pub marks: Vec<usize>,
    pub data_offset: usize,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
            align: 32,
            tensor_count_override: None,
            kv_count_override: None,
        }
    }
}

impl Builder {
    pub fn kv(mut self, key: &str, v: Val) -> Self {
        self.kvs.push((key.into(), v));
        self
    }
    pub fn tensor(mut self, t: T) -> Self {
        self.tensors.push(t);
        self
    }

    pub fn build(&self) -> Built {
        let mut w = W::default();
        w.raw(b"GGUF").u32(self.version);
        w.u64(
            self.tensor_count_override
                .unwrap_or(self.tensors.len() as u64),
        );
        w.u64(self.kv_count_override.unwrap_or(self.kvs.len() as u64));
        for (k, v) in &self.kvs {
            w.str(k);
            w.raw(&v.0[..4]);
            if v.0.len() > 4 {
                w.raw(&v.0[4..]);
            }
        }
        let mut rel = 0u64;
        let mut offsets = Vec::new();
        for t in &self.tensors {
            offsets.push(rel);
            rel += t.data.len() as u64;
            rel = rel.div_ceil(self.align) * self.align;
        }
        for (t, &off) in self.tensors.iter().zip(&offsets) {
            w.str(&t.name);
            w.u32(t.shape.len() as u32);
            for &d in &t.shape {
                w.u64(d);
            }
            w.u32(t.type_id);
            w.u64(t.offset_override.unwrap_or(off));
        }
        let pad = w.buf.len().div_ceil(self.align as usize) * self.align as usize;
        if !self.tensors.is_empty() {
            w.buf.resize(pad, 0);
            w.marks.push(pad);
        }
        let data_offset = w.buf.len();
        for (i, (t, &off)) in self.tensors.iter().zip(&offsets).enumerate() {
            w.buf.resize(data_offset + off as usize, 0);
            w.raw(&t.data);
            let _ = i;
        }
        let mut marks = w.marks;
        marks.sort();
        marks.dedup();
        Built {
            bytes: w.buf,
            marks,
            data_offset,
        }
    }
}

/// A deterministic SplitMix64 generator for reproducible corruption.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// A small but varied valid model-like file.
pub fn sample() -> Builder {
    Builder::default()
        .kv("general.architecture", Val::str("llama"))
        .kv("general.name", Val::str("tiny ✓"))
        .kv("llama.block_count", Val::u32(2))
        .kv("llama.context_length", Val::u64(4096))
        .kv("llama.rope.freq_base", Val::f32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Val::f64(1e-5))
        .kv("llama.head_count_kv", Val::i32s(&[2, 4]))
        .kv(
            "tokenizer.ggml.tokens",
            Val::strs(&["<s>", "</s>", "a", "é"]),
        )
        .kv("tokenizer.ggml.scores", Val::f32s(&[0.0, -1.0, -2.5, 3.0]))
        .kv("some.flags", Val::bools(&[true, false]))
        .kv("some.bool", Val::bool(true))
        .kv("some.i8", Val::i8(-3))
        .kv("some.u16", Val::u16(65535))
        .kv("some.i16", Val::i16(-300))
        .kv("some.i64", Val::i64(-5))
        .kv("some.u8", Val::u8(200))
        .tensor(T::f32("token_embd.weight", &[4, 3]))
        .tensor(T::raw("blk.0.attn_q.weight", &[64, 2], 2, 2 * 2 * 18))
        .tensor(T::f32("output_norm.weight", &[5]))
}
