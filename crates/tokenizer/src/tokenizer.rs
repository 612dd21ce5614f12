//! The vocabulary and the encode/decode entry points, following llama.cpp's
//! `llama_vocab` semantics (special-token partitioning, BOS/EOS rules,
//! end-of-generation set, token pieces, detokenization clean-up).

use std::borrow::Cow;

use aho_corasick::AhoCorasick;
use rustc_hash::{FxHashMap, FxHashSet};
use tempo9_gguf::GgufFile;

use crate::bpe::Bpe;
use crate::literal::Literals;
use crate::pretype::PreType;
use crate::spm;
use crate::unicode::char_to_byte;
use crate::TokenizerError;

/// Per-token attribute bits (llama.cpp's `llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u16 = 1 << 0;
    pub const UNUSED: u16 = 1 << 1;
    pub const NORMAL: u16 = 1 << 2;
    pub const CONTROL: u16 = 1 << 3;
    pub const USER_DEFINED: u16 = 1 << 4;
    pub const BYTE: u16 = 1 << 5;
    pub const LSTRIP: u16 = 1 << 7;
    pub const RSTRIP: u16 = 1 << 8;
}

/// The tokenization algorithm a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// SentencePiece-style: merges by token score, `▁` for spaces, `<0xXX>`
    /// byte fallback (`tokenizer.ggml.model` = `llama`).
    Spm,
    /// Byte-pair encoding with ranked merges and a pre-tokenizer
    /// (`tokenizer.ggml.model` = `gpt2`, or `gemma4` for SPM-style BPE).
    Bpe,
}

