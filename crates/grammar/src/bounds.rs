//! Bounds that keep a JSON answer finite where its schema sets none.
//!
//! A grammar that allows unbounded digits, whitespace or string length lets a small
//! model loop inside one value (`12.0254125130802668666866…`, a date-time with
//! endless fraction digits) until `max_tokens` cuts the answer into invalid JSON.
//! Structured output therefore has, by default:
//! - no free whitespace (compact JSON with `", "` and `": "` separators, as
//!   OpenAI's strict mode; see [`crate::Grammar::json_schema`]);
//! - at most [`DEFAULT_MAX_DIGIT_RUN`] digits in a row (integer, fraction and
//!   exponent digits each, and digit runs inside strings), unless the grammar
//!   itself requires more at that point;
//! - strings of at most [`DEFAULT_MAX_STRING_LENGTH`] characters where the schema
//!   sets no `maxLength` (nor `enum` / `const`);
//! - in the last [`DEFAULT_FINISH_RESERVE`] tokens before `max_tokens` (a quarter
//!   of `max_tokens` at most), the answer is steered to its end: where the grammar
//!   may end, only end-of-generation tokens are allowed; else inside a string, only
//!   tokens that close it (`"`, optionally followed by `]` and `}`) where allowed;
//!   else only tokens made of `]` and `}` where allowed; else the model chooses as
//!   before. An answer that still cannot close in time ends with
//!   `finish_reason: length`.
//!
//! A schema overrides them with a top-level `"x-tempo9": {"max_digit_run": N,
//! "max_string_length": N, "finish_reserve": N}` (`null` turns one off). Tool-call
//! grammars have none of these bounds (tool arguments carry code and file
//! contents) and keep a flexible whitespace layout ([`crate::TOOL_JSON_WHITESPACE`]).

use std::sync::Arc;

use serde_json::Value;

use crate::GrammarError;

/// Default longest run of digits in constrained JSON output.
pub const DEFAULT_MAX_DIGIT_RUN: usize = 24;
/// Default `maxLength` of JSON strings whose schema sets none.
pub const DEFAULT_MAX_STRING_LENGTH: usize = 2048;
/// Default number of last tokens before `max_tokens` in which a JSON answer is
/// steered to its end.
pub const DEFAULT_FINISH_RESERVE: usize = 48;
/// The schema keyword that overrides the bounds (removed before compiling).
pub const BOUNDS_KEYWORD: &str = "x-tempo9";

/// Bounds applied to one constrained output (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutputBounds {
    /// Longest run of consecutive ASCII digits the model may choose; `None` = no bound.
    pub max_digit_run: Option<usize>,
    /// `maxLength` given to JSON strings whose schema sets none; `None` = no bound.
    pub max_string_length: Option<usize>,
    /// Tokens before `max_tokens` from which the answer is steered to its end;
    /// `None` = never.
    pub finish_reserve: Option<usize>,
}

impl OutputBounds {
    /// No bounds (regex, Lark and tool-call grammars).
    pub const NONE: OutputBounds = OutputBounds {
        max_digit_run: None,
        max_string_length: None,
        finish_reserve: None,
    };

    /// The defaults for JSON answers.
    pub const JSON: OutputBounds = OutputBounds {
        max_digit_run: Some(DEFAULT_MAX_DIGIT_RUN),
        max_string_length: Some(DEFAULT_MAX_STRING_LENGTH),
        finish_reserve: Some(DEFAULT_FINISH_RESERVE),
    };

    /// [`Self::JSON`] with the overrides of the schema's top-level `x-tempo9`
    /// object, which is removed from `schema`.
    pub fn take_from_schema(schema: &mut Value) -> Result<OutputBounds, GrammarError> {
        let mut b = OutputBounds::JSON;
        let Some(obj) = schema.as_object_mut() else {
            return Ok(b);
        };
        let Some(opts) = obj.remove(BOUNDS_KEYWORD) else {
            return Ok(b);
        };
        let bad = |m: String| GrammarError::InvalidSchema(format!("{BOUNDS_KEYWORD}: {m}"));
        let Value::Object(opts) = opts else {
            return Err(bad("must be an object".into()));
        };
        for (k, v) in opts {
            let n = match &v {
                Value::Null => None,
                v => Some(
                    v.as_u64()
                        .filter(|&n| n > 0)
                        .ok_or_else(|| bad(format!("{k} must be a positive integer or null")))?
                        as usize,
                ),
            };
            match k.as_str() {
                "max_digit_run" => b.max_digit_run = n,
                "max_string_length" => b.max_string_length = n,
                "finish_reserve" => b.finish_reserve = n,
                _ => return Err(bad(format!("unknown option '{k}'"))),
            }
        }
        Ok(b)
    }
}

