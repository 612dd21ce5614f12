//! Qwen3-VL (dense) language model: the Qwen3 block with interleaved
//! multi-section rope (text positions equal in every section, image positions
//! (t, y, x) as llama.cpp's `mtmd` assigns them) and deepstack image features
//! added to the first layers' outputs at image rows ([`crate::StepBatch::embeds`]).

use tempo9_gguf::GgufFile;

use super::qwen3::Qwen3;
use crate::weights::SpecList;
use crate::HParams;

/// Declares Qwen3-VL's weights (the Qwen3 layout; the vision tower is in the
/// projector file).
pub(crate) fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Qwen3 {
    debug_assert!(hp.rope_sections.is_some(), "qwen3vl reads rope sections");
    Qwen3::declare(hp, file, specs)
}
