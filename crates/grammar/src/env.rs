//! llguidance's view of a vocabulary: a token trie built from our [`Tokenizer`]
//! plus a tokenize function for llguidance's lexer.

use std::sync::Arc;

use tempo9_tokenizer::Tokenizer;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// A [`TokenizerEnv`] over a Tempo9 [`Tokenizer`].
///
/// Token bytes are what the token stands for in text. Tokens that stand for no
/// text (control tokens such as `<|im_end|>`, unknown tokens) get llguidance's
/// special-token marker byte `0xFF` followed by their vocabulary string: no text
/// grammar can produce them (`0xFF` never occurs in UTF-8), while Lark grammars
/// can still name them as `<|im_end|>`. The end-of-sequence set is the model's
/// whole end-of-generation set, so any of them ends an accepting grammar.
pub struct TokenizerEnvImpl {
    tok: Arc<Tokenizer>,
    trie: TokTrie,
    canonical: bool,
}

impl TokenizerEnvImpl {
    /// Builds the trie over the whole vocabulary (tens of milliseconds for a
    /// 150K vocabulary; callers cache the result, see
    /// [`crate::GrammarCompiler::for_tokenizer`]).
    pub fn new(tok: Arc<Tokenizer>) -> TokenizerEnvImpl {
        let n = tok.vocab_size();
        let mut words: Vec<Vec<u8>> = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let bytes = tok.token_bytes(id);
            if !bytes.is_empty() {
                words.push(bytes.to_vec());
                continue;
            }
            match tok.token_text(id) {
                Some(text) if !text.is_empty() => {
                    let mut w = Vec::with_capacity(text.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(text.as_bytes());
                    words.push(w);
                }
                _ => words.push(Vec::new()),
            }
        }
        let eog = tok.eog_tokens();
        // llguidance needs one designated EOS; prefer the declared one, then EOT.
        let eos = tok
            .eos()
            .or(tok.eot())
            .or_else(|| eog.first().copied())
            .unwrap_or(0);
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: eos,
            tok_bos: tok.bos(),
            tok_pad: tok.pad(),
            tok_unk: tok.unk(),
            tok_end_of_turn: tok.eot(),
        };
        let mut trie = TokTrie::from(&info, &words);
        let mut eos_set = vec![eos];
        eos_set.extend(eog.iter().copied().filter(|&t| t != eos));
        trie = trie.with_eos_tokens(&eos_set);
        // Forcing tokens needs tokenize() to give the model's own tokenization of
        // any text fragment. SPM vocabularies that prepend a space to every
        // encode() call do not; llguidance then falls back to trie tokenization.
        let probe = "a{\"b\": [1, 2]}";
        let ids = tok.encode(probe, false, false);
        let round: Vec<u8> = ids
            .iter()
            .flat_map(|&t| tok.token_bytes(t).iter().copied())
            .collect();
        let canonical = round == probe.as_bytes();
        TokenizerEnvImpl {
            tok,
            trie,
            canonical,
        }
    }

    /// Wraps the environment in llguidance's shared handle.
    pub fn into_tok_env(self) -> TokEnv {
        Arc::new(self)
    }

    /// The tokenizer this environment was built from.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tok
    }
}

impl TokenizerEnv for TokenizerEnvImpl {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if !self.canonical {
            return self.trie.greedy_tokenize(s);
        }
        // Text from the lexer is plain text: control-token strings in it stay text
        // (parse_special = false), as in a model's output.
        self.trie
            .tokenize_with_greedy_fallback(s, |text| self.tok.encode(text, false, false))
    }

    fn tokenize_is_canonical(&self) -> bool {
        self.canonical
    }
}
