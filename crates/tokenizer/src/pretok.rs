//! Pre-tokenizers: split text into words before BPE, the way llama.cpp does.
//!
//! llama.cpp runs a list of regexes per `tokenizer.ggml.pre`, each one
//! splitting the pieces the previous one produced. The common ones (GPT-2,
//! Llama-3, Qwen2, Qwen3.5, newline runs, isolated digits) are hand-written
//! state machines there, with a few quirks a regex engine would not share;
//! those are re-implemented here to the letter. Any other regex runs through
//! the `tokenizers` crate's `Split` pre-tokenizer (Oniguruma).

use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer as _, SplitDelimiterBehavior,
};

use crate::unicode::Flags;
use crate::TokenizerError;

/// The GPT-2 word regex.
pub(crate) const RE_GPT2: &str =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
/// The Llama-3 word regex (digits in runs of up to three).
pub(crate) const RE_LLAMA3: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// The Qwen2 word regex (single digits).
pub(crate) const RE_QWEN2: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// The Qwen3.5 word regex (letters absorb combining marks).
pub(crate) const RE_QWEN35: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/// Runs of newlines and runs of everything else.
pub(crate) const RE_NEWLINES: &str = "[^\\n]+|[\\n]+";
/// Every number code point on its own.
pub(crate) const RE_DIGIT: &str = "\\p{N}";

enum Stage {
    Gpt2,
    /// Llama-3 family: `max_digits` 3 (Llama-3) or 1 (Qwen2); `marks` for Qwen3.5.
    Llama3 {
        max_digits: usize,
        marks: bool,
    },
    Newlines,
    Digits,
    Regex(Box<Split>),
}

/// An ordered list of splitting stages.
pub(crate) struct PreTokenizer {
    stages: Vec<Stage>,
}

impl std::fmt::Debug for PreTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PreTokenizer({} stages)", self.stages.len())
    }
}

impl PreTokenizer {
    /// Builds the stages for a list of regexes (llama.cpp's `regex_exprs`).
    pub(crate) fn new(regexes: &[&str]) -> Result<Self, TokenizerError> {
        let mut stages = Vec::with_capacity(regexes.len());
        for &re in regexes {
            let stage = match re {
                RE_GPT2 => Stage::Gpt2,
                RE_LLAMA3 => Stage::Llama3 {
                    max_digits: 3,
                    marks: false,
                },
                RE_QWEN2 => Stage::Llama3 {
                    max_digits: 1,
                    marks: false,
                },
                RE_QWEN35 => Stage::Llama3 {
                    max_digits: 1,
                    marks: true,
                },
                RE_NEWLINES => Stage::Newlines,
                RE_DIGIT => Stage::Digits,
                other => {
                    let split = Split::new(
                        SplitPattern::Regex(other.to_string()),
                        SplitDelimiterBehavior::Isolated,
                        false,
                    )
                    .map_err(|e| TokenizerError::Regex {
                        regex: other.to_string(),
                        message: e.to_string(),
                    })?;
                    Stage::Regex(Box::new(split))
                }
            };
            stages.push(stage);
        }
        Ok(PreTokenizer { stages })
    }

    /// Splits `text` into words (substrings, in order, covering all of it).
    pub(crate) fn split<'a>(&self, text: &'a str) -> Vec<&'a str> {
        if text.is_empty() {
            return Vec::new();
        }
        let cps: Vec<char> = text.chars().collect();
        let flags: Vec<Flags> = cps.iter().map(|&c| Flags::of(c)).collect();
        let mut byte_off = Vec::with_capacity(cps.len() + 1);
        let mut o = 0;
        for &c in &cps {
            byte_off.push(o);
            o += c.len_utf8();
        }
        byte_off.push(o);

        // Segment lengths in code points.
        let mut segs = vec![cps.len()];
        for stage in &self.stages {
            let mut out = Vec::with_capacity(segs.len() * 2);
            let mut start = 0;
            for &len in &segs {
                let end = start + len;
                let cx = Ctx {
                    cps: &cps,
                    flags: &flags,
                    end,
                };
                match stage {
                    Stage::Gpt2 => split_gpt2(&cx, start, &mut out),
                    Stage::Llama3 { max_digits, marks } => {
                        split_llama3(&cx, start, *max_digits, *marks, &mut out)
                    }
                    Stage::Newlines => split_newlines(&cx, start, &mut out),
                    Stage::Digits => split_digits(&cx, start, &mut out),
                    Stage::Regex(split) => {
                        split_regex(split, &text[byte_off[start]..byte_off[end]], &mut out)
                    }
                }
                start = end;
            }
            segs = out;
        }

        let mut words = Vec::with_capacity(segs.len());
        let mut start = 0;
        for len in segs {
            words.push(&text[byte_off[start]..byte_off[start + len]]);
            start += len;
        }
        words
    }
}