/// Gives every string schema in `schema` without `maxLength`, `enum` or `const` a
/// `maxLength` of `max` (or its `minLength`, if larger).
pub(crate) fn bound_strings(schema: &mut Value, max: usize) {
    let Value::Object(obj) = schema else { return };
    let is_string = match obj.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
        _ => false,
    };
    if is_string
        && !["maxLength", "enum", "const"]
            .iter()
            .any(|k| obj.contains_key(*k))
    {
        let min = obj.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
        obj.insert("maxLength".into(), Value::from(max.max(min)));
    }
    // Subschemas, by keyword shape.
    for key in [
        "items",
        "additionalProperties",
        "contains",
        "if",
        "then",
        "else",
    ] {
        if let Some(s) = obj.get_mut(key) {
            bound_strings(s, max);
        }
    }
    for key in ["prefixItems", "anyOf", "oneOf", "allOf"] {
        if let Some(Value::Array(list)) = obj.get_mut(key) {
            list.iter_mut().for_each(|s| bound_strings(s, max));
        }
    }
    for key in ["properties", "patternProperties", "$defs", "definitions"] {
        if let Some(Value::Object(map)) = obj.get_mut(key) {
            map.values_mut().for_each(|s| bound_strings(s, max));
        }
    }
}

/// Per-token digit facts of a vocabulary, computed once per [`crate::GrammarCompiler`].
pub(crate) struct DigitTable {
    /// Leading ASCII digits of each token's text (capped at 255).
    lead: Vec<u8>,
    /// Trailing ASCII digits of each token's text (capped at 255).
    trail: Vec<u8>,
    /// Whether the token's text is all digits (and not empty).
    all: Vec<bool>,
    /// Tokens whose text starts with a digit: the only ones a bound can forbid.
    leading: Vec<u32>,
}

impl DigitTable {
    /// From each token's text bytes (`bytes(id)`).
    pub(crate) fn new<'a>(n_vocab: usize, bytes: impl Fn(u32) -> &'a [u8]) -> DigitTable {
        let mut t = DigitTable {
            lead: vec![0; n_vocab],
            trail: vec![0; n_vocab],
            all: vec![false; n_vocab],
            leading: Vec::new(),
        };
        for id in 0..n_vocab as u32 {
            let b = bytes(id);
            let lead = b.iter().take_while(|c| c.is_ascii_digit()).count();
            let trail = b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
            let i = id as usize;
            t.lead[i] = lead.min(255) as u8;
            t.trail[i] = trail.min(255) as u8;
            t.all[i] = lead > 0 && lead == b.len();
            if lead > 0 {
                t.leading.push(id);
            }
        }
        t
    }

    /// The digit run after appending token `id` to output ending in `run` digits.
    fn run_after(&self, run: usize, id: u32) -> usize {
        let i = id as usize;
        match self.all.get(i) {
            Some(true) => run + usize::from(self.lead[i]),
            Some(false) => usize::from(self.trail[i]),
            None => 0,
        }
    }
}

/// Whether mask `words` allows token `t`.
fn allowed(words: &[u32], t: u32) -> bool {
    words
        .get(t as usize / 32)
        .is_some_and(|x| x >> (t % 32) & 1 == 1)
}

/// Tokens that steer an answer to its end (see the module docs), per vocabulary.
pub(crate) struct FinishTable {
    /// End-of-generation tokens.
    eog: Vec<u32>,
    /// Tokens that close a string: `"` then only `]` and `}`.
    quote_closers: Vec<u32>,
    /// Tokens made only of `]` and `}`.
    closers: Vec<u32>,
}

