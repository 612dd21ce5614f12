//! Choosing the compute device: the CPU (always there) or a GPU whose ggml backend
//! library (`libggml-cuda.so`) is loaded at run time from a backend directory.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use tempo9_ggml::{load_backend, Device, DeviceKind};
use tempo9_models::weights::Offload;

/// Which device to run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU through ggml's CUDA backend; fails if none can be used.
    Cuda,
    /// A GPU if a backend library loads and finds one, else the CPU.
    Auto,
}

/// Device flags shared by every command that loads a model.
#[derive(Args, Clone, Debug)]
pub struct DeviceArgs {
    /// Compute device: cpu, cuda, or auto (a GPU when its backend library loads).
    #[arg(long, value_enum, default_value_t = DeviceChoice::Auto)]
    pub device: DeviceChoice,
    /// Directory with ggml backend libraries such as libggml-cuda.so (default: the
    /// directory of the tempo9 binary).
    #[arg(long, value_name = "DIR", env = "TEMPO9_BACKEND_DIR")]
    pub backend_dir: Option<PathBuf>,
    /// Transformer layers on the GPU, counted from the last one (like llama.cpp's
    /// --n-gpu-layers): their weights and KV cache go to the GPU, the other layers'
    /// stay in host memory and run on the CPU; the output layer joins the GPU once
    /// every layer is there. Default: the whole model. Ignored on the CPU.
    #[arg(long, value_name = "N")]
    pub gpu_layers: Option<usize>,
}

/// Library file of the CUDA backend.
const CUDA_LIB: &str = "libggml-cuda.so";

/// Loads the CUDA backend library once per process; returns its devices, or why not.
fn cuda_devices(dir: Option<&PathBuf>) -> &'static Result<Vec<Device>, String> {
    static LOADED: OnceLock<Result<Vec<Device>, String>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let dir = match dir {
            Some(d) => d.clone(),
            None => std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.to_path_buf()))
                .ok_or("cannot tell where the tempo9 binary is")?,
        };
        let path = dir.join(CUDA_LIB);
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
        // library starts any kernel, while no other thread reads the environment.
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
        tracing::info!(lib = %path.display(), devices = ?devs, "loaded ggml backend");
        Ok(devs)
    })
}

/// Where the vision encoder runs (`serve --vision-device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VisionDevice {
    /// The CPU.
    Cpu,
    /// An NVIDIA GPU through ggml's CUDA backend; fails if none can be used.
    Cuda,
    /// The language model's device.
    Same,
}

impl DeviceArgs {
    /// The vision encoder's device: `choice`, or by default a compute unit other
    /// than the language model's (`lm`) when there is one (the CPU beside a GPU,
    /// a GPU beside the CPU), so encodes and decode steps do not share one.
    pub fn vision_device(&self, choice: Option<VisionDevice>, lm: Device) -> Result<Device> {
        Ok(match choice {
            Some(VisionDevice::Cpu) => Device::cpu(),
            Some(VisionDevice::Same) => lm,
            Some(VisionDevice::Cuda) => self.first_gpu().map_err(|e| {
                anyhow::anyhow!(
                    "--vision-device cuda: {e} (build it with scripts/gpu/build-cuda.sh; \
                     --backend-dir or TEMPO9_BACKEND_DIR say where it is)"
                )
            })?,
            None if lm.kind() != DeviceKind::Cpu => Device::cpu(),
            // Only look for a GPU where the model's device choice allowed one.
            None if self.device != DeviceChoice::Cpu => {
                self.first_gpu().unwrap_or_else(|_| Device::cpu())
            }
            None => Device::cpu(),
        })
    }

    /// The CUDA backend's first GPU, or why there is none.
    fn first_gpu(&self) -> Result<Device, String> {
        match cuda_devices(self.backend_dir.as_ref()) {
            Ok(devs) => devs
                .iter()
                .copied()
                .find(|d| matches!(d.kind(), DeviceKind::Gpu | DeviceKind::IGpu))
                .ok_or_else(|| "the CUDA backend found no GPU".to_string()),
            Err(e) => Err(e.clone()),
        }
    }

    /// Which layers the GPU gets (`--gpu-layers`).
    pub fn offload(&self) -> Offload {
        self.gpu_layers.map_or(Offload::All, Offload::Layers)
    }

    /// The device the flags ask for.
    pub fn select(&self) -> Result<Device> {
        if self.device == DeviceChoice::Cpu {
            return Ok(Device::cpu());
        }
        let gpu = self.first_gpu();
        match (gpu, self.device) {
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
            (Err(e), DeviceChoice::Cuda) => bail!(
                "--device cuda: {e} (build it with scripts/gpu/build-cuda.sh; \
                 --backend-dir or TEMPO9_BACKEND_DIR say where it is)"
            ),
            (Err(e), _) => {
                tracing::debug!("no GPU ({e}); using the CPU");
                Ok(Device::cpu())
            }
        }
    }
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
