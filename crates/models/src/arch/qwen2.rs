//! Qwen2 / Qwen2.5: the Llama graph with biases on the Q, K and V projections and
//! NeoX-style rotary embedding (set in `HParams`). Embeddings are usually tied.

use tempo9_gguf::GgufFile;

use super::llama::Llama;
use crate::weights::SpecList;
use crate::HParams;

/// Declares Qwen2's weights (Llama layout plus Q/K/V biases).
pub(crate) fn declare(hp: &HParams, file: &GgufFile, specs: &mut SpecList) -> Llama {
    Llama::declare(hp, file, specs, true)
}
