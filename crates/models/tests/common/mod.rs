//! Shared test helpers: a minimal GGUF writer for synthetic models, and locating
//! the real models.

#![allow(dead_code)]

use std::path::PathBuf;

/// Minimal GGUF v3 writer: string/u32/f32 metadata and F32 tensors.
pub struct Writer {
    kv: Vec<u8>,
    n_kv: u64,
    tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
}

impl Writer {
    pub fn new(arch: &str) -> Writer {
        let mut w = Writer {
            kv: Vec::new(),
            n_kv: 0,
            tensors: Vec::new(),
        };
        w.string("general.architecture", arch);
        w
    }
    pub fn key(&mut self, k: &str, ty: u32) {
        self.kv.extend((k.len() as u64).to_le_bytes());
        self.kv.extend(k.as_bytes());
        self.kv.extend(ty.to_le_bytes());
        self.n_kv += 1;
    }
    pub fn string(&mut self, k: &str, v: &str) {
        self.key(k, 8);
        self.kv.extend((v.len() as u64).to_le_bytes());
        self.kv.extend(v.as_bytes());
    }
    pub fn u32(&mut self, k: &str, v: u32) {
        self.key(k, 4);
        self.kv.extend(v.to_le_bytes());
    }
    pub fn f32(&mut self, k: &str, v: f32) {
        self.key(k, 6);
        self.kv.extend(v.to_le_bytes());
    }
    pub fn bool(&mut self, k: &str, v: bool) {
        self.key(k, 7);
        self.kv.push(u8::from(v));
    }
    pub fn f32_array(&mut self, k: &str, v: &[f32]) {
        self.key(k, 9);
        self.kv.extend(6u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend(x.to_le_bytes());
        }
    }
    pub fn i32_array(&mut self, k: &str, v: &[i32]) {
        self.key(k, 9);
        self.kv.extend(5u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend(x.to_le_bytes());
        }
    }
    /// A tensor of given values.
    pub fn tensor_values(&mut self, name: &str, shape: &[usize], data: Vec<f32>) {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        self.tensors.push((name.into(), shape.to_vec(), data));
    }
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
        self.tensors.push((name.into(), shape.to_vec(), data));
    }
    pub fn finish(self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.n_kv.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, shape, data) in &self.tensors {
            out.extend((name.len() as u64).to_le_bytes());
            out.extend(name.as_bytes());
            out.extend((shape.len() as u32).to_le_bytes());
            for &d in shape {
                out.extend((d as u64).to_le_bytes());
            }
            out.extend(0u32.to_le_bytes()); // F32
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64 * 4).div_ceil(32) * 32;
        }
        while !out.len().is_multiple_of(32) {
            out.push(0);
        }
        for (_, _, data) in &self.tensors {
            for x in data {
                out.extend(x.to_le_bytes());
            }
            while !out.len().is_multiple_of(32) {
                out.push(0);
            }
        }
        out
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
