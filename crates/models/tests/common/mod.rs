//! Shared test helpers: a GGUF writer for synthetic models, and locating
//! the real models.

#![allow(dead_code)]

use std::path::PathBuf;

use tempo9_gguf::{ArrayValue, GgmlType, GgufWriter, Value};

/// A synthetic model's writer: metadata and F32 tensors in memory, written
/// through [`GgufWriter`] (the layout `tempo9 synth-gguf` writes).
pub struct Writer {
    gguf: GgufWriter,
    data: Vec<Vec<f32>>,
}

impl Writer {
    pub fn new(arch: &str) -> Writer {
        let mut w = Writer {
            gguf: GgufWriter::new(),
            data: Vec::new(),
        };
        w.string("general.architecture", arch);
        w
    }
    pub fn string(&mut self, k: &str, v: &str) {
        self.gguf.set(k, Value::String(v.into()));
    }
    pub fn u32(&mut self, k: &str, v: u32) {
        self.gguf.set(k, Value::U32(v));
    }
    pub fn f32(&mut self, k: &str, v: f32) {
        self.gguf.set(k, Value::F32(v));
    }
    pub fn bool(&mut self, k: &str, v: bool) {
        self.gguf.set(k, Value::Bool(v));
    }
    pub fn f32_array(&mut self, k: &str, v: &[f32]) {
        self.gguf.set(k, Value::Array(ArrayValue::F32(v.to_vec())));
    }
    pub fn i32_array(&mut self, k: &str, v: &[i32]) {
        self.gguf.set(k, Value::Array(ArrayValue::I32(v.to_vec())));
    }
    /// A tensor of given values.
    pub fn tensor_values(&mut self, name: &str, shape: &[usize], data: Vec<f32>) {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        let shape: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        self.gguf
            .add_tensor(name, &shape, GgmlType::F32)
            .expect("tensor");
        self.data.push(data);
    }
    /// A tensor of xorshift64 values in [-0.2, 0.2].
    pub fn tensor(&mut self, name: &str, shape: &[usize], seed: &mut u64) {
        let n: usize = shape.iter().product();
        let data = (0..n)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                ((*seed % 2001) as f32 / 1000.0 - 1.0) * 0.2
            })
            .collect();
        self.tensor_values(name, shape, data);
    }
    pub fn finish(self) -> Vec<u8> {
        let data = self.data;
        self.gguf
            .to_bytes(|i| data[i].iter().flat_map(|x| x.to_le_bytes()).collect())
            .expect("GGUF in memory")
    }
}

/// Path of a real model (under `$TEMPO9_MODELS`, default `~/.cache/tempo9/models`);
/// panics (fails the test) when missing unless TEMPO9_SKIP_MODEL_TESTS=1, in which
/// case it returns None.
pub fn model_path(file: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TEMPO9_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/tempo9/models")
        });
    let p = dir.join(file);
    if p.exists() {
        return Some(p);
    }
    if std::env::var("TEMPO9_SKIP_MODEL_TESTS").as_deref() == Ok("1") {
        eprintln!("skipping: {} missing", p.display());
        return None;
    }
    panic!(
        "model {} missing: run scripts/fetch-models.sh (or set TEMPO9_SKIP_MODEL_TESTS=1)",
        p.display()
    );
}

/// The compiler target this build's ggml was compiled for (`tempo9_ggml::KernelSet::codegen`).
pub fn codegen() -> String {
    tempo9_ggml::KernelSet::codegen()
}
