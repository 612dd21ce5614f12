//! Qwen3-VL-MoE language model: the Qwen3-MoE graph (routed experts, softmax
//! router, top-k renormalised) with Qwen3-VL's interleaved multi-section rope
//! and deepstack image features (see [`super::qwen3vl`]).

use tempo9_gguf::GgufFile;

use super::qwen3::Qwen3;
use crate::weights::SpecList;
use crate::HParams;

/// Declares Qwen3-VL-MoE's weights (the Qwen3-MoE layout).
pub(crate) fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Qwen3 {
    debug_assert!(hp.moe.is_some() && hp.rope_sections.is_some());
    Qwen3::declare(hp, file, specs)
}
