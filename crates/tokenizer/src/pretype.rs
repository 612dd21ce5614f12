//! What each `tokenizer.ggml.pre` value means for a BPE vocabulary: the
//! splitting regexes (from each model's `tokenizer.json`) and the flags
//! llama.cpp sets alongside them.

use crate::pretok::{RE_DIGIT, RE_GPT2, RE_LLAMA3, RE_NEWLINES, RE_QWEN2, RE_QWEN35};
use crate::TokenizerError;

/// Settings implied by a BPE pre-tokenizer name.
#[derive(Debug, Clone)]
pub(crate) struct PreType {
    /// Canonical group name (for debugging).
    pub name: &'static str,
    pub regexes: Vec<&'static str>,
    /// Clean up spaces before punctuation when detokenizing.
    pub clean_spaces: bool,
    /// Emit a whole word directly when it is a token.
    pub ignore_merges: bool,
    /// Default for `add_bos` (the GGUF key overrides).
    pub add_bos: bool,
    /// Spaces are escaped as `▁` (SPM-style BPE).
    pub escape_whitespaces: bool,
    /// GPT-2 byte-to-unicode encoding of words.
    pub byte_encode: bool,
    /// Gemma-4 style: a word made only of newlines is emitted whole when it is a token.
    pub newline_words: bool,
}

const RE_DEFAULT: [&str; 4] = [
    "[\\p{P}\\$\\+<=>\\^~\\|]+",
    RE_GPT2,
    "\\p{N}+",
    "[0-9][0-9][0-9]",
];
const RE_DEEPSEEK_LLM: [&str; 6] = [
    "[\r\n]",
    "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+",
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    "\\p{N}+",
];
const RE_DEEPSEEK3: [&str; 3] = [
    "\\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
];
const RE_DEEPSEEK_CODER: [&str; 5] = [
    "[\r\n]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    "\\p{N}",
];
const RE_FALCON: [&str; 3] = ["[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]"];
const RE_BLOOM: &str = " ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+";
const RE_TEKKEN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_GPT4O: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_SEED_CODER: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_BAILING: &str = "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
const RE_MINICPM5: [&str; 2] = [
    "\\p{N}{1,3}",
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];

const RE_JAIS2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
const RE_SPARK2_5: [&str; 4] = [
    "\\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+",
    "\\p{N}",
];
const RE_YOUTU: [&str; 2] = [
    "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_CHAMELEON: [&str; 6] = [
    "<sentinel:[0-9]+>",
    "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
    "([\\t\\n]|    |  )",
    "\\p{N}",
    "[\\p{P}!-/:-@\\[-`{-~]",
    RE_GPT2,
];
const RE_GRANITE_EMB_MULTI: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_TINY_AYA: [&str; 2] = [
    "\\d{1,3}(?=(?:\\d{3})*\\b)",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
];
const RE_SUPERBPE: [&str; 2] = ["\\p{N}+", "(?=(\\d{3})+(?!\\d))"];
const RE_UFAKZEKA: &str = "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const RE_EXAONE_MOE: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";

