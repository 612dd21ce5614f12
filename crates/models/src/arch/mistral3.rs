//! Mistral 3 (Ministral 3, the text model of Mistral Small 3.x): the Llama graph
//! (normal rope, grouped-query attention, SwiGLU) with YaRN rope scaling (in
//! `HParams::rope`) and, when the file has `attention.temperature_scale`, queries
//! scaled by a factor that grows with the logarithm of the position (Llama 4's
//! attention temperature; `HParams::attn_temp`).

use tempo9_gguf::GgufFile;

use super::llama::Llama;
use crate::weights::SpecList;
use crate::HParams;

/// Declares Mistral 3's weights (the Llama layout).
pub(crate) fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Llama {
    Llama::declare(hp, file, specs, false)
}