/// Special-token ids as stored in metadata; `None` where a key is absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokenIds {
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// `tokenizer.ggml.seperator_token_id` (sic).
    pub sep: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.mask_token_id`.
    pub mask: Option<u32>,
    /// `tokenizer.ggml.fim_pre_token_id` (or the older `prefix_token_id`).
    pub fim_pre: Option<u32>,
    /// `tokenizer.ggml.fim_suf_token_id` (or the older `suffix_token_id`).
    pub fim_suf: Option<u32>,
    /// `tokenizer.ggml.fim_mid_token_id` (or the older `middle_token_id`).
    pub fim_mid: Option<u32>,
    /// `tokenizer.ggml.fim_pad_token_id`.
    pub fim_pad: Option<u32>,
    /// `tokenizer.ggml.fim_rep_token_id`.
    pub fim_rep: Option<u32>,
    /// `tokenizer.ggml.fim_sep_token_id`.
    pub fim_sep: Option<u32>,
}

/// Everything a [`Tokenizer`] is built from, as plain values: what
/// [`Tokenizer::from_gguf`] reads from the `tokenizer.*` metadata.
#[derive(Clone, Debug, Default)]
pub struct TokenizerConfig {
    /// `tokenizer.ggml.model`: `llama` (SPM) or `gpt2` (BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer name.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SPM merge priorities).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges` (BPE), `"left right"` in rank order.
    pub merges: Option<Vec<String>>,
    /// Special-token ids.
    pub special: SpecialTokenIds,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name` (a few models get per-token strip attributes by name).
    pub model_name: Option<String>,
}

enum Model {
    Spm,
    Bpe(Box<Bpe>),
}

/// One piece of input after special tokens have been cut out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}

/// A tokenizer built from GGUF metadata that tokenizes and detokenizes
/// exactly like llama.cpp does for the same file.
pub struct Tokenizer {
    kind: TokenizerKind,
    model: Model,
    texts: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u16>,
    token_to_id: FxHashMap<String, u32>,
    /// `token_to_piece(id, special = true)` for every token, concatenated.
    pieces: Vec<u8>,
    piece_offsets: Vec<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    eog: FxHashSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    escape_whitespaces: bool,
    /// Control / user-defined / unknown tokens, longest text first.
    specials: Vec<u32>,
    /// Finds which of `specials` occur in a text (pattern index = position in `specials`).
    special_finder: Option<AhoCorasick>,
    /// SPM byte fallback: token for each raw byte.
    byte_token: [Option<u32>; 256],
    /// The control-token strings chat messages are escaped with.
    literals: Literals,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind)
            .field("vocab_size", &self.texts.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .finish_non_exhaustive()
    }
}

/// Token texts llama.cpp treats as end-of-generation.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn gguf_u32(f: &GgufFile, key: &str) -> Result<Option<u32>, TokenizerError> {
    // Ids are sometimes stored signed; a negative one counts as absent.
    match f.metadata().get_i32(key) {
        Ok(Some(v)) if v < 0 => Ok(None),
        _ => Ok(f.metadata().get_u32(key)?),
    }
}

impl TokenizerConfig {
    /// Reads the `tokenizer.*` metadata of a GGUF file.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        let md = f.metadata();
        let model = md
            .get_str("tokenizer.ggml.model")?
            .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.model".into()))?
            .to_string();
        let tokens = md
            .get_str_array("tokenizer.ggml.tokens")?
            .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.tokens".into()))?
            .to_vec();
        let id = |k: &str| gguf_u32(f, &format!("tokenizer.ggml.{k}"));
        let special = SpecialTokenIds {
            bos: id("bos_token_id")?,
            eos: id("eos_token_id")?,
            eot: id("eot_token_id")?,
            eom: id("eom_token_id")?,
            unk: id("unknown_token_id")?,
            sep: id("seperator_token_id")?,
            pad: id("padding_token_id")?,
            mask: id("mask_token_id")?,
            fim_pre: id("prefix_token_id")?.or(id("fim_pre_token_id")?),
            fim_suf: id("suffix_token_id")?.or(id("fim_suf_token_id")?),
            fim_mid: id("middle_token_id")?.or(id("fim_mid_token_id")?),
            fim_pad: id("fim_pad_token_id")?,
            fim_rep: id("fim_rep_token_id")?,
            fim_sep: id("fim_sep_token_id")?,
        };
        Ok(TokenizerConfig {
            model,
            pre: md.get_str("tokenizer.ggml.pre")?.map(str::to_string),
            tokens,
            scores: md
                .get_f32_array("tokenizer.ggml.scores")?
                .map(<[f32]>::to_vec),
            token_types: md
                .get_i32_array("tokenizer.ggml.token_type")?
                .map(<[i32]>::to_vec),
            merges: md
                .get_str_array("tokenizer.ggml.merges")?
                .map(<[String]>::to_vec),
            special,
            add_bos: md.get_bool("tokenizer.ggml.add_bos_token")?,
            add_eos: md.get_bool("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: md.get_bool("tokenizer.ggml.add_space_prefix")?,
            model_name: md.get_str("general.name")?.map(str::to_string),
        })
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_config(TokenizerConfig::from_gguf(f)?)
    }

    /// Builds a tokenizer from plain metadata values.
    pub fn from_config(cfg: TokenizerConfig) -> Result<Self, TokenizerError> {
        let n = cfg.tokens.len();
        if n == 0 {
            return Err(TokenizerError::Invalid("empty vocabulary".into()));
        }
        if n >= u32::MAX as usize / 2 {
            return Err(TokenizerError::Invalid(format!(
                "vocabulary too large: {n}"
            )));
        }
        let kind = match cfg.model.as_str() {
            "llama" => TokenizerKind::Spm,
            "gpt2" | "gemma4" => TokenizerKind::Bpe,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };

        // Defaults per model type (llama.cpp), then metadata overrides.
        let pretype = match kind {
            // A `gemma4` vocabulary always uses the Gemma-4 pre-tokenizer.
            TokenizerKind::Bpe if cfg.model == "gemma4" => Some(PreType::lookup(Some("gemma4"))?),
            TokenizerKind::Bpe => Some(PreType::lookup(cfg.pre.as_deref())?),
            TokenizerKind::Spm => None,
        };
        let (mut bos, mut eos, mut unk) = match kind {
            TokenizerKind::Spm => (Some(1), Some(2), Some(0)),
            TokenizerKind::Bpe if cfg.model == "gemma4" => (None, None, None),
            TokenizerKind::Bpe => (Some(11), Some(11), None),
        };
        if matches!(cfg.pre.as_deref(), Some("chatglm-bpe" | "glm4" | "glm5")) {
            bos = None;
        }
        let (mut add_bos, mut add_eos, add_space_prefix_default, clean_spaces, escape_ws) =
            match &pretype {
                None => (true, false, true, false, true),
                Some(p) => (
                    p.add_bos,
                    false,
                    false,
                    p.clean_spaces,
                    p.escape_whitespaces,
                ),
            };
        let add_space_prefix = cfg.add_space_prefix.unwrap_or(add_space_prefix_default);

        // Vocabulary.
        let mut texts = cfg.tokens;
        let mut token_to_id: FxHashMap<String, u32> = FxHashMap::default();
        token_to_id.reserve(n);
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                *t = format!("[EMPTY_{i}]");
            }
            token_to_id.insert(t.clone(), i as u32);
        }
        let scores = match cfg.scores {
            Some(s) if s.len() >= n => s[..n].to_vec(),
            Some(s) => {
                return Err(TokenizerError::Invalid(format!(
                    "{} scores for {n} tokens",
                    s.len()
                )))
            }
            None => vec![0.0; n],
        };
        let mut attrs: Vec<u16> = match cfg.token_types {
            Some(tt) if tt.len() >= n => tt[..n]
                .iter()
                .map(|&t| match t {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => 0,
                })
                .collect(),
            Some(tt) => {
                return Err(TokenizerError::Invalid(format!(
                    "{} token types for {n} tokens",
                    tt.len()
                )))
            }
            None => vec![attr::NORMAL; n],
        };

        // Special ids: defaults outside the vocabulary are dropped; given ids
        // outside it are ignored.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |default: Option<u32>, given: Option<u32>| in_range(given).or(in_range(default));
        let sp = &cfg.special;
        bos = pick(bos, sp.bos);
        eos = pick(eos, sp.eos);
        unk = pick(unk, sp.unk);
        let mut eot = in_range(sp.eot);
        let mut eom = in_range(sp.eom);
        let pad = in_range(sp.pad);
        let mut fim_pre = in_range(sp.fim_pre);
        let mut fim_suf = in_range(sp.fim_suf);
        let mut fim_mid = in_range(sp.fim_mid);
        let mut fim_pad = in_range(sp.fim_pad);
        let mut fim_rep = in_range(sp.fim_rep);
        let mut fim_sep = in_range(sp.fim_sep);
        if let Some(b) = cfg.add_bos {
            add_bos = b;
        }
        if let Some(e) = cfg.add_eos {
            add_eos = e;
        }
        if pretype.as_ref().is_some_and(|p| p.name == "gemma4") {
            add_bos = true;
        }

        // Auto-detect eot/eom/fim tokens by text; they become control tokens.
        for (i, text) in texts.iter().enumerate() {
            let id = i as u32;
            let t = text.as_str();
            let detect = |slot: &mut Option<u32>, names: &[&str], attrs: &mut Vec<u16>| {
                if slot.is_none() && names.contains(&t) {
                    *slot = Some(id);
                    attrs[i] |= attr::CONTROL;
                }
            };
            detect(&mut eot, EOT_TEXTS, &mut attrs);
            detect(&mut eom, &["<|eom_id|>"], &mut attrs);
            detect(&mut fim_pre, FIM_PRE_TEXTS, &mut attrs);
            detect(&mut fim_suf, FIM_SUF_TEXTS, &mut attrs);
            detect(&mut fim_mid, FIM_MID_TEXTS, &mut attrs);
            detect(&mut fim_pad, FIM_PAD_TEXTS, &mut attrs);
            detect(&mut fim_rep, FIM_REP_TEXTS, &mut attrs);
            detect(&mut fim_sep, FIM_SEP_TEXTS, &mut attrs);
        }
        let _ = (fim_pre, fim_suf, fim_mid);
        // Control tokens named "unused…" are unused.
        for (i, text) in texts.iter().enumerate() {
            if attrs[i] & attr::CONTROL != 0 && text.contains("unused") {
                attrs[i] |= attr::UNUSED;
            }
        }
        // End-of-generation set.
        let mut eog: FxHashSet<u32> = FxHashSet::default();
        eog.extend([fim_pad, fim_rep, fim_sep].into_iter().flatten());
        for (i, text) in texts.iter().enumerate() {
            if EOG_TEXTS.contains(&text.as_str()) {
                eog.insert(i as u32);
                attrs[i] |= attr::CONTROL;
            }
        }
        for (i, text) in texts.iter().enumerate() {
            if matches!(
                text.as_str(),
                "<|channel|>" | "<|message|>" | "<|start|>" | "<|constrain|>"
            ) {
                attrs[i] = attr::USER_DEFINED;
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        {
            let has = |eog: &FxHashSet<u32>, s: &str| eog.iter().any(|&id| texts[id as usize] == s);
            let (has_return, has_call, has_flush) = (
                has(&eog, "<|return|>"),
                has(&eog, "<|call|>") || has(&eog, "<|calls|>"),
                has(&eog, "<|flush|>"),
            );
            if let Some(end) = eog
                .iter()
                .copied()
                .find(|&id| texts[id as usize] == "<|end|>")
            {
                if has_call && (has_return || has_flush) {
                    eog.remove(&end);
                    attrs[end as usize] = attr::USER_DEFINED;
                }
            }
            let normal_s_marker = has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>");
            if let Some(s) = eog.iter().copied().find(|&id| texts[id as usize] == "</s>") {
                if normal_s_marker {
                    eog.remove(&s);
                    attrs[s as usize] = attr::NORMAL;
                }
            }
        }

        // Tokens cut out of text before tokenizing, longest first.
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        specials.sort_by(|&a, &b| texts[b as usize].len().cmp(&texts[a as usize].len()));

        // Per-model strip attributes llama.cpp sets by name.
        let name = cfg.model_name.as_deref().unwrap_or("").to_lowercase();
        let pre_name = cfg.pre.as_deref().unwrap_or("");
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"]
            .iter()
            .any(|s| pre_name.contains(s))
        {
            if let Some(&m) = token_to_id.get("<mask>") {
                attrs[m as usize] |= attr::LSTRIP;
            }
        } else if name.contains("phi-3") || name.contains("phi3") {
            for &id in &specials {
                attrs[id as usize] |= attr::RSTRIP;
            }
            if let Some(&id) = token_to_id.get("</s>") {
                attrs[id as usize] |= attr::RSTRIP;
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = token_to_id.get(t) {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        } else if name.contains("modern-bert") {
            if let Some(&id) = token_to_id.get("[MASK]") {
                attrs[id as usize] |= attr::LSTRIP;
            }
        }

        // The strings `parse_special` turns into tokens: what message text
        // must not contain unescaped.
        let literals = Literals::new(
            specials
                .iter()
                .filter(|&&i| attrs[i as usize] & (attr::CONTROL | attr::UNKNOWN) != 0)
                .map(|&i| texts[i as usize].clone())
                .collect(),
        )
        .map_err(|e| TokenizerError::Invalid(format!("special tokens: {e}")))?;
        let special_finder = if specials.is_empty() {
            None
        } else {
            let pats: Vec<&str> = specials
                .iter()
                .map(|&i| texts[i as usize].as_str())
                .collect();
            Some(
                AhoCorasick::new(&pats)
                    .map_err(|e| TokenizerError::Invalid(format!("special tokens: {e}")))?,
            )
        };

        let mut byte_token = [None; 256];
        for (b, slot) in byte_token.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = token_to_id.get(hex.as_str()).copied().or_else(|| {
                (b < 0x80)
                    .then(|| {
                        token_to_id
                            .get(char::from(b as u8).to_string().as_str())
                            .copied()
                    })
                    .flatten()
            });
        }

        let model = match pretype {
            None => Model::Spm,
            Some(p) => {
                let merges = cfg
                    .merges
                    .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.merges".into()))?;
                Model::Bpe(Box::new(Bpe::new(p, &merges, &token_to_id, n as u32)?))
            }
        };

        let mut tok = Tokenizer {
            kind,
            model,
            texts,
            scores,
            attrs,
            token_to_id,
            pieces: Vec::new(),
            piece_offsets: Vec::new(),
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            escape_whitespaces: escape_ws,
            specials,
            special_finder,
            literals,
            byte_token,
        };
        tok.build_pieces();
        Ok(tok)
    }

    fn build_pieces(&mut self) {
        let mut pieces = Vec::with_capacity(self.texts.len() * 6);
        let mut offsets = Vec::with_capacity(self.texts.len() + 1);
        for i in 0..self.texts.len() {
            offsets.push(pieces.len() as u32);
            self.render_piece(i, &mut pieces);
        }
        offsets.push(pieces.len() as u32);
        self.pieces = pieces;
        self.piece_offsets = offsets;
    }

    /// llama.cpp's `token_to_piece(id, special = true)`.
    fn render_piece(&self, i: usize, out: &mut Vec<u8>) {
        let a = self.attrs[i];
        let text = &self.texts[i];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            out.extend_from_slice(text.as_bytes());
        } else if a & attr::NORMAL != 0 {
            if self.kind == TokenizerKind::Spm || self.escape_whitespaces {
                out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes());
            } else {
                for c in text.chars() {
                    match char_to_byte(c) {
                        Some(b) => out.push(b),
                        None => {
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut buf = [0u8; 4];
                            for b in c.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
            }
        } else if a & attr::BYTE != 0 {
            if let Some(b) = text.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
            }
        }
    }

    /// Which algorithm this vocabulary uses.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence token.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn token (given in metadata or recognised by its text).
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// End-of-message token (`<|eom_id|>`).
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }

    /// Unknown-text token.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Padding token.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// Whether generation stops at `id` (EOS, EOT, `<|im_end|>`,
    /// `<end_of_turn>`, `<|endoftext|>`, FIM pad/repo/sep, … as llama.cpp).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// All end-of-generation tokens, ascending.
    pub fn eog_tokens(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.eog.iter().copied().collect();
        v.sort_unstable();
        v
    }

    /// The vocabulary string of `id`.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary string is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// SPM score of `id` (0 for BPE vocabularies).
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize).copied()
    }

    /// Whether `id` is a control token (not text; e.g. `<|im_start|>`).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }

    /// Whether `id` is a user-defined token (text cut out before tokenizing,
    /// e.g. `<tool_call>`).
    pub fn is_user_defined(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::USER_DEFINED != 0)
    }

    /// Whether `id` is a byte-fallback token (`<0xXX>`).
    pub fn is_byte(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::BYTE != 0)
    }

    fn is_special_for_decode(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & (attr::CONTROL | attr::UNKNOWN) != 0)
    }

    /// The bytes token `id` stands for: byte-level decoded (BPE), `▁` → space
    /// (SPM), `<0xXX>` → that byte. Control and unknown tokens stand for no
    /// text and give an empty slice (see [`Tokenizer::token_piece`]); unknown
    /// ids give an empty slice.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.token_piece(id, false)
    }

    /// llama.cpp's `token_to_piece`: like [`Tokenizer::token_bytes`], but with
    /// `special` control and unknown tokens render as their text.
    pub fn token_piece(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        if i >= self.texts.len() || (!special && self.is_special_for_decode(id)) {
            return &[];
        }
        &self.pieces[self.piece_offsets[i] as usize..self.piece_offsets[i + 1] as usize]
    }

    /// Cuts control / user-defined tokens out of `text` (llama.cpp's
    /// `tokenizer_st_partition`): longest token first, each occurrence left
    /// to right, honouring the lstrip/rstrip attributes.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let mut frags = vec![Frag::Text(0, text.len())];
        let Some(finder) = &self.special_finder else {
            return frags;
        };
        let mut present = vec![false; self.specials.len()];
        let mut any = false;
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
            any = true;
        }
        if !any {
            return frags;
        }
        let bytes = text.as_bytes();
        for (k, &id) in self.specials.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let pat = self.texts[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(s, e) = f else {
                    next.push(f);
                    continue;
                };
                let mut cur = s;
                let mut found = false;
                while let Some(rel) = text[cur..e].find(pat) {
                    found = true;
                    let m = cur + rel;
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > cur && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > cur {
                        next.push(Frag::Text(cur, left_end));
                    }
                    next.push(Frag::Token(id));
                    let mut r = m + pat.len();
                    if a & attr::RSTRIP != 0 {
                        while r < e && is_c_space(bytes[r]) {
                            r += 1;
                        }
                    }
                    cur = r;
                    if cur >= e {
                        break;
                    }
                }
                if !found {
                    next.push(f);
                } else if cur < e {
                    next.push(Frag::Text(cur, e));
                }
            }
            frags = next;
        }
        frags
    }

    /// Tokenizes `text`.
    ///
    /// `add_special` adds BOS / EOS where the vocabulary asks for them
    /// (`add_bos` / `add_eos`); `parse_special` turns the text of control
    /// tokens (e.g. `<|im_start|>`) into those tokens. User-defined tokens are
    /// always recognised, as in llama.cpp.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_with(text, add_special, parse_special, false)
    }

    /// Tokenizes a rendered chat prompt: the template's control-token markup
    /// becomes control tokens, while message text escaped by the chat template
    /// ([`Literals`]) is tokenized as the text it was, so a message cannot
    /// forge turn markup (role spoofing).
    pub fn encode_prompt(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.encode_with(text, add_special, true, true)
    }

    /// The control-token strings of this vocabulary, for escaping message text.
    pub fn literals(&self) -> &Literals {
        &self.literals
    }

    fn encode_with(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
        unescape: bool,
    ) -> Vec<u32> {
        let piece = |s: usize, e: usize| -> Cow<'_, str> {
            if unescape {
                self.literals.unescape(&text[s..e])
            } else {
                Cow::Borrowed(&text[s..e])
            }
        };
        let frags = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        match &self.model {
            Model::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in frags {
                    match f {
                        Frag::Text(s, e) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push('\u{2581}');
                            }
                            for c in piece(s, e).chars() {
                                buf.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            spm::tokenize(
                                &buf,
                                &self.token_to_id,
                                &self.scores,
                                &self.byte_token,
                                &mut out,
                            );
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                for f in frags {
                    match f {
                        Frag::Text(s, e) => {
                            let p = piece(s, e);
                            if self.escape_whitespaces {
                                let t = p.replace(' ', "\u{2581}");
                                bpe.tokenize(&t, &self.token_to_id, &mut out);
                            } else {
                                bpe.tokenize(&p, &self.token_to_id, &mut out);
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        out
    }

    /// Raw detokenized bytes (llama.cpp's `detokenize` with
    /// `remove_special = false`, `unparse_special = !skip_special`).
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut remove_space = self.add_space_prefix;
        for &id in ids {
            let piece = self.token_piece(id, !skip_special);
            let piece = if remove_space && piece.first() == Some(&b' ') {
                &piece[1..]
            } else {
                piece
            };
            remove_space = false;
            out.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut out);
        }
        out
    }

    /// Detokenizes `ids`; invalid UTF-8 (only possible at the very end or from
    /// nonsensical id sequences) becomes U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, skip_special)).into_owned()
    }

    pub(crate) fn strips_leading_space(&self) -> bool {
        self.add_space_prefix
    }

    pub(crate) fn cleans_spaces(&self) -> bool {
        self.clean_spaces
    }
}

/// llama.cpp's `clean_up_tokenization_spaces`: three in-place passes over the
/// bytes (` ?`/` !`/` .`/` ,` lose the space; ` ' ` loses both spaces; ` 's`,
/// ` 'm`, ` 're`, ` 've` lose the space).
pub(crate) fn clean_up_spaces(text: &mut Vec<u8>) {
    // Pass 1.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // Pass 2.
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // Pass 3.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if matches!(x1, b's' | b'm') {
                total -= 1;
            } else if !matches!(x1, b't' | b'd') && i + 2 < n {
                let x2 = text[i + 2];
                if matches!((x1, x2), (b'r', b'e') | (b'v', b'e')) {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_up() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(clean("it 's he 'll they 're"), "it's he 'll they're");
        assert_eq!(clean(" ."), ".");
        assert_eq!(clean(""), "");
        assert_eq!(clean("a ' ' b"), "a'' b");
    }
}
