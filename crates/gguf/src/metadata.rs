//! GGUF metadata values and the ordered key/value store.

use std::collections::HashMap;
use std::sync::OnceLock;

use crate::GgufError;

/// A scalar or array metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// GGUF type 0.
    U8(u8),
    /// GGUF type 1.
    I8(i8),
    /// GGUF type 2.
    U16(u16),
    /// GGUF type 3.
    I16(i16),
    /// GGUF type 4.
    U32(u32),
    /// GGUF type 5.
    I32(i32),
    /// GGUF type 10.
    U64(u64),
    /// GGUF type 11.
    I64(i64),
    /// GGUF type 6.
    F32(f32),
    /// GGUF type 12.
    F64(f64),
    /// GGUF type 7.
    Bool(bool),
    /// GGUF type 8 (always valid UTF-8).
    String(String),
    /// GGUF type 9.
    Array(ArrayValue),
}

/// A homogeneous metadata array.
#[derive(Debug, Clone, PartialEq)]
pub enum ArrayValue {
    /// Array of u8.
    U8(Vec<u8>),
    /// Array of i8.
    I8(Vec<i8>),
    /// Array of u16.
    U16(Vec<u16>),
    /// Array of i16.
    I16(Vec<i16>),
    /// Array of u32.
    U32(Vec<u32>),
    /// Array of i32.
    I32(Vec<i32>),
    /// Array of u64.
    U64(Vec<u64>),
    /// Array of i64.
    I64(Vec<i64>),
    /// Array of f32.
    F32(Vec<f32>),
    /// Array of f64.
    F64(Vec<f64>),
    /// Array of bool.
    Bool(Vec<bool>),
    /// Array of strings.
    String(Vec<String>),
    /// Array of arrays (nesting depth is bounded by the parser).
    Array(Vec<ArrayValue>),
}

impl Value {
    /// Short type name, e.g. `"u32"` or `"array of string"`.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type_name()),
            other => other.scalar_type_name().to_string(),
        }
    }

    fn scalar_type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F32(_) => "f32",
            Value::F64(_) => "f64",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
        }
    }

    /// The value as an `i128` if it is an integer of any width.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

impl ArrayValue {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            ArrayValue::U8(v) => v.len(),
            ArrayValue::I8(v) => v.len(),
            ArrayValue::U16(v) => v.len(),
            ArrayValue::I16(v) => v.len(),
            ArrayValue::U32(v) => v.len(),
            ArrayValue::I32(v) => v.len(),
            ArrayValue::U64(v) => v.len(),
            ArrayValue::I64(v) => v.len(),
            ArrayValue::F32(v) => v.len(),
            ArrayValue::F64(v) => v.len(),
            ArrayValue::Bool(v) => v.len(),
            ArrayValue::String(v) => v.len(),
            ArrayValue::Array(v) => v.len(),
        }
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element type name, e.g. `"i32"`.
    pub fn elem_type_name(&self) -> &'static str {
        match self {
            ArrayValue::U8(_) => "u8",
            ArrayValue::I8(_) => "i8",
            ArrayValue::U16(_) => "u16",
            ArrayValue::I16(_) => "i16",
            ArrayValue::U32(_) => "u32",
            ArrayValue::I32(_) => "i32",
            ArrayValue::U64(_) => "u64",
            ArrayValue::I64(_) => "i64",
            ArrayValue::F32(_) => "f32",
            ArrayValue::F64(_) => "f64",
            ArrayValue::Bool(_) => "bool",
            ArrayValue::String(_) => "string",
            ArrayValue::Array(_) => "array",
        }
    }

    /// Elements as `i128` if this is an integer array, else `None`.
    fn integers(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            ArrayValue::U8(v) => conv(v),
            ArrayValue::I8(v) => conv(v),
            ArrayValue::U16(v) => conv(v),
            ArrayValue::I16(v) => conv(v),
            ArrayValue::U32(v) => conv(v),
            ArrayValue::I32(v) => conv(v),
            ArrayValue::U64(v) => conv(v),
            ArrayValue::I64(v) => conv(v),
            _ => return None,
        })
    }
}

/// Lazily built converted copies of an array, for typed getters that must
/// return a slice of a type other than the stored one.
#[derive(Debug, Default)]
struct Conversions {
    i32s: OnceLock<Option<Vec<i32>>>,
    u32s: OnceLock<Option<Vec<u32>>>,
    f32s: OnceLock<Option<Vec<f32>>>,
}

