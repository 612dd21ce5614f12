//! Byte-pair encoding over pre-tokenized words, merge by merge in rank order
//! (lowest rank first, leftmost first on ties), as llama.cpp's BPE session.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

use crate::pretok::PreTokenizer;
use crate::pretype::PreType;
use crate::unicode::byte_to_char_table;
use crate::TokenizerError;

/// The BPE model: merge table plus pre-tokenizer settings.
pub(crate) struct Bpe {
    pub pre: PreTokenizer,
    pub settings: PreType,
    /// Strings that appear in merges but are not vocabulary tokens get ids
    /// from `n_vocab` upwards.
    extra_pieces: FxHashMap<String, u32>,
    /// (left piece, right piece) → (rank, merged piece).
    merges: FxHashMap<(u32, u32), (u32, u32)>,
    /// GPT-2 byte → character.
    byte_chars: [char; 256],
    /// Piece id of each byte's GPT-2 character.
    byte_char_piece: [Option<u32>; 256],
    n_vocab: u32,
}

impl std::fmt::Debug for Bpe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bpe")
            .field("pre", &self.settings.name)
            .field("merges", &self.merges.len())
            .finish()
    }
}

/// A merge candidate: (rank, left symbol, right symbol, merged byte length,
/// merged piece); the heap pops the lowest rank, then the leftmost.
type Candidate = (u32, u32, u32, u32, u32);

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
    piece: Option<u32>,
}

impl Bpe {
    pub(crate) fn new(
        settings: PreType,
        merges: &[String],
        token_to_id: &FxHashMap<String, u32>,
        n_vocab: u32,
    ) -> Result<Bpe, TokenizerError> {
        let pre = PreTokenizer::new(&settings.regexes)?;
        let mut extra: FxHashMap<String, u32> = FxHashMap::default();
        let intern = |s: &str, extra: &mut FxHashMap<String, u32>| -> u32 {
            if let Some(&id) = token_to_id.get(s) {
                return id;
            }
            if let Some(&id) = extra.get(s) {
                return id;
            }
            let id = n_vocab + extra.len() as u32;
            extra.insert(s.to_string(), id);
            id
        };
        let mut table: FxHashMap<(u32, u32), (u32, u32)> = FxHashMap::default();
        table.reserve(merges.len());
        let mut joined = String::new();
        for (rank, m) in merges.iter().enumerate() {
            // Split at the first space after the first byte; no space ⇒ ("", "").
            let (first, second) = match m.as_bytes().iter().skip(1).position(|&b| b == b' ') {
                Some(p) => (&m[..p + 1], &m[p + 2..]),
                None => ("", ""),
            };
            let l = intern(first, &mut extra);
            let r = intern(second, &mut extra);
            joined.clear();
            joined.push_str(first);
            joined.push_str(second);
            let j = intern(&joined, &mut extra);
            table.entry((l, r)).or_insert((rank as u32, j));
        }
        let byte_chars = byte_to_char_table();
        let mut byte_char_piece = [None; 256];
        let mut buf = [0u8; 4];
        for b in 0..256 {
            let s: &str = byte_chars[b].encode_utf8(&mut buf);
            byte_char_piece[b] = token_to_id.get(s).or_else(|| extra.get(s)).copied();
        }
        Ok(Bpe {
            pre,
            settings,
            extra_pieces: extra,
            merges: table,
            byte_chars,
            byte_char_piece,
            n_vocab,
        })
    }

    fn piece(&self, s: &str, token_to_id: &FxHashMap<String, u32>) -> Option<u32> {
        token_to_id
            .get(s)
            .or_else(|| self.extra_pieces.get(s))
            .copied()
    }

    /// Tokenizes one raw-text fragment into `out`.
    pub(crate) fn tokenize(
        &self,
        text: &str,
        token_to_id: &FxHashMap<String, u32>,
        out: &mut Vec<u32>,
    ) {
        let mut word_buf = String::new();
        let mut syms: Vec<Sym> = Vec::new();
        let mut heap: BinaryHeap<Reverse<Candidate>> = BinaryHeap::new();
        for raw in self.pre.split(text) {
            let word: &str = if self.settings.byte_encode {
                word_buf.clear();
                for &b in raw.as_bytes() {
                    word_buf.push(self.byte_chars[b as usize]);
                }
                &word_buf
            } else {
                raw
            };

            syms.clear();
            heap.clear();
            if (self.settings.ignore_merges
                || (self.settings.newline_words && word.bytes().all(|b| b == b'\n')))
                && token_to_id.contains_key(word)
            {
                out.push(token_to_id[word]);
                continue;
            }
            if self.settings.byte_encode {
                // One encoded character per raw byte.
                for (k, (&b, (off, c))) in
                    raw.as_bytes().iter().zip(word.char_indices()).enumerate()
                {
                    syms.push(Sym {
                        start: off as u32,
                        len: c.len_utf8() as u32,
                        prev: k as i32 - 1,
                        next: k as i32 + 1,
                        piece: self.byte_char_piece[b as usize],
                    });
                }
            } else {
                for (k, (off, c)) in word.char_indices().enumerate() {
                    let len = c.len_utf8();
                    syms.push(Sym {
                        start: off as u32,
                        len: len as u32,
                        prev: k as i32 - 1,
                        next: k as i32 + 1,
                        piece: self.piece(&word[off..off + len], token_to_id),
                    });
                }
            }
            if let Some(last) = syms.last_mut() {
                last.next = -1;
            }

            let add = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: i32, r: i32| {
                if l < 0 || r < 0 {
                    return;
                }
                let (a, b) = (syms[l as usize], syms[r as usize]);
                if let (Some(pa), Some(pb)) = (a.piece, b.piece) {
                    if let Some(&(rank, merged)) = self.merges.get(&(pa, pb)) {
                        heap.push(Reverse((rank, l as u32, r as u32, a.len + b.len, merged)));
                    }
                }
            };
            for i in 1..syms.len() as i32 {
                add(&mut heap, &syms, i - 1, i);
            }
            while let Some(Reverse((_, l, r, size, merged))) = heap.pop() {
                let (l, r) = (l as usize, r as usize);
                let (ls, rs) = (syms[l], syms[r]);
                if ls.len == 0 || rs.len == 0 || ls.len + rs.len != size {
                    continue;
                }
                syms[l].len += rs.len;
                syms[l].piece = Some(merged);
                syms[l].next = rs.next;
                syms[r].len = 0;
                if rs.next >= 0 {
                    syms[rs.next as usize].prev = l as i32;
                }
                add(&mut heap, &syms, ls.prev, l as i32);
                add(&mut heap, &syms, l as i32, rs.next);
            }

            for s in syms.iter().filter(|s| s.len > 0) {
                match s.piece {
                    Some(p) if p < self.n_vocab => out.push(p),
                    _ => {
                        let text = &word[s.start as usize..(s.start + s.len) as usize];
                        self.fallback_bytes(text, token_to_id, out);
                    }
                }
            }
        }
    }

    /// A symbol that is not a token becomes one token per byte where such a
    /// token exists (a single-byte string, or `<0xXX>` without byte encoding).
    fn fallback_bytes(&self, text: &str, token_to_id: &FxHashMap<String, u32>, out: &mut Vec<u32>) {
        for &b in text.as_bytes() {
            let id = if self.settings.byte_encode {
                if b.is_ascii() {
                    token_to_id.get(char::from(b).encode_utf8(&mut [0u8; 4]) as &str)
                } else {
                    None
                }
            } else {
                token_to_id.get(format!("<0x{b:02X}>").as_str())
            };
            if let Some(&id) = id {
                out.push(id);
            }
        }
    }
}
