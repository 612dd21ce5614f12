//! Turns a request's generated tokens into text deltas and finds stop strings.

use std::sync::Arc;

use tempo9_tokenizer::{StreamDecoder, Tokenizer};

/// Detokenizes a request's output and holds back text that may be the start of a
/// stop string, so a stop string never reaches the client even when it arrives
/// split over several tokens.
pub(crate) struct TextStream {
    tok: Arc<Tokenizer>,
    decoder: StreamDecoder,
    stops: Vec<String>,
    /// Decoded text not emitted yet (a possible stop-string prefix).
    held: String,
}

/// What one token's text amounts to.
pub(crate) struct TextStep {
    /// Text that is final.
    pub text: String,
    /// The stop string found, if any (text from it on was dropped).
    pub stop: Option<String>,
}

impl TextStream {
    pub fn new(tok: Arc<Tokenizer>, stops: &[String]) -> TextStream {
        TextStream {
            decoder: StreamDecoder::continuation(&tok, true),
            tok,
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Feeds one generated token.
    pub fn push(&mut self, id: u32) -> TextStep {
        let piece = self.decoder.push(&self.tok, id);
        self.held.push_str(&piece);
        if self.stops.is_empty() {
            return TextStep {
                text: std::mem::take(&mut self.held),
                stop: None,
            };
        }
        // Earliest match wins; at equal positions the longer stop string.
        let found = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, s)| (at, std::cmp::Reverse(s.len())));
        if let Some((at, s)) = found {
            let stop = Some(s.clone());
            self.held.truncate(at);
            return TextStep {
                text: std::mem::take(&mut self.held),
                stop,
            };
        }
        let keep = self.longest_stop_prefix_suffix();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        TextStep { text, stop: None }
    }

    /// Everything held back, at the end of the output.
    pub fn finish(&mut self) -> String {
        let tail = self.decoder.finish(&self.tok);
        self.held.push_str(&tail);
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let h = &self.held;
        let mut best = 0;
        for s in &self.stops {
            let max = (s.len() - 1).min(h.len());
            for n in (best + 1..=max).rev() {
                let start = h.len() - n;
                if h.is_char_boundary(start) && s.as_bytes().starts_with(&h.as_bytes()[start..]) {
                    best = n;
                    break;
                }
            }
        }
        best
    }
}
