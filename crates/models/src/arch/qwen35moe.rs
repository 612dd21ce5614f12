//! Qwen3.5-MoE (e.g. Qwen3.5-35B-A3B): the Qwen3.5 hybrid graph with routed
//! experts plus a sigmoid-gated shared expert in every layer.

use tempo9_gguf::GgufFile;

use super::qwen35::Qwen35;
use crate::weights::SpecList;
use crate::HParams;

/// Declares Qwen3.5-MoE's weights (the Qwen3.5 layout, experts for the feed-forward).
pub(crate) fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Qwen35 {
    debug_assert!(hp.moe.is_some(), "qwen35moe reads expert shapes");
    Qwen35::declare(hp, file, specs)
}
