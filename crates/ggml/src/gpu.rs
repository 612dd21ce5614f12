//! Finding a GPU: ggml's CUDA backend library (`libggml-cuda.so`) is loaded at run
//! time from a backend directory, once per process. The server, the CLI and the
//! SDK choose their device through this one path.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::{load_backend, Device, DeviceKind};

/// Library file of the CUDA backend.
pub const CUDA_LIB: &str = "libggml-cuda.so";

/// Which device to run a model on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU through ggml's CUDA backend; an error if none can be used.
    Cuda,
    /// A GPU if the backend library loads and finds one, else the CPU.
    #[default]
    Auto,
}

impl DeviceChoice {
    /// The device this choice gives, with the backend library looked for in `dir`
    /// (see [`backend_dir`]). `Cuda` without a usable GPU is an error that says why.
    pub fn select(self, dir: Option<&Path>) -> Result<Device, String> {
        if self == DeviceChoice::Cpu {
            return Ok(Device::cpu());
        }
        match (first_gpu(dir), self) {
            (Ok(d), _) => {
                let (free, total) = d.memory();
                tracing::info!(
                    device = %d.name(),
                    description = %d.description(),
                    free_mib = free >> 20,
                    total_mib = total >> 20,
                    "using GPU"
                );
                Ok(d)
            }
            (Err(e), DeviceChoice::Cuda) => Err(e),
            (Err(e), _) => {
                tracing::debug!("no GPU ({e}); using the CPU");
                Ok(Device::cpu())
            }
        }
    }
}

/// Where backend libraries are looked for: `dir` if given, else the
/// `TEMPO9_BACKEND_DIR` environment variable, else the running executable's
/// directory.
pub fn backend_dir(dir: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(d) = dir {
        return Ok(d.to_path_buf());
    }
    if let Some(d) = std::env::var_os("TEMPO9_BACKEND_DIR") {
        return Ok(PathBuf::from(d));
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| "cannot tell where the running executable is".to_string())
}

/// The CUDA backend's first GPU, or why there is none. The library is loaded on
/// the first call (from [`backend_dir`]`(dir)`); later calls reuse that outcome,
/// whatever `dir` they pass.
pub fn first_gpu(dir: Option<&Path>) -> Result<Device, String> {
    cuda_devices(dir)
        .as_ref()
        .map_err(Clone::clone)?
        .iter()
        .copied()
        .find(|d| matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IGpu))
        .ok_or_else(|| "the CUDA backend found no GPU".to_string())
}

/// Loads the CUDA backend library once per process; its devices, or why not.
fn cuda_devices(dir: Option<&Path>) -> &'static Result<Vec<Device>, String> {
    static LOADED: OnceLock<Result<Vec<Device>, String>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let path = backend_dir(dir)?.join(CUDA_LIB);
        if !path.exists() {
            return Err(format!("{} not found", path.display()));
        }
        let devs = load_backend(&path).map_err(|e| e.to_string())?;
        // ggml-cuda launches kernels with programmatic dependent launch (PDL) on
        // Hopper by default; replayed as CUDA graphs, that gave wrong numbers on an
        // H200 (single-sequence Qwen2 decode: log-probabilities off by up to 0.96
        // nats, greedy tokens changed at wide margins; PDL off: all differences from
        // the CPU at near-ties, 0.09 nats at most), and only through the
        // flash-attention kernels (PDL for them alone: wrong; for every op but
        // them: as without PDL; scripts/gpu/run-h200.sh `pdlbisect`). A library
        // built by scripts/gpu/build-cuda.sh can limit PDL by op (feature
        // PDL_OPS): PDL then stays on but for flash attention; another library runs
        // without PDL (~9% less decode speed). Unless the user chose. Set before the
        // library starts any kernel.
        if std::env::var_os("GGML_CUDA_PDL").is_none() {
            let op_filter = devs.iter().any(|d| {
                d.backend_features()
                    .iter()
                    .any(|(n, v)| n == "PDL_OPS" && v == "1")
            });
            if op_filter {
                std::env::set_var("GGML_CUDA_PDL", "1");
                let chosen = ["GGML_CUDA_PDL_OPS", "GGML_CUDA_PDL_NOT_OPS"]
                    .iter()
                    .any(|v| std::env::var_os(v).is_some());
                if !chosen {
                    std::env::set_var("GGML_CUDA_PDL_NOT_OPS", "FLASH_ATTN_EXT");
                }
            } else {
                std::env::set_var("GGML_CUDA_PDL", "0");
            }
        }
        // A library from scripts/gpu/build-cuda.sh gives the model's steps
        // high-priority streams (crate::HIGH_PRIORITY_STREAMS); another runs them at
        // the default priority.
        let stream_priority = devs.iter().any(|d| {
            d.backend_features()
                .iter()
                .any(|(n, v)| n == "STREAM_PRIORITY" && v == "1")
        });
        tracing::info!(lib = %path.display(), devices = ?devs, stream_priority, "loaded ggml backend");
        Ok(devs)
    })
}

/// Paths of the ggml libraries mapped into this process (Linux; empty elsewhere).
/// A loaded backend must share the process's one `libggml-base`: two copies would
/// mean two backend registries and crashes, so benchmarks record this list.
pub fn loaded_ggml_libs() -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut libs: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| p.contains("libggml"))
        .map(str::to_string)
        .collect();
    libs.sort();
    libs.dedup();
    libs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_needs_no_backend_library() {
        let d = DeviceChoice::Cpu
            .select(Some(Path::new("/nonexistent")))
            .unwrap();
        assert_eq!(d.kind(), DeviceKind::Cpu);
    }

    #[test]
    fn a_named_directory_comes_first() {
        assert_eq!(
            backend_dir(Some(Path::new("/x/y"))).unwrap(),
            PathBuf::from("/x/y")
        );
    }
}
