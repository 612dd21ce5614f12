//! Incremental detokenization.

use crate::tokenizer::{clean_up_spaces, Tokenizer};

/// Turns a stream of token ids into text deltas.
///
/// Never emits broken UTF-8: an incomplete multi-byte sequence (e.g. an emoji
/// split over byte-fallback tokens) is held back until it completes; invalid
/// bytes become U+FFFD exactly where [`Tokenizer::decode`] puts them. The
/// concatenation of all [`push`](Self::push) results and
/// [`finish`](Self::finish) equals `decode` of the same ids (including the
/// SPM leading-space removal and the space clean-up some vocabularies use).
#[derive(Debug, Clone)]
pub struct StreamDecoder {
    skip_special: bool,
    strip_first_space: bool,
    first: bool,
    /// Bytes waiting for the space clean-up (only when the vocabulary uses it).
    clean_pending: Vec<u8>,
    /// Bytes waiting to become complete UTF-8.
    utf8_pending: Vec<u8>,
}

impl StreamDecoder {
    /// A decoder whose output matches `tok.decode(ids, skip_special)`.
    pub fn new(tok: &Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            skip_special,
            strip_first_space: tok.strips_leading_space(),
            first: true,
            clean_pending: Vec::new(),
            utf8_pending: Vec::new(),
        }
    }

    /// A decoder for tokens that continue an existing text (e.g. generated
    /// after a prompt): the first token's leading space is kept.
    pub fn continuation(tok: &Tokenizer, skip_special: bool) -> Self {
        StreamDecoder {
            strip_first_space: false,
            ..Self::new(tok, skip_special)
        }
    }

    /// Feeds one token; returns the text that became final.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let mut piece = tok.token_piece(id, !self.skip_special);
        if self.first && self.strip_first_space && piece.first() == Some(&b' ') {
            piece = &piece[1..];
        }
        self.first = false;
        let mut out = String::new();
        if tok.cleans_spaces() {
            self.clean_pending.extend_from_slice(piece);
            let cut = safe_cut(&self.clean_pending);
            if cut > 0 {
                let mut chunk: Vec<u8> = self.clean_pending.drain(..cut).collect();
                clean_up_spaces(&mut chunk);
                self.utf8_pending.extend_from_slice(&chunk);
            }
        } else {
            self.utf8_pending.extend_from_slice(piece);
        }
        drain_utf8(&mut self.utf8_pending, &mut out, false);
        out
    }

    /// Flushes everything held back (an unfinished UTF-8 sequence becomes U+FFFD).
    pub fn finish(&mut self, tok: &Tokenizer) -> String {
        let _ = tok;
        let mut out = String::new();
        if !self.clean_pending.is_empty() {
            let mut chunk = std::mem::take(&mut self.clean_pending);
            clean_up_spaces(&mut chunk);
            self.utf8_pending.extend_from_slice(&chunk);
        }
        drain_utf8(&mut self.utf8_pending, &mut out, true);
        out
    }
}

/// The longest prefix of `buf` the space clean-up can process on its own:
/// the clean-up only looks at spaces and apostrophes and at most two bytes
/// ahead, so a cut after three plain bytes never changes its result.
fn safe_cut(buf: &[u8]) -> usize {
    let plain = |b: u8| b != b' ' && b != b'\'';
    let mut p = buf.len();
    while p >= 3 {
        if buf[p - 3..p].iter().all(|&b| plain(b)) {
            return p;
        }
        p -= 1;
    }
    0
}

/// Moves the complete UTF-8 prefix of `buf` into `out` (invalid bytes as
/// U+FFFD, like `String::from_utf8_lossy`), keeping an incomplete tail unless
/// `last`.
fn drain_utf8(buf: &mut Vec<u8>, out: &mut String, last: bool) {
    let mut pos = 0;
    while pos < buf.len() {
        match std::str::from_utf8(&buf[pos..]) {
            Ok(s) => {
                out.push_str(s);
                pos = buf.len();
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&buf[pos..pos + valid]).unwrap_or_default());
                pos += valid;
                match e.error_len() {
                    Some(n) => {
                        out.push('\u{FFFD}');
                        pos += n;
                    }
                    None => {
                        if last {
                            out.push('\u{FFFD}');
                            pos = buf.len();
                        }
                        break;
                    }
                }
            }
        }
    }
    buf.drain(..pos);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_hold_back() {
        let mut buf = "a😀".as_bytes()[..3].to_vec();
        let mut out = String::new();
        drain_utf8(&mut buf, &mut out, false);
        assert_eq!(out, "a");
        assert_eq!(buf.len(), 2);
        buf.extend_from_slice(&"😀".as_bytes()[2..]);
        drain_utf8(&mut buf, &mut out, false);
        assert_eq!(out, "a😀");
        assert!(buf.is_empty());
    }

    #[test]
    fn utf8_invalid_matches_lossy() {
        let cases: [&[u8]; 5] = [
            b"\xff\xfeabc",
            b"ab\xe2\x82",
            b"\xe2\x82x\xf0\x9f\x98",
            b"\xc0\x80\xed\xa0\x80",
            b"ok\xf4\x90\x80\x80",
        ];
        for bytes in cases {
            let want = String::from_utf8_lossy(bytes).into_owned();
            // Byte by byte.
            let mut buf = Vec::new();
            let mut got = String::new();
            for &b in bytes {
                buf.push(b);
                drain_utf8(&mut buf, &mut got, false);
            }
            drain_utf8(&mut buf, &mut got, true);
            assert_eq!(got, want, "{bytes:?}");
        }
    }

    #[test]
    fn clean_cut_is_safe() {
        assert_eq!(safe_cut(b"abc"), 3);
        assert_eq!(safe_cut(b"ab "), 0);
        assert_eq!(safe_cut(b"abcd '"), 4);
        let text = b"Hello , it ' s fine . They 're here 'll ok ! x ' y";
        let mut whole = text.to_vec();
        clean_up_spaces(&mut whole);
        for split in 0..text.len() {
            let mut pending = text[..split].to_vec();
            let cut = safe_cut(&pending);
            let mut a: Vec<u8> = pending.drain(..cut).collect();
            clean_up_spaces(&mut a);
            pending.extend_from_slice(&text[split..]);
            clean_up_spaces(&mut pending);
            a.extend_from_slice(&pending);
            assert_eq!(a, whole, "split at {split}");
        }
    }
}
