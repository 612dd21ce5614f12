//! Qwen3-MoE: the Qwen3 graph with routed experts in every layer (softmax router,
//! top-k renormalised, no shared expert).

use tempo9_gguf::GgufFile;

use super::qwen3::Qwen3;
use crate::weights::SpecList;
use crate::HParams;

/// Declares Qwen3-MoE's weights (the Qwen3 layout, experts for the feed-forward).
pub(crate) fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Qwen3 {
    debug_assert!(hp.moe.is_some(), "qwen3moe reads expert shapes");
    Qwen3::declare(hp, file, specs)
}