impl PreType {
    fn base(name: &'static str, regexes: &[&'static str]) -> PreType {
        PreType {
            name,
            regexes: regexes.to_vec(),
            clean_spaces: true,
            ignore_merges: false,
            add_bos: false,
            escape_whitespaces: false,
            byte_encode: true,
            newline_words: false,
        }
    }
    fn no_clean(mut self) -> Self {
        self.clean_spaces = false;
        self
    }
    fn ignore_merges(mut self) -> Self {
        self.ignore_merges = true;
        self
    }
    fn bos(mut self) -> Self {
        self.add_bos = true;
        self
    }

    /// The settings for `tokenizer.ggml.pre` = `pre` (missing ⇒ `default`).
    pub(crate) fn lookup(pre: Option<&str>) -> Result<PreType, TokenizerError> {
        let pre = pre.unwrap_or("default");
        let t = match pre {
            "default" => PreType::base("default", &RE_DEFAULT),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
                PreType::base("llama3", &[RE_LLAMA3]).ignore_merges().bos()
            }
            "deepseek-llm" => PreType::base("deepseek-llm", &RE_DEEPSEEK_LLM).no_clean(),
            "deepseek-coder" => PreType::base("deepseek-coder", &RE_DEEPSEEK_CODER).no_clean(),
            "deepseek-v3" => PreType::base("deepseek-v3", &RE_DEEPSEEK3).no_clean(),
            "hunyuan-dense" | "hy_v4" | "joyai-llm" => {
                PreType::base("deepseek-v3", &RE_DEEPSEEK3).no_clean()
            }
            "falcon" => PreType::base("falcon", &RE_FALCON),
            "mpt" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "exaone4" | "olmo"
            | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "jais" => {
                PreType::base("gpt2", &[RE_GPT2])
            }
            "trillion" | "granite-docling" => PreType::base("gpt2", &[RE_GPT2]).no_clean(),
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => {
                PreType::base("starcoder", &[RE_DIGIT, RE_GPT2])
            }
            "command-r" | "smollm" => PreType::base("starcoder", &[RE_DIGIT, RE_GPT2]).no_clean(),
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
            | "grok-2" => PreType::base("qwen2", &[RE_QWEN2]).no_clean(),
            "stablelm2" | "megrez" => PreType::base("qwen2", &[RE_QWEN2]),
            "qwen35" => PreType::base("qwen35", &[RE_QWEN35]).no_clean(),
            "dbrx" | "smaug-bpe" => PreType::base("llama3", &[RE_LLAMA3]),
            "chatglm-bpe" => PreType::base("chatglm4", &[RE_LLAMA3]),
            "glm4" | "glm5" => PreType::base("chatglm4", &[RE_LLAMA3]).ignore_merges(),
            "poro-chat" => PreType::base("bloom", &[RE_BLOOM]).no_clean(),
            "bloom" | "gpt3-finnish" => PreType::base("bloom", &[RE_BLOOM]),
            "viking" => PreType::base("viking", &[RE_BLOOM, RE_DIGIT]).no_clean(),
            "tekken" => PreType::base("tekken", &[RE_TEKKEN])
                .no_clean()
                .ignore_merges()
                .bos(),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => {
                PreType::base("gpt4o", &[RE_GPT4O]).no_clean()
            }
            "seed-coder" => PreType::base("seed-coder", &[RE_SEED_CODER]).no_clean(),
            "bailingmoe" | "bailingmoe2" | "llada-moe" => {
                PreType::base("bailingmoe", &[RE_BAILING]).no_clean()
            }
            "minicpm5" => PreType::base("minicpm5", &RE_MINICPM5).ignore_merges(),
            "laguna" => PreType::base("laguna", &[RE_NEWLINES, RE_QWEN2]).no_clean(),
            "jais-2" => PreType::base("jais2", &[RE_JAIS2]),
            "spark2_5" => PreType::base("spark2_5", &RE_SPARK2_5).no_clean(),
            "youtu" => PreType::base("youtu", &RE_YOUTU).no_clean().ignore_merges(),
            "chameleon" => PreType::base("chameleon", &RE_CHAMELEON).no_clean().bos(),
            "granite-embed-multi-97m" => {
                PreType::base("granite-emb-multi", &[RE_GRANITE_EMB_MULTI])
                    .no_clean()
                    .ignore_merges()
            }
            "tiny_aya" | "cohere2moe" => PreType::base("tiny_aya", &RE_TINY_AYA).no_clean(),
            "superbpe" => PreType::base("superbpe", &RE_SUPERBPE).no_clean(),
            "ufakzeka" => PreType::base("ufakzeka", &[RE_UFAKZEKA]).no_clean(),
            "exaone-moe" => PreType::base("exaone-moe", &[RE_EXAONE_MOE]),
            "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" => {
                let name = if pre == "sarvam-moe" {
                    "sarvam-moe"
                } else {
                    "gemma4"
                };
                let mut t = PreType::base(name, &[RE_NEWLINES]);
                t.escape_whitespaces = true;
                t.byte_encode = false;
                t.newline_words = pre != "sarvam-moe";
                t.clean_spaces = pre != "sarvam-moe";
                t.add_bos = pre != "sarvam-moe";
                t
            }
            other => return Err(TokenizerError::UnsupportedPreTokenizer(other.to_string())),
        };
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pretok::PreTokenizer;

    #[test]
    fn every_named_pre_tokenizer_compiles() {
        for name in [
            "default",
            "llama3",
            "deepseek-llm",
            "deepseek-coder",
            "deepseek-v3",
            "falcon",
            "gpt-2",
            "starcoder",
            "smollm",
            "qwen2",
            "qwen35",
            "chatglm-bpe",
            "bloom",
            "viking",
            "tekken",
            "gpt-4o",
            "seed-coder",
            "bailingmoe",
            "minicpm5",
            "laguna",
            "gemma4",
            "jais-2",
            "spark2_5",
            "youtu",
            "chameleon",
            "granite-embed-multi-97m",
            "tiny_aya",
            "superbpe",
            "ufakzeka",
            "exaone-moe",
            "sarvam-moe",
        ] {
            let t = PreType::lookup(Some(name)).unwrap();
            PreTokenizer::new(&t.regexes).unwrap_or_else(|e| panic!("{name}: {e}"));
        }
        assert!(matches!(
            PreType::lookup(Some("no-such-pre")),
            Err(TokenizerError::UnsupportedPreTokenizer(_))
        ));
        assert!(!PreType::lookup(Some("smollm")).unwrap().clean_spaces);
        assert!(PreType::lookup(None).unwrap().clean_spaces);
    }
}