/// The metadata key/value pairs of a GGUF file, in file order.
#[derive(Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
    conversions: Vec<Conversions>,
}

fn mismatch(key: &str, expected: &'static str, found: String) -> GgufError {
    GgufError::MetadataType {
        key: key.to_string(),
        expected,
        found,
    }
}

fn int_value<T: TryFrom<i128>>(
    key: &str,
    v: &Value,
    expected: &'static str,
) -> Result<T, GgufError> {
    match v.as_integer() {
        Some(i) => T::try_from(i).map_err(|_| {
            mismatch(
                key,
                expected,
                format!("{} value {i} (out of range)", v.type_name()),
            )
        }),
        None => Err(mismatch(key, expected, v.type_name())),
    }
}

impl Metadata {
    /// Appends a pair; returns `false` (and stores nothing) if `key` already exists.
    pub(crate) fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        self.conversions.push(Conversions::default());
        true
    }

    /// The value stored under `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// All pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A string value. Only `String` values match.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(mismatch(key, "string", v.type_name())),
        }
    }

    /// An unsigned 32-bit value; any integer type whose value fits is accepted.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.get(key).map(|v| int_value(key, v, "u32")).transpose()
    }

    /// An unsigned 64-bit value; any integer type whose value fits is accepted.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.get(key).map(|v| int_value(key, v, "u64")).transpose()
    }

    /// A signed 32-bit value; any integer type whose value fits is accepted.
    pub fn get_i32(&self, key: &str) -> Result<Option<i32>, GgufError> {
        self.get(key).map(|v| int_value(key, v, "i32")).transpose()
    }

    /// A float value; `F32`, `F64` (rounded) and integers (converted) are accepted.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(f)) => Ok(Some(*f)),
            Some(Value::F64(f)) => Ok(Some(*f as f32)),
            Some(v) => match v.as_integer() {
                Some(i) => Ok(Some(i as f32)),
                None => Err(mismatch(key, "f32", v.type_name())),
            },
        }
    }

    /// A boolean value. Only `Bool` values match.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(mismatch(key, "bool", v.type_name())),
        }
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<Option<&ArrayValue>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(mismatch(key, "array", v.type_name())),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        match self.get_array_typed(key, "array of string")? {
            None => Ok(None),
            Some((ArrayValue::String(v), _)) => Ok(Some(v)),
            Some((a, _)) => Err(mismatch(
                key,
                "array of string",
                format!("array of {}", a.elem_type_name()),
            )),
        }
    }

    /// An array of booleans.
    pub fn get_bool_array(&self, key: &str) -> Result<Option<&[bool]>, GgufError> {
        match self.get_array_typed(key, "array of bool")? {
            None => Ok(None),
            Some((ArrayValue::Bool(v), _)) => Ok(Some(v)),
            Some((a, _)) => Err(mismatch(
                key,
                "array of bool",
                format!("array of {}", a.elem_type_name()),
            )),
        }
    }

    /// An array of i32. Arrays of any integer type are accepted when every
    /// element fits (converted once, on first request).
    pub fn get_i32_array(&self, key: &str) -> Result<Option<&[i32]>, GgufError> {
        const WANT: &str = "array of i32";
        let Some((arr, conv)) = self.get_array_typed(key, WANT)? else {
            return Ok(None);
        };
        if let ArrayValue::I32(v) = arr {
            return Ok(Some(v));
        }
        let converted = conv.i32s.get_or_init(|| {
            arr.integers()
                .and_then(|v| v.into_iter().map(|x| i32::try_from(x).ok()).collect())
        });
        converted
            .as_deref()
            .map(Some)
            .ok_or_else(|| mismatch(key, WANT, array_desc(arr)))
    }

    /// An array of u32. Arrays of any integer type are accepted when every
    /// element fits (converted once, on first request).
    pub fn get_u32_array(&self, key: &str) -> Result<Option<&[u32]>, GgufError> {
        const WANT: &str = "array of u32";
        let Some((arr, conv)) = self.get_array_typed(key, WANT)? else {
            return Ok(None);
        };
        if let ArrayValue::U32(v) = arr {
            return Ok(Some(v));
        }
        let converted = conv.u32s.get_or_init(|| {
            arr.integers()
                .and_then(|v| v.into_iter().map(|x| u32::try_from(x).ok()).collect())
        });
        converted
            .as_deref()
            .map(Some)
            .ok_or_else(|| mismatch(key, WANT, array_desc(arr)))
    }

    /// An array of f32. `F64` arrays (rounded) and integer arrays (converted)
    /// are accepted too (converted once, on first request).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<&[f32]>, GgufError> {
        const WANT: &str = "array of f32";
        let Some((arr, conv)) = self.get_array_typed(key, WANT)? else {
            return Ok(None);
        };
        if let ArrayValue::F32(v) = arr {
            return Ok(Some(v));
        }
        let converted = conv.f32s.get_or_init(|| match arr {
            ArrayValue::F64(v) => Some(v.iter().map(|&x| x as f32).collect()),
            other => other
                .integers()
                .map(|v| v.into_iter().map(|x| x as f32).collect()),
        });
        converted
            .as_deref()
            .map(Some)
            .ok_or_else(|| mismatch(key, WANT, array_desc(arr)))
    }

    fn get_array_typed(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<Option<(&ArrayValue, &Conversions)>, GgufError> {
        let Some(&i) = self.index.get(key) else {
            return Ok(None);
        };
        match &self.entries[i].1 {
            Value::Array(a) => Ok(Some((a, &self.conversions[i]))),
            v => Err(mismatch(key, expected, v.type_name())),
        }
    }
}

