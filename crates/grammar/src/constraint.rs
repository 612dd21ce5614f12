//! Binding grammars to a vocabulary ([`GrammarCompiler`]) and following one
//! through a generation ([`Constraint`]).

use std::sync::{Arc, Mutex};

use llguidance::api::StopReason;
use llguidance::{Matcher, ParserFactory};
use tempo9_tokenizer::Tokenizer;
use toktrie::TokEnv;

use tempo9_engine::{TokenConstraint, TokenMask};

use crate::bounds::{DigitGuard, DigitTable, FinishTable, JsonScan};
use crate::env::TokenizerEnvImpl;
use crate::{Grammar, GrammarError};

/// Compiles [`Grammar`]s for one vocabulary. Building one walks the whole
/// vocabulary (token trie plus llguidance's per-slice token sets), so make one
/// per loaded model and share it: it is cheap to clone and thread-safe.
#[derive(Clone)]
pub struct GrammarCompiler {
    inner: Arc<Inner>,
}

struct Inner {
    tok: Arc<Tokenizer>,
    env: TokEnv,
    factory: ParserFactory,
    digits: Arc<DigitTable>,
    finish: Arc<FinishTable>,
}

static CACHE: Mutex<Vec<GrammarCompiler>> = Mutex::new(Vec::new());

impl GrammarCompiler {
    /// A compiler for `tok`'s vocabulary (not cached; see [`Self::for_tokenizer`]).
    pub fn new(tok: Arc<Tokenizer>) -> Result<GrammarCompiler, GrammarError> {
        let env = TokenizerEnvImpl::new(tok.clone()).into_tok_env();
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Compile(e.to_string()))?;
        // Errors come back as values; nothing should go to stderr in a server.
        factory.quiet();
        let trie = env.tok_trie();
        let digits = Arc::new(DigitTable::new(trie.vocab_size(), |t| trie.token(t)));
        let finish = Arc::new(FinishTable::new(trie.vocab_size(), tok.eog_tokens(), |t| {
            trie.token(t)
        }));
        Ok(GrammarCompiler {
            inner: Arc::new(Inner {
                tok,
                env,
                factory,
                digits,
                finish,
            }),
        })
    }

    /// The compiler for `tok`, built on first use and cached (keyed by the `Arc`'s
    /// identity) while the tokenizer is in use elsewhere.
    pub fn for_tokenizer(tok: &Arc<Tokenizer>) -> Result<GrammarCompiler, GrammarError> {
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        // The cached compiler itself holds the tokenizer twice (directly and through
        // its token environment); drop entries nothing else refers to.
        cache.retain(|c| Arc::strong_count(&c.inner) > 1 || Arc::strong_count(&c.inner.tok) > 2);
        if let Some(c) = cache.iter().find(|c| Arc::ptr_eq(&c.inner.tok, tok)) {
            return Ok(c.clone());
        }
        let c = GrammarCompiler::new(tok.clone())?;
        cache.push(c.clone());
        Ok(c)
    }

    /// The tokenizer this compiler was built for.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.inner.tok
    }

    /// llguidance's token environment for this vocabulary.
    pub fn tok_env(&self) -> &TokEnv {
        &self.inner.env
    }

    /// Binds `grammar` to this vocabulary: a fresh [`Constraint`] positioned at
    /// the start of the output. Errors name the problem (e.g. an unknown special
    /// token in a Lark grammar, or a schema llguidance cannot express).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let parser = self
            .inner
            .factory
            .create_parser(grammar.top_level().clone())
            .map_err(|e| GrammarError::Compile(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Compile(e));
        }
        Ok(Constraint {
            matcher,
            n_vocab: self.inner.tok.vocab_size(),
            tok: self.inner.tok.clone(),
            digits: grammar
                .bounds()
                .max_digit_run
                .map(|max| DigitGuard::new(self.inner.digits.clone(), max)),
            finish: grammar.bounds().finish_reserve.map(|reserve| Finish {
                table: self.inner.finish.clone(),
                reserve,
                budget: None,
                scan: JsonScan::default(),
                history: Vec::new(),
            }),
        })
    }
}

