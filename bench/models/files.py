"""The model files of the matrix: what each is, and which committed fixtures check it.

Facts about the files only (architecture, origin, the fixtures and engine tests
that apply); every result comes from a run (`matrix.py`).
"""

from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class ModelFile:
    """One GGUF file in ~/.cache/tempo9/models and what checks it."""

    #: Short name (the row's label and the results key).
    name: str
    #: File name under $TEMPO9_MODELS.
    file: str
    #: GGUF architecture, as general.architecture names it.
    arch: str
    #: True for a published file (scripts/fetch-models.sh), False for a synthetic one.
    real: bool
    #: One line on what the file is (shape, vocabulary, template).
    about: str
    #: tests/fixtures/<dir> holding greedy/<kernel set>.json, if any.
    greedy_dir: Optional[str] = None
    #: The greedy fixture's prompts carry images (vision files).
    greedy_vision: bool = False
    #: Engine tokenizer tests (crate test file, test name) that check this file's vocabulary.
    tokenizer_tests: tuple = ()
    #: Why no tokenizer test applies, when none does.
    tokenizer_note: str = ""
    #: Engine template test (crate test file, test name) comparing its chat template with llama.cpp's.
    template_test: Optional[tuple] = None
    #: Why no template test applies, when none does.
    template_note: str = ""
    #: Extra `tempo9 serve` flags, as the fixtures' llama-server ran (`--swa-full`).
    serve_flags: tuple = ()
    #: Name of the file in committed H200 comparison results (bench/results/*.compare.jsonl).
    cuda_key: Optional[str] = None
    #: Extra notes kept on the page.
    notes: tuple = field(default_factory=tuple)


# Engine tests, by vocabulary / template (crates/tokenizer/tests/).
QWEN2_VOCAB = (("vocab_files", "qwen2_test_vectors_match_llama_cpp"),
               ("vocab_files", "qwen2_corpus_matches_llama_tokenize"))
QWEN35_VOCAB = (("vocab_files", "qwen35_test_vectors_match_llama_cpp"),
                ("vocab_files", "qwen35_corpus_matches_llama_tokenize"))
LLAMA3_VOCAB = (("vocab_files", "llama_bpe_test_vectors_match_llama_cpp"),
                ("vocab_files", "llama_bpe_corpus_matches_llama_tokenize"))
GEMMA4_VOCAB = (("vocab_files", "gemma_4_test_vectors_match_llama_cpp"),
                ("vocab_files", "gemma_4_corpus_matches_llama_tokenize"))
QWEN3_TEMPLATE = ("chat_fixtures", "qwen3_template_matches_llama_cpp")
QWEN35_TEMPLATE = ("chat_fixtures", "qwen35_template_matches_llama_cpp")
LLAMA3_TEMPLATE = ("chat_fixtures", "llama3_template_matches_llama_cpp")
MINISTRAL3_TEMPLATE = ("chat_fixtures", "ministral3_template_matches_llama_cpp")
GPT_OSS_TEMPLATE = ("chat_fixtures", "gpt_oss_template_matches_llama_cpp")
GEMMA4_TEMPLATE = ("chat_fixtures", "gemma4_template_matches_llama_cpp")

