//! Unicode facts the pre-tokenizers need: general-category classes (Unicode
//! 15.1, like llama.cpp), the `White_Space` property, and GPT-2's reversible
//! byte ↔ character mapping.

use crate::unicode_table::CLASS_RANGES;

/// General-category class of a code point (the first letter of its category;
/// unassigned code points are `Undefined`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Undefined,
    Number,
    Letter,
    Separator,
    Mark,
    Punct,
    Symbol,
    Control,
}

impl Class {
    fn from_code(c: u8) -> Class {
        match c {
            1 => Class::Number,
            2 => Class::Letter,
            3 => Class::Separator,
            4 => Class::Mark,
            5 => Class::Punct,
            6 => Class::Symbol,
            7 => Class::Control,
            _ => Class::Undefined,
        }
    }
}

/// The class of `c`.
pub(crate) fn class_of(c: char) -> Class {
    let cp = c as u32;
    let i = CLASS_RANGES.partition_point(|&(start, _)| start <= cp);
    // CLASS_RANGES[0].0 == 0, so i >= 1.
    Class::from_code(CLASS_RANGES[i - 1].1)
}

/// Unicode `White_Space` (what `\s` means in the pre-tokenizer regexes).
pub(crate) fn is_whitespace(c: char) -> bool {
    matches!(
        c as u32,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// Per-code-point facts used by the hand-written splitters.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Flags {
    pub class: Class,
    pub ws: bool,
}

impl Flags {
    pub(crate) fn of(c: char) -> Flags {
        Flags {
            class: class_of(c),
            ws: is_whitespace(c),
        }
    }
    pub(crate) fn letter(self) -> bool {
        self.class == Class::Letter
    }
    pub(crate) fn number(self) -> bool {
        self.class == Class::Number
    }
    pub(crate) fn mark(self) -> bool {
        self.class == Class::Mark
    }
}

/// Whether byte `b` maps to itself in GPT-2's byte-to-unicode table.
fn byte_is_printable(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

/// GPT-2's byte → character table.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        table[b as usize] = if byte_is_printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(256 + n).expect("valid code point");
            n += 1;
            c
        };
    }
    table
}

/// The bytes GPT-2 maps to U+0100.., in order.
const NON_PRINTABLE: [u8; 68] = {
    let mut out = [0u8; 68];
    let mut n = 0;
    let mut b = 0usize;
    while b < 256 {
        let byte = b as u8;
        if !matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF) {
            out[n] = byte;
            n += 1;
        }
        b += 1;
    }
    out
};

/// GPT-2's character → byte mapping (inverse of [`byte_to_char_table`]).
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 256 {
        let b = cp as u8;
        return byte_is_printable(b).then_some(b);
    }
    NON_PRINTABLE.get((cp - 256) as usize).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_of('a'), Class::Letter);
        assert_eq!(class_of('Z'), Class::Letter);
        assert_eq!(class_of('7'), Class::Number);
        assert_eq!(class_of('٣'), Class::Number);
        assert_eq!(class_of('中'), Class::Letter);
        assert_eq!(class_of(' '), Class::Separator);
        assert_eq!(class_of('\n'), Class::Control);
        assert_eq!(class_of('!'), Class::Punct);
        assert_eq!(class_of('$'), Class::Symbol);
        assert_eq!(class_of('😀'), Class::Symbol);
        assert_eq!(class_of('\u{0301}'), Class::Mark);
        assert_eq!(class_of('\u{0378}'), Class::Undefined);
        assert_eq!(class_of('\u{10FFFF}'), Class::Undefined);
        assert_eq!(class_of('\u{E000}'), Class::Control);
    }

    #[test]
    fn whitespace() {
        for c in [
            ' ', '\t', '\n', '\r', '\u{0B}', '\u{0C}', '\u{85}', '\u{A0}', '\u{3000}',
        ] {
            assert!(is_whitespace(c), "{c:?}");
        }
        for c in ['a', '\u{200B}', '_', '\u{1F}'] {
            assert!(!is_whitespace(c), "{c:?}");
        }
    }

    #[test]
    fn byte_table_round_trips() {
        let t = byte_to_char_table();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = t[b as usize];
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte('中'), None);
        assert_eq!(char_to_byte('\u{144}'), None);
    }
}