/// One request's grammar state: which tokens may come next, advanced token by
/// token. Implements the engine's `TokenConstraint` contract (see the crate
/// docs).
pub struct Constraint {
    matcher: Matcher,
    n_vocab: usize,
    /// Tokenizes [`Constraint::advance_text`]'s prompt text.
    tok: Arc<Tokenizer>,
    /// The grammar's digit-run bound, if any ([`crate::OutputBounds`]).
    digits: Option<DigitGuard>,
    /// Steering to the end in the last tokens before the limit, if any.
    finish: Option<Finish>,
}

/// A constraint's steering to the end of its answer (see [`crate::OutputBounds`]).
struct Finish {
    table: Arc<FinishTable>,
    reserve: usize,
    /// The token budget at the first mask: the reserve is at most a quarter of it.
    budget: Option<usize>,
    scan: JsonScan,
    /// The scan before each accepted token, for rollback.
    history: Vec<JsonScan>,
}

impl Constraint {
    /// The tokens allowed next, as 32-bit words (bit `t % 32` of word `t / 32`
    /// allows token `t`, the layout of the engine's `TokenMask::from_words`),
    /// covering the tokenizer's vocabulary; ids past it are never allowed.
    ///
    /// When the grammar can end here the model's end-of-generation tokens are
    /// allowed. An empty mask, or an error inside the matcher, is a dead end
    /// and returns `Err` with the reason.
    pub fn compute_mask_words(&mut self) -> Result<Vec<u32>, String> {
        if let Some(e) = self.matcher.get_error() {
            return Err(e);
        }
        // A complete grammar allows only end-of-generation tokens (callers normally
        // stop first, on is_finished).
        let vob = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| e.to_string())?;
        if vob.is_zero() {
            return Err(self.dead_end_reason("the grammar allows no token here"));
        }
        let mut words = vob.as_slice().to_vec();
        words.resize(self.n_vocab.div_ceil(32), 0);
        if let Some(d) = &self.digits {
            d.restrict(&mut words);
        }
        Ok(words)
    }

    /// [`Self::compute_mask_words`] with at most `tokens_left` tokens still to come:
    /// within the grammar's finish reserve the mask is steered to the answer's end
    /// ([`crate::OutputBounds::finish_reserve`]).
    pub fn compute_mask_words_within(&mut self, tokens_left: usize) -> Result<Vec<u32>, String> {
        let mut words = self.compute_mask_words()?;
        if let Some(f) = &mut self.finish {
            let budget = *f.budget.get_or_insert(tokens_left);
            if tokens_left <= f.reserve.min(budget / 4) {
                f.table.steer(&mut words, f.scan.in_string());
            }
        }
        Ok(words)
    }

    /// Advances past `token` (one the last mask allowed). An end-of-generation
    /// token ends an accepting grammar.
    pub fn accept_token(&mut self, token: u32) -> Result<(), String> {
        self.matcher
            .consume_token(token)
            .map_err(|e| format!("token {token} rejected by the grammar: {e}"))?;
        if let Some(d) = &mut self.digits {
            d.accept(token);
        }
        if let Some(f) = &mut self.finish {
            if let Ok(env) = self.matcher.tok_env() {
                f.history.push(f.scan);
                f.scan.feed(env.tok_trie().token(token));
            }
        }
        Ok(())
    }

    /// Undoes the last `n` accepted tokens, e.g. draft tokens the target model
    /// rejected in speculative decoding.
    pub fn rollback(&mut self, n: usize) -> Result<(), String> {
        self.matcher.rollback(n).map_err(|e| e.to_string())?;
        if let Some(d) = &mut self.digits {
            d.rollback(n);
        }
        if let Some(f) = &mut self.finish {
            let keep = f.history.len().saturating_sub(n);
            if let Some(&scan) = f.history.get(keep) {
                f.scan = scan;
            }
            f.history.truncate(keep);
        }
        Ok(())
    }

    /// Advances past `text` that is part of the output but was not sampled under
    /// this constraint, e.g. the start of a tool call the server appended to the
    /// prompt (`ToolFormat::forced_prefix`). Errors if the grammar does not allow
    /// it here. The text is tokenized as the prompt it was appended to: markup
    /// that is a control token of the vocabulary (Gemma 4's `<|tool_call>`,
    /// harmony's `<|channel|>`, Mistral's `[TOOL_CALLS]`) becomes that token.
    pub fn advance_text(&mut self, text: &str) -> Result<(), String> {
        let tokens = self.tok.encode(text, false, true);
        let n = self
            .matcher
            .try_consume_tokens(&tokens)
            .map_err(|e| e.to_string())?;
        if n != tokens.len() {
            return Err(format!("the grammar does not allow {text:?} here"));
        }
        if let Some(d) = &mut self.digits {
            d.accept_text(text);
        }
        if let Some(f) = &mut self.finish {
            f.history.clear();
            f.scan.feed(text.as_bytes());
        }
        Ok(())
    }

    /// Whether the output so far is complete and the grammar allows nothing more
    /// (the engine then stops the request with `ConstraintDone`).
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped() && !self.matcher.is_error()
    }

    /// Whether the output so far is a complete match (the grammar could end here,
    /// though it may also allow more).
    pub fn is_accepting(&mut self) -> bool {
        (self.matcher.is_stopped() && !self.matcher.is_error())
            || self.matcher.is_accepting().unwrap_or(false)
    }

    /// Tokens the grammar forces next whatever the model says (e.g. the rest of a
    /// property name); empty when there is a choice. Not consumed.
    pub fn forced_tokens(&mut self) -> Vec<u32> {
        self.matcher.compute_ff_tokens()
    }

    /// How many of `tokens` (from here, in order) the grammar accepts, without
    /// advancing.
    pub fn validate_tokens(&mut self, tokens: &[u32]) -> Result<usize, String> {
        self.matcher
            .validate_tokens(tokens)
            .map_err(|e| e.to_string())
    }

    /// The matcher's error, if it failed.
    pub fn error(&self) -> Option<String> {
        self.matcher.get_error()
    }

    fn dead_end_reason(&self, what: &str) -> String {
        match self.matcher.stop_reason() {
            StopReason::NotStopped | StopReason::NoExtension | StopReason::EndOfSentence => {
                what.to_string()
            }
            r => match self.matcher.get_error() {
                Some(e) => format!("{what}: {e}"),
                None => format!("{what} ({r:?})"),
            },
        }
    }
}