FILES = [
    ModelFile("smollm2-135m", "smollm2-135m-instruct-q4_1.gguf", "llama", True,
              "SmolLM2-135M-Instruct Q4_1", greedy_dir="smollm2",
              tokenizer_tests=(("tokenize_fixtures", "smollm2_matches_llama_cpp"),),
              template_test=("chat_fixtures", "smollm2_chat_matches_llama_cpp"),
              cuda_key="smollm2-135m-instruct-q4_1"),
    ModelFile("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "qwen2", True,
              "Qwen2.5-Coder-0.5B-Instruct Q4_K_M", greedy_dir="qwen2.5-coder",
              tokenizer_tests=(("tokenize_fixtures", "qwen25_coder_matches_llama_cpp"),),
              template_test=("chat_fixtures", "qwen25_coder_chat_matches_llama_cpp")),
    ModelFile("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "qwen2", True,
              "Qwen2.5-Coder-1.5B-Instruct Q4_K_M", greedy_dir="qwen2.5-coder-1.5b",
              tokenizer_tests=(("tokenize_fixtures", "qwen25_coder_1_5b_matches_llama_cpp"),),
              template_test=("chat_fixtures", "qwen25_coder_1_5b_chat_matches_llama_cpp")),
    ModelFile("gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "gemma3", True,
              "Gemma 3 270M Q4_K_M (no chat template: ChatML fallback)", greedy_dir="gemma3",
              tokenizer_tests=(("tokenize_fixtures", "gemma3_matches_llama_cpp"),),
              template_note="the file has no chat template", serve_flags=("--swa-full",)),
    ModelFile("qwen3-tiny", "qwen3-tiny.gguf", "qwen3", False,
              "q8_0, Qwen2 vocabulary, Qwen3-0.6B template", greedy_dir="qwen3-tiny",
              tokenizer_tests=QWEN2_VOCAB, template_test=QWEN3_TEMPLATE, cuda_key="qwen3-tiny"),
    ModelFile("qwen3moe-tiny", "qwen3moe-tiny.gguf", "qwen3moe", False,
              "q8_0, 8 experts (2 used), Qwen2 vocabulary, Qwen3-0.6B template",
              greedy_dir="qwen3moe-tiny", tokenizer_tests=QWEN2_VOCAB,
              template_test=QWEN3_TEMPLATE, cuda_key="qwen3moe-tiny"),
    ModelFile("qwen35-tiny", "qwen35-tiny.gguf", "qwen35", False,
              "q8_0, gated DeltaNet + gated attention every 4th layer, Qwen3.5 vocabulary and template",
              greedy_dir="qwen35-tiny", tokenizer_tests=QWEN35_VOCAB,
              template_test=QWEN35_TEMPLATE, cuda_key="qwen35-tiny"),
    ModelFile("qwen35moe-tiny", "qwen35moe-tiny.gguf", "qwen35moe", False,
              "as qwen35-tiny plus 8 routed experts and the gated shared expert",
              greedy_dir="qwen35moe-tiny", tokenizer_tests=QWEN35_VOCAB,
              template_test=QWEN35_TEMPLATE, cuda_key="qwen35moe-tiny"),
    ModelFile("qwen35-tiny-mtp", "qwen35-tiny-mtp.gguf", "qwen35", False,
              "qwen35-tiny with a multi-token-prediction (nextn) block (MTP-draft fixtures only)",
              tokenizer_tests=QWEN35_VOCAB, template_test=QWEN35_TEMPLATE),
    ModelFile("qwen35moe-tiny-mtp", "qwen35moe-tiny-mtp.gguf", "qwen35moe", False,
              "qwen35moe-tiny with a multi-token-prediction (nextn) block (MTP-draft fixtures only)",
              tokenizer_tests=QWEN35_VOCAB, template_test=QWEN35_TEMPLATE),
    ModelFile("llama3-tiny", "llama3-tiny.gguf", "llama", False,
              "Llama 3 rope scaling (`rope_freqs.weight`), Llama 3 vocabulary, Llama 3.1 template",
              greedy_dir="llama3-tiny", cuda_key="llama3-tiny", tokenizer_tests=LLAMA3_VOCAB, template_test=LLAMA3_TEMPLATE),
    ModelFile("mistral3-tiny", "mistral3-tiny.gguf", "mistral3", False,
              "YaRN over 256 original positions, query temperature; Llama 3 vocabulary "
              "(no Mistral vocab-only file exists), Ministral-3 template",
              greedy_dir="mistral3-tiny", cuda_key="mistral3-tiny", tokenizer_tests=LLAMA3_VOCAB,
              template_test=MINISTRAL3_TEMPLATE),
    ModelFile("gpt-oss-tiny", "gpt-oss-tiny.gguf", "gpt-oss", False,
              "MXFP4 experts, sliding window 128 on even layers, attention sinks, YaRN; "
              "Llama 3 vocabulary (no o200k vocab-only file exists), gpt-oss template",
              greedy_dir="gpt-oss-tiny", cuda_key="gpt-oss-tiny", tokenizer_tests=LLAMA3_VOCAB,
              template_test=GPT_OSS_TEMPLATE,
              serve_flags=("--swa-full",)),
    ModelFile("gemma4-tiny", "gemma4-tiny.gguf", "gemma4", False,
              "q8_0, E2B's layout in small (sliding and full layers, KV sharing, per-layer "
              "embeddings, soft-capped logits), Gemma 4 vocabulary, gemma-4-31B-it template",
              greedy_dir="gemma4-tiny", cuda_key="gemma4-tiny", tokenizer_tests=GEMMA4_VOCAB,
              template_test=GEMMA4_TEMPLATE,
              # Flash attention at every depth, as the fixtures' llama.cpp: on these
              # random-weight files the matmul path's rounding alone changes greedy
              # tokens (crates/engine/tests/parity.rs, `flash_decode`).
              serve_flags=("--swa-full", "--flash-decode")),
    ModelFile("gemma4moe-tiny", "gemma4moe-tiny.gguf", "gemma4", False,
              "26B-A4B's layout in small: dense MLP beside 8 GELU experts (2 used)",
              greedy_dir="gemma4moe-tiny", cuda_key="gemma4moe-tiny", tokenizer_tests=GEMMA4_VOCAB,
              template_test=GEMMA4_TEMPLATE,
              # Flash attention at every depth, as the fixtures' llama.cpp: on these
              # random-weight files the matmul path's rounding alone changes greedy
              # tokens (crates/engine/tests/parity.rs, `flash_decode`).
              serve_flags=("--swa-full", "--flash-decode")),
    ModelFile("qwen3vl-tiny", "qwen3vl-tiny.gguf", "qwen3vl", False,
              "qwen3-tiny's shape with Qwen3-VL's M-RoPE and deepstack inputs (text only here)",
              greedy_dir="qwen3vl-tiny", greedy_vision=True, tokenizer_tests=QWEN2_VOCAB,
              template_test=QWEN3_TEMPLATE),
    ModelFile("qwen3vlmoe-tiny", "qwen3vlmoe-tiny.gguf", "qwen3vlmoe", False,
              "qwen3moe-tiny's shape with Qwen3-VL's M-RoPE and deepstack inputs (text only here)",
              greedy_dir="qwen3vlmoe-tiny", greedy_vision=True, tokenizer_tests=QWEN2_VOCAB,
              template_test=QWEN3_TEMPLATE),
]