fn array_desc(arr: &ArrayValue) -> String {
    if arr.integers().is_some() {
        format!("array of {} with out-of-range values", arr.elem_type_name())
    } else {
        format!("array of {}", arr.elem_type_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md() -> Metadata {
        let mut m = Metadata::default();
        assert!(m.insert("s".into(), Value::String("hi".into())));
        assert!(m.insert("u8".into(), Value::U8(7)));
        assert!(m.insert("neg".into(), Value::I64(-1)));
        assert!(m.insert("big".into(), Value::U64(1 << 40)));
        assert!(m.insert("f64".into(), Value::F64(0.5)));
        assert!(m.insert("b".into(), Value::Bool(true)));
        assert!(m.insert("ai32".into(), Value::Array(ArrayValue::I32(vec![1, -2, 3]))));
        assert!(m.insert("au32".into(), Value::Array(ArrayValue::U32(vec![1, 2, 3]))));
        assert!(m.insert(
            "au32big".into(),
            Value::Array(ArrayValue::U32(vec![1, u32::MAX]))
        ));
        assert!(m.insert(
            "as".into(),
            Value::Array(ArrayValue::String(vec!["a".into()]))
        ));
        assert!(!m.insert("s".into(), Value::Bool(false)));
        m
    }

    #[test]
    fn scalar_getters() {
        let m = md();
        assert_eq!(m.len(), 10);
        assert_eq!(m.get_str("s").unwrap(), Some("hi"));
        assert_eq!(m.get_str("missing").unwrap(), None);
        assert!(matches!(
            m.get_str("u8"),
            Err(GgufError::MetadataType { .. })
        ));
        assert_eq!(m.get_u32("u8").unwrap(), Some(7));
        assert_eq!(m.get_i32("neg").unwrap(), Some(-1));
        assert!(m.get_u32("neg").is_err());
        assert!(m.get_u32("big").is_err());
        assert_eq!(m.get_u64("big").unwrap(), Some(1 << 40));
        assert_eq!(m.get_f32("f64").unwrap(), Some(0.5));
        assert_eq!(m.get_f32("u8").unwrap(), Some(7.0));
        assert!(m.get_f32("s").is_err());
        assert_eq!(m.get_bool("b").unwrap(), Some(true));
        assert!(m.get_bool("u8").is_err());
        let keys: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(keys[..3], ["s", "u8", "neg"]);
    }

    #[test]
    fn array_getters_convert_between_integer_types() {
        let m = md();
        assert_eq!(m.get_i32_array("ai32").unwrap(), Some(&[1, -2, 3][..]));
        assert!(m.get_u32_array("ai32").is_err());
        assert_eq!(m.get_i32_array("au32").unwrap(), Some(&[1, 2, 3][..]));
        assert_eq!(m.get_u32_array("au32").unwrap(), Some(&[1, 2, 3][..]));
        assert!(m.get_i32_array("au32big").is_err());
        assert_eq!(m.get_f32_array("au32").unwrap(), Some(&[1.0, 2.0, 3.0][..]));
        assert!(m.get_f32_array("as").is_err());
        assert_eq!(m.get_str_array("as").unwrap().unwrap(), ["a".to_string()]);
        assert!(m.get_str_array("ai32").is_err());
        assert!(m.get_str_array("s").is_err());
        assert_eq!(m.get_bool_array("nope").unwrap(), None);
        assert_eq!(m.get_array("as").unwrap().unwrap().len(), 1);
    }
}