impl TokenConstraint for Constraint {
    fn compute_mask(&mut self) -> Result<TokenMask, String> {
        self.compute_mask_words().map(TokenMask::from_words)
    }

    fn compute_mask_within(&mut self, tokens_left: usize) -> Result<TokenMask, String> {
        self.compute_mask_words_within(tokens_left)
            .map(TokenMask::from_words)
    }

    fn accept(&mut self, token: u32) -> Result<(), String> {
        self.accept_token(token)
    }

    fn is_finished(&self) -> bool {
        Constraint::is_finished(self)
    }

    fn forced_tokens(&mut self) -> Vec<u32> {
        if self.matcher.is_stopped() {
            return Vec::new();
        }
        self.matcher.compute_ff_tokens()
    }

    fn accepted_prefix(&mut self, tokens: &[u32]) -> usize {
        // An id past the vocabulary (a draft model's padding rows) would stop the
        // matcher for good: cut before it.
        let n_vocab = match self.matcher.tok_env() {
            Ok(env) => env.tok_trie().vocab_size().min(self.n_vocab),
            Err(_) => return 0,
        };
        let known = tokens
            .iter()
            .position(|&t| t as usize >= n_vocab)
            .unwrap_or(tokens.len());
        self.validate_tokens(&tokens[..known]).unwrap_or(0)
    }
}