impl FinishTable {
    pub(crate) fn new<'a>(
        n_vocab: usize,
        eog: Vec<u32>,
        bytes: impl Fn(u32) -> &'a [u8],
    ) -> FinishTable {
        let closing = |b: &[u8]| b.iter().all(|c| matches!(c, b']' | b'}'));
        let (mut quote_closers, mut closers) = (Vec::new(), Vec::new());
        for t in 0..n_vocab as u32 {
            match bytes(t) {
                [] => {}
                [b'"', rest @ ..] if closing(rest) => quote_closers.push(t),
                b if closing(b) => closers.push(t),
                _ => {}
            }
        }
        FinishTable {
            eog,
            quote_closers,
            closers,
        }
    }

    /// Keeps in `words` only the end-of-generation tokens if any is allowed, else
    /// (by `in_string`) only the string-closing or the structure-closing tokens if
    /// any is allowed; else leaves it.
    pub(crate) fn steer(&self, words: &mut [u32], in_string: bool) {
        let closing = if in_string {
            &self.quote_closers
        } else {
            &self.closers
        };
        for set in [&self.eog, closing] {
            let keep: Vec<u32> = set.iter().copied().filter(|&t| allowed(words, t)).collect();
            if !keep.is_empty() {
                words.iter_mut().for_each(|w| *w = 0);
                for t in keep {
                    words[t as usize / 32] |= 1 << (t % 32);
                }
                return;
            }
        }
    }
}

/// Whether the JSON text so far ends inside a string (a tiny scanner over the
/// accepted bytes: quotes and backslash escapes).
#[derive(Clone, Copy, Default)]
pub(crate) struct JsonScan {
    in_string: bool,
    escaped: bool,
}

impl JsonScan {
    pub(crate) fn feed(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if !self.in_string {
                self.in_string = b == b'"';
            } else if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_string = false;
            }
        }
    }

    pub(crate) fn in_string(&self) -> bool {
        self.in_string
    }
}

/// Follows the output's trailing digit run and removes tokens that would make it
/// longer than the bound, unless nothing else is allowed (the grammar needs the
/// digits, e.g. a pattern of 40 digits).
pub(crate) struct DigitGuard {
    table: Arc<DigitTable>,
    max: usize,
    /// The trailing digit run before each accepted token, for rollback; the
    /// current run is `run`.
    history: Vec<usize>,
    run: usize,
}

impl DigitGuard {
    pub(crate) fn new(table: Arc<DigitTable>, max: usize) -> DigitGuard {
        DigitGuard {
            table,
            max,
            history: Vec::new(),
            run: 0,
        }
    }

    /// Clears from the mask `words` the tokens that would overflow the bound.
    pub(crate) fn restrict(&self, words: &mut [u32]) {
        let over: Vec<u32> = self
            .table
            .leading
            .iter()
            .copied()
            .filter(|&t| {
                self.run + usize::from(self.table.lead[t as usize]) > self.max && allowed(words, t)
            })
            .collect();
        if over.is_empty() {
            return;
        }
        for &t in &over {
            words[t as usize / 32] &= !(1 << (t % 32));
        }
        if words.iter().all(|&w| w == 0) {
            // Only digits are allowed here: the grammar's own requirement wins.
            for &t in &over {
                words[t as usize / 32] |= 1 << (t % 32);
            }
        }
    }

    /// Follows an accepted token.
    pub(crate) fn accept(&mut self, token: u32) {
        self.history.push(self.run);
        self.run = self.table.run_after(self.run, token);
    }

    /// Follows text appended without sampling.
    pub(crate) fn accept_text(&mut self, text: &str) {
        let b = text.as_bytes();
        let trail = b.iter().rev().take_while(|c| c.is_ascii_digit()).count();
        self.run = if trail == b.len() {
            self.run + trail
        } else {
            trail
        };
        self.history.clear();
    }

