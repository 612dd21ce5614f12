//! Choosing the compute device from the command line: the CPU (always there) or a
//! GPU whose ggml backend library (`libggml-cuda.so`) is loaded at run time from a
//! backend directory (`tempo9_ggml::gpu`, shared with the SDK).

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, ValueEnum};
use tempo9_ggml::{gpu, Device, DeviceKind};
use tempo9_models::weights::Offload;

pub use tempo9_ggml::gpu::loaded_ggml_libs;

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

impl From<DeviceChoice> for gpu::DeviceChoice {
    fn from(c: DeviceChoice) -> Self {
        match c {
            DeviceChoice::Cpu => gpu::DeviceChoice::Cpu,
            DeviceChoice::Cuda => gpu::DeviceChoice::Cuda,
            DeviceChoice::Auto => gpu::DeviceChoice::Auto,
        }
    }
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
        gpu::first_gpu(self.backend_dir.as_deref())
    }

    /// Which layers the GPU gets (`--gpu-layers`).
    pub fn offload(&self) -> Offload {
        self.gpu_layers.map_or(Offload::All, Offload::Layers)
    }

    /// The device the flags ask for.
    pub fn select(&self) -> Result<Device> {
        match gpu::DeviceChoice::from(self.device).select(self.backend_dir.as_deref()) {
            Ok(d) => Ok(d),
            Err(e) => bail!(
                "--device cuda: {e} (build it with scripts/gpu/build-cuda.sh; \
                 --backend-dir or TEMPO9_BACKEND_DIR say where it is)"
            ),
        }
    }
}
