//! SentencePiece-style (BPE by score) tokenization, as llama.cpp's SPM
//! session: start from single characters, repeatedly merge the adjacent pair
//! whose concatenation is the highest-scoring vocabulary token (leftmost on
//! ties), then emit each final symbol as its token or as byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then smaller left index.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .partial_cmp(&other.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| other.left.cmp(&self.left))
    }
}

#[derive(Clone, Copy)]
struct Sym {
    start: u32,
    len: u32,
    prev: i32,
    next: i32,
}

/// Tokenizes `text` (spaces already escaped as `▁`) into `out`.
/// `byte_token[b]` is the token for raw byte `b` (`<0xXX>`), if any.
pub(crate) fn tokenize(
    text: &str,
    token_to_id: &FxHashMap<String, u32>,
    scores: &[f32],
    byte_token: &[Option<u32>; 256],
    out: &mut Vec<u32>,
) {
    let mut syms: Vec<Sym> = text
        .char_indices()
        .enumerate()
        .map(|(k, (off, c))| Sym {
            start: off as u32,
            len: c.len_utf8() as u32,
            prev: k as i32 - 1,
            next: k as i32 + 1,
        })
        .collect();
    if let Some(last) = syms.last_mut() {
        last.next = -1;
    }
    let mut heap = BinaryHeap::with_capacity(syms.len());
    let add = |heap: &mut BinaryHeap<Bigram>, syms: &[Sym], l: i32, r: i32| {
        if l < 0 || r < 0 {
            return;
        }
        let (a, b) = (syms[l as usize], syms[r as usize]);
        let s = a.start as usize;
        let e = (b.start + b.len) as usize;
        if let Some(&id) = token_to_id.get(&text[s..e]) {
            heap.push(Bigram {
                score: scores.get(id as usize).copied().unwrap_or(0.0),
                left: l as u32,
                right: r as u32,
                size: (e - s) as u32,
            });
        }
    };
    for i in 1..syms.len() as i32 {
        add(&mut heap, &syms, i - 1, i);
    }
    while let Some(bg) = heap.pop() {
        let (l, r) = (bg.left as usize, bg.right as usize);
        let (ls, rs) = (syms[l], syms[r]);
        if ls.len == 0 || rs.len == 0 || ls.len + rs.len != bg.size {
            continue;
        }
        syms[l].len += rs.len;
        syms[l].next = rs.next;
        syms[r].len = 0;
        if rs.next >= 0 {
            syms[rs.next as usize].prev = l as i32;
        }
        add(&mut heap, &syms, ls.prev, l as i32);
        add(&mut heap, &syms, l as i32, rs.next);
    }

    let mut i: i32 = if syms.is_empty() { -1 } else { 0 };
    while i >= 0 {
        let s = syms[i as usize];
        let piece = &text[s.start as usize..(s.start + s.len) as usize];
        match token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => out.extend(piece.bytes().filter_map(|b| byte_token[b as usize])),
        }
        i = s.next;
    }
}