    /// Undoes the last `n` accepted tokens.
    pub(crate) fn rollback(&mut self, n: usize) {
        for _ in 0..n {
            match self.history.pop() {
                Some(r) => self.run = r,
                None => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn strings_without_a_bound_get_one() {
        let mut s = json!({
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "b": {"type": "string", "maxLength": 5},
                "c": {"type": ["string", "null"], "minLength": 5000},
                "d": {"type": "array", "items": {"type": "string", "format": "date-time"}},
                "e": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                "f": {"type": "string", "enum": ["x", "y"]}
            },
            "$defs": {"g": {"type": "string", "pattern": "^a+$"}}
        });
        bound_strings(&mut s, 100);
        let p = &s["properties"];
        assert_eq!(p["a"]["maxLength"], 100);
        assert_eq!(p["b"]["maxLength"], 5);
        assert_eq!(p["c"]["maxLength"], 5000);
        assert_eq!(p["d"]["items"]["maxLength"], 100);
        assert_eq!(p["e"]["anyOf"][0]["maxLength"], 100);
        assert!(p["f"].get("maxLength").is_none());
        assert_eq!(s["$defs"]["g"]["maxLength"], 100);
    }

    #[test]
    fn overrides_come_from_the_schema() {
        let mut s =
            json!({"type": "string", "x-tempo9": {"max_digit_run": 3, "max_string_length": null}});
        let b = OutputBounds::take_from_schema(&mut s).unwrap();
        assert_eq!(b.max_digit_run, Some(3));
        assert_eq!(b.max_string_length, None);
        assert!(s.get(BOUNDS_KEYWORD).is_none());
        for bad in [
            json!({"x-tempo9": 3}),
            json!({"x-tempo9": {"max_digit_run": 0}}),
            json!({"x-tempo9": {"nope": 1}}),
        ] {
            let mut s = bad;
            assert!(OutputBounds::take_from_schema(&mut s).is_err());
        }
    }

    #[test]
    fn near_the_limit_answers_close() {
        // Vocabulary: 0 "a", 1 "\"", 2 "\"}", 3 ",", 4 eos, 5 "}]", 6 "{".
        let words: [&[u8]; 7] = [b"a", b"\"", b"\"}", b",", b"", b"}]", b"{"];
        let f = FinishTable::new(7, vec![4], |i| words[i as usize]);
        let mut m = vec![0b1101111u32];
        f.steer(&mut m, true);
        assert_eq!(m[0], 0b0000110, "in a string: the tokens that close it");
        let mut m = vec![0b1101111u32];
        f.steer(&mut m, false);
        assert_eq!(
            m[0], 0b0100000,
            "outside: structure closers, not a new string"
        );
        let mut m = vec![0b0011001u32];
        f.steer(&mut m, false);
        assert_eq!(m[0], 0b0010000, "end where the grammar may end");
        let mut m = vec![0b1001001u32];
        f.steer(&mut m, false);
        assert_eq!(m[0], 0b1001001, "nothing to close with: unchanged");
        let mut s = JsonScan::default();
        s.feed(br#"{"a": "x\"y"#);
        assert!(s.in_string());
        s.feed(br#"", "b"#);
        assert!(s.in_string());
        s.feed(br#"": 1"#);
        assert!(!s.in_string());
    }

    #[test]
    fn digit_runs_are_bounded_unless_required() {
        // Vocabulary: 0 "1", 1 "23", 2 "4a", 3 ",", 4 "a5".
        let words: [&[u8]; 5] = [b"1", b"23", b"4a", b",", b"a5"];
        let table = Arc::new(DigitTable::new(5, |i| words[i as usize]));
        let mut g = DigitGuard::new(table, 3);
        let all = || vec![0b11111u32];
        let mut m = all();
        g.restrict(&mut m);
        assert_eq!(m[0], 0b11111);
        g.accept(1); // "23": run 2
        let mut m = all();
        g.restrict(&mut m);
        assert_eq!(m[0], 0b11101, "one more digit: not \"23\"");
        g.accept(0); // run 3
        let mut m = all();
        g.restrict(&mut m);
        assert_eq!(m[0], 0b11000);
        let mut only_digits = vec![0b00011u32];
        g.restrict(&mut only_digits);
        assert_eq!(only_digits[0], 0b00011, "the grammar's requirement wins");
        g.accept(4); // "a5": run 1
        assert_eq!(g.run, 1);
        g.rollback(2);
        assert_eq!(g.run, 2);
        g.accept_text("x12");
        assert_eq!(g.run, 2);
    }
}