/// One segment's view of the text: positions at or past `end` read as
/// "nothing" (llama.cpp's out-of-range code point with empty flags).
struct Ctx<'a> {
    cps: &'a [char],
    flags: &'a [Flags],
    end: usize,
}

impl Ctx<'_> {
    fn cp(&self, p: usize) -> Option<char> {
        (p < self.end).then(|| self.cps[p])
    }
    fn fl(&self, p: usize) -> Option<Flags> {
        (p < self.end).then(|| self.flags[p])
    }
    fn letter(&self, p: usize) -> bool {
        self.fl(p).is_some_and(|f| f.letter())
    }
    fn number(&self, p: usize) -> bool {
        self.fl(p).is_some_and(|f| f.number())
    }
    fn ws(&self, p: usize) -> bool {
        self.fl(p).is_some_and(|f| f.ws)
    }
    fn is_cr_lf(&self, p: usize) -> bool {
        matches!(self.cp(p), Some('\r' | '\n'))
    }
}

/// Collects piece lengths; `cut(e)` ends the current piece at `e`.
struct Cutter<'a> {
    prev: usize,
    out: &'a mut Vec<usize>,
}

impl Cutter<'_> {
    fn cut(&mut self, end: usize) {
        if end > self.prev {
            self.out.push(end - self.prev);
        }
        self.prev = end;
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` with `lower` applied to the letters.
fn contraction(cx: &Ctx, pos: usize, lower: bool) -> Option<usize> {
    if cx.cp(pos) != Some('\'') || pos + 1 >= cx.end {
        return None;
    }
    let norm = |c: char| if lower { c.to_ascii_lowercase() } else { c };
    let n1 = norm(cx.cps[pos + 1]);
    if matches!(n1, 's' | 't' | 'm' | 'd') {
        return Some(2);
    }
    if pos + 2 < cx.end {
        let n2 = norm(cx.cps[pos + 2]);
        if matches!((n1, n2), ('r', 'e') | ('v', 'e') | ('l', 'l')) {
            return Some(3);
        }
    }
    None
}

/// Whitespace tail shared by the splitters: `\s+(?!\S)` then `\s+`.
/// Returns the new position, or `None` if `pos` is not whitespace.
fn whitespace_run(cx: &Ctx, pos: usize) -> Option<usize> {
    let mut n = 0;
    while cx.ws(pos + n) {
        n += 1;
    }
    if n > 1 && cx.cp(pos + n).is_some() {
        Some(pos + n - 1)
    } else if n > 0 {
        Some(pos + n)
    } else {
        None
    }
}

fn split_gpt2(cx: &Ctx, start: usize, out: &mut Vec<usize>) {
    let mut c = Cutter { prev: start, out };
    let mut pos = start;
    while pos < cx.end {
        if let Some(n) = contraction(cx, pos, false) {
            pos += n;
            c.cut(pos);
            continue;
        }
        let ch = cx.cps[pos];
        let f2 = if ch == ' ' {
            cx.fl(pos + 1)
        } else {
            Some(cx.flags[pos])
        };
        let other = |f: Option<Flags>| f.is_some_and(|f| !(f.ws || f.letter() || f.number()));
        if f2.is_some_and(|f| f.letter()) {
            pos += usize::from(ch == ' ');
            while cx.letter(pos) {
                pos += 1;
            }
            c.cut(pos);
            continue;
        }
        if f2.is_some_and(|f| f.number()) {
            pos += usize::from(ch == ' ');
            while cx.number(pos) {
                pos += 1;
            }
            c.cut(pos);
            continue;
        }
        if other(f2) {
            pos += usize::from(ch == ' ');
            while other(cx.fl(pos)) {
                pos += 1;
            }
            c.cut(pos);
            continue;
        }
        pos = whitespace_run(cx, pos).unwrap_or(pos + 1);
        c.cut(pos);
    }
}

fn split_llama3(cx: &Ctx, start: usize, max_digits: usize, marks: bool, out: &mut Vec<usize>) {
    let mut c = Cutter { prev: start, out };
    let wordish = |f: Option<Flags>| f.is_some_and(|f| f.letter() || (marks && f.mark()));
    let mut pos = start;
    while pos < cx.end {
        if let Some(n) = contraction(cx, pos, true) {
            pos += n;
            c.cut(pos);
            continue;
        }
        let ch = cx.cps[pos];
        let f = cx.flags[pos];
        // [^\r\n\p{L}\p{N}]?\p{L}+  (with \p{M} for Qwen3.5)
        if !(ch == '\r' || ch == '\n' || f.number())
            && (wordish(Some(f)) || wordish(cx.fl(pos + 1)))
        {
            pos += 1;
            while wordish(cx.fl(pos)) {
                pos += 1;
            }
            c.cut(pos);
            continue;
        }
        // \p{N}{1,max_digits}
        if f.number() {
            let mut ini = pos;
            while cx.number(pos) {
                pos += 1;
                if pos - ini >= max_digits {
                    c.cut(pos);
                    ini = pos;
                }
            }
            c.cut(pos);
            continue;
        }
        // ' ?[^\s\p{L}\p{N}]+[\r\n]*'. The first test reads empty flags past
        // the end as a match (llama.cpp quirk), the loop does not.
        let other = |g: Flags| !(g.ws || g.letter() || g.number() || (marks && g.mark()));
        let f2 = if ch == ' ' { cx.fl(pos + 1) } else { Some(f) };
        if f2.is_none_or(other) {
            pos += usize::from(ch == ' ');
            while cx.fl(pos).is_some_and(other) {
                pos += 1;
            }
            while cx.is_cr_lf(pos) {
                pos += 1;
            }
            c.cut(pos);
            continue;
        }
        // \s*[\r\n]+
        let mut n = 0;
        let mut last_rn = None;
        while cx.ws(pos + n) {
            if cx.is_cr_lf(pos + n) {
                last_rn = Some(pos + n + 1);
            }
            n += 1;
        }
        if let Some(e) = last_rn {
            pos = e;
            c.cut(pos);
            continue;
        }
        pos = whitespace_run(cx, pos).unwrap_or(pos + 1);
        c.cut(pos);
    }
}

fn split_newlines(cx: &Ctx, start: usize, out: &mut Vec<usize>) {
    let mut pos = start;
    while pos < cx.end {
        let nl = cx.cps[pos] == '\n';
        let run = pos;
        while pos < cx.end && (cx.cps[pos] == '\n') == nl {
            pos += 1;
        }
        out.push(pos - run);
    }
}

fn split_digits(cx: &Ctx, start: usize, out: &mut Vec<usize>) {
    let mut c = Cutter { prev: start, out };
    for pos in start..cx.end {
        if cx.flags[pos].number() {
            c.cut(pos);
            c.cut(pos + 1);
        }
    }
    c.cut(cx.end);
}

fn split_regex(split: &Split, seg: &str, out: &mut Vec<usize>) {
    let total = seg.chars().count();
    let mut pts = PreTokenizedString::from(seg);
    if split.pre_tokenize(&mut pts).is_err() {
        out.push(total);
        return;
    }
    let mut covered = 0;
    for (_, (s, e), _) in pts.get_splits(OffsetReferential::Original, OffsetType::Char) {
        if s > covered {
            out.push(s - covered);
        }
        if e > s {
            out.push(e - s);
        }
        covered = e;
    }
    if total > covered {
        out.push(total - covered);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(res: &[&str], text: &str) -> Vec<String> {
        let p = PreTokenizer::new(res).unwrap();
        let words = p.split(text);
        assert_eq!(words.concat(), text);
        words.into_iter().map(String::from).collect()
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            split(&[RE_GPT2], "Hello world's  fine!!  42x\n\n"),
            ["Hello", " world", "'s", " ", " fine", "!!", " ", " 42", "x", "\n\n"]
        );
        assert_eq!(split(&[RE_GPT2], "a  b"), ["a", " ", " b"]);
        assert_eq!(split(&[RE_GPT2], "I'M"), ["I", "'", "M"]);
    }

    #[test]
    fn smollm_digits_then_gpt2() {
        assert_eq!(
            split(&[RE_DIGIT, RE_GPT2], "abc 1234 x"),
            ["abc", " ", "1", "2", "3", "4", " x"]
        );
    }

    #[test]
    fn qwen2_words() {
        assert_eq!(
            split(&[RE_QWEN2], "Hello, World 123 I'M\r\n  foo  \n"),
            ["Hello", ",", " World", " ", "1", "2", "3", " I", "'M", "\r\n", " ", " foo", "  \n"]
        );
        assert_eq!(
            split(&[RE_QWEN2], "x = {a};\n"),
            ["x", " =", " {", "a", "};\n"]
        );
        assert_eq!(split(&[RE_QWEN2], "中文 字"), ["中文", " 字"]);
    }

    #[test]
    fn llama3_digit_groups() {
        assert_eq!(split(&[RE_LLAMA3], "1234567"), ["123", "456", "7"]);
    }

    #[test]
    fn newline_runs() {
        assert_eq!(
            split(&[RE_NEWLINES], "a b\n\nc\n"),
            ["a b", "\n\n", "c", "\n"]
        );
    }

    #[test]
    fn generic_regex_via_tokenizers() {
        assert_eq!(split(&["[0-9]+"], "ab12cd3"), ["ab", "12", "cd", "3"]);
        assert!(PreTokenizer::new(&["(unclosed"]).is_err());
    }
}
