//! The GGUF parser: a bounds-checked cursor over the file bytes plus the
//! validation of every header field.

use std::collections::HashSet;

use crate::{
    ArrayValue, GgmlType, GgufError, Metadata, TensorInfo, Value, DEFAULT_ALIGNMENT, KEY_ALIGNMENT,
    MAX_ARRAY_DEPTH, MAX_DIMS, MAX_TENSOR_NAME_LEN,
};

/// Smallest possible encoding of one key/value pair: key length (8) + a
/// non-empty key (1) + value type (4) + the smallest value (1).
const MIN_KV_BYTES: u64 = 14;
/// Smallest possible encoding of one tensor info: name length (8) + n_dims
/// (4) + one dimension (8) + type (4) + offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 32;
/// Upper bound on speculative `Vec` preallocation; vectors grow beyond it
/// only as elements are actually read from the file.
const MAX_PREALLOC: usize = 1 << 16;

/// The result of a successful parse.
pub(crate) struct Parsed {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn u64_of(n: usize) -> u64 {
    // usize is at most 64 bits on every supported target.
    n as u64
}

impl<'a> Reader<'a> {
    fn offset(&self) -> u64 {
        u64_of(self.pos)
    }

    fn remaining(&self) -> u64 {
        u64_of(self.buf.len() - self.pos)
    }

    fn take(&mut self, n: u64, what: impl FnOnce() -> String) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        if n > available {
            return Err(GgufError::Truncated {
                offset: self.offset(),
                what: what(),
                needed: n,
                available,
            });
        }
        // n <= remaining <= usize::MAX, so the cast and the addition are exact.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let b = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a GGUF string (u64 length + bytes) that must be valid UTF-8.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(|| format!("length of {}", what()))?;
        let at = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset: at,
            }),
        }
    }

    /// Checks that `count` items of at least `min_size` bytes each could fit
    /// in the rest of the file.
    fn check_count(
        &self,
        count: u64,
        min_size: u64,
        count_offset: u64,
        what: impl FnOnce() -> String,
    ) -> Result<(), GgufError> {
        let available = self.remaining();
        match count.checked_mul(min_size) {
            Some(need) if need <= available => Ok(()),
            need => Err(GgufError::CountTooLarge {
                what: what(),
                count,
                offset: count_offset,
                min_bytes: need.unwrap_or(u64::MAX),
                available,
            }),
        }
    }
}

/// Minimum encoded size of one value of GGUF type `t`, or `None` if `t` is
/// not a valid type id.
fn min_value_size(t: u32) -> Option<u64> {
    Some(match t {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 => 8,
        9 => 12,
        10..=12 => 8,
        _ => return None,
    })
}

fn capacity(count: u64) -> usize {
    usize::try_from(count)
        .unwrap_or(usize::MAX)
        .min(MAX_PREALLOC)
}

/// Decodes `count` fixed-size little-endian values; the caller has checked
/// that `count * N` bytes remain.
fn fixed<const N: usize, T>(
    r: &mut Reader<'_>,
    count: u64,
    key: &str,
    conv: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    let n_bytes = count.saturating_mul(N as u64);
    let bytes = r.take(n_bytes, || {
        format!("array elements of metadata key '{key}'")
    })?;
    Ok(bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            conv(a)
        })
        .collect())
}

fn invalid_type(key: &str, type_id: u32, offset: u64) -> GgufError {
    GgufError::InvalidValueType {
        key: key.to_string(),
        type_id,
        offset,
    }
}

/// Reads a value of GGUF type `type_id` (whose id was read at `type_offset`).
fn read_value(
    r: &mut Reader<'_>,
    type_id: u32,
    type_offset: u64,
    key: &str,
) -> Result<Value, GgufError> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match type_id {
        0 => Value::U8(u8::from_le_bytes(r.array(what)?)),
        1 => Value::I8(i8::from_le_bytes(r.array(what)?)),
        2 => Value::U16(u16::from_le_bytes(r.array(what)?)),
        3 => Value::I16(i16::from_le_bytes(r.array(what)?)),
        4 => Value::U32(u32::from_le_bytes(r.array(what)?)),
        5 => Value::I32(i32::from_le_bytes(r.array(what)?)),
        6 => Value::F32(f32::from_le_bytes(r.array(what)?)),
        // ggml reads a bool as "byte != 0"; we do the same for compatibility.
        7 => Value::Bool(r.array::<1>(what)?[0] != 0),
        8 => Value::String(r.string(&|| format!("string value of metadata key '{key}'"))?),
        10 => Value::U64(u64::from_le_bytes(r.array(what)?)),
        11 => Value::I64(i64::from_le_bytes(r.array(what)?)),
        12 => Value::F64(f64::from_le_bytes(r.array(what)?)),
        9 => Value::Array(read_array(r, key, 1)?),
        _ => return Err(invalid_type(key, type_id, type_offset)),
    })
}

/// Reads an array header (element type + count) and its elements.
/// `depth` is the nesting depth of the array being read (1 = top level).
fn read_array(r: &mut Reader<'_>, key: &str, depth: usize) -> Result<ArrayValue, GgufError> {
    let header_offset = r.offset();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max_depth: MAX_ARRAY_DEPTH,
            offset: header_offset,
        });
    }
    let elem_type = r.u32(|| format!("array element type of metadata key '{key}'"))?;
    let Some(min_size) = min_value_size(elem_type) else {
        return Err(invalid_type(key, elem_type, header_offset));
    };
    let count_offset = r.offset();
    let count = r.u64(|| format!("array length of metadata key '{key}'"))?;
    r.check_count(count, min_size, count_offset, || {
        format!("array element (metadata key '{key}')")
    })?;
    Ok(match elem_type {
        0 => ArrayValue::U8(fixed(r, count, key, u8::from_le_bytes)?),
        1 => ArrayValue::I8(fixed(r, count, key, i8::from_le_bytes)?),
        2 => ArrayValue::U16(fixed(r, count, key, u16::from_le_bytes)?),
        3 => ArrayValue::I16(fixed(r, count, key, i16::from_le_bytes)?),
        4 => ArrayValue::U32(fixed(r, count, key, u32::from_le_bytes)?),
        5 => ArrayValue::I32(fixed(r, count, key, i32::from_le_bytes)?),
        6 => ArrayValue::F32(fixed(r, count, key, f32::from_le_bytes)?),
        7 => ArrayValue::Bool(fixed(r, count, key, |b: [u8; 1]| b[0] != 0)?),
        8 => {
            let mut v = Vec::with_capacity(capacity(count));
            for i in 0..count {
                v.push(r.string(&|| format!("string #{i} of array metadata key '{key}'"))?);
            }
            ArrayValue::String(v)
        }
        9 => {
            let mut v = Vec::with_capacity(capacity(count));
            for _ in 0..count {
                v.push(read_array(r, key, depth + 1)?);
            }
            ArrayValue::Array(v)
        }
        10 => ArrayValue::U64(fixed(r, count, key, u64::from_le_bytes)?),
        11 => ArrayValue::I64(fixed(r, count, key, i64::from_le_bytes)?),
        12 => ArrayValue::F64(fixed(r, count, key, f64::from_le_bytes)?),
        _ => return Err(invalid_type(key, elem_type, header_offset)),
    })
}

fn read_kv(r: &mut Reader<'_>, index: u64, metadata: &mut Metadata) -> Result<(), GgufError> {
    let key_offset = r.offset();
    let key = r.string(&|| format!("metadata key #{index}"))?;
    if key.is_empty() {
        return Err(GgufError::EmptyKey {
            index,
            offset: key_offset,
        });
    }
    if metadata.get(&key).is_some() {
        return Err(GgufError::DuplicateKey {
            key,
            offset: key_offset,
        });
    }
    let type_offset = r.offset();
    let type_id = r.u32(|| format!("value type of metadata key '{key}'"))?;
    let value = read_value(r, type_id, type_offset, &key)?;
    let inserted = metadata.insert(key, value);
    debug_assert!(inserted, "duplicates are rejected above");
    Ok(())
}

fn read_alignment(metadata: &Metadata) -> Result<u64, GgufError> {
    match metadata.get(KEY_ALIGNMENT) {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(Value::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
        Some(Value::U32(a)) => Err(GgufError::BadAlignment {
            reason: format!("{a} is not a power of two"),
        }),
        Some(v) => Err(GgufError::BadAlignment {
            reason: format!("must be u32, found {}", v.type_name()),
        }),
    }
}

/// Reads one tensor info. The returned `offset` is still relative to the
/// data section.
fn read_tensor_info(
    r: &mut Reader<'_>,
    index: u64,
    seen: &mut HashSet<String>,
) -> Result<TensorInfo, GgufError> {
    let name_offset = r.offset();
    let name = r.string(&|| format!("name of tensor #{index}"))?;
    if name.len() > MAX_TENSOR_NAME_LEN {
        return Err(GgufError::TensorNameTooLong {
            len: name.len(),
            name,
            offset: name_offset,
        });
    }
    if !seen.insert(name.clone()) {
        return Err(GgufError::DuplicateTensor {
            name,
            offset: name_offset,
        });
    }

    let dims_offset = r.offset();
    let n_dims = r.u32(|| format!("dimension count of tensor '{name}'"))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::InvalidDims {
            name,
            n_dims,
            offset: dims_offset,
        });
    }
    let mut shape = Vec::with_capacity(n_dims as usize);
    for j in 0..n_dims {
        shape.push(r.u64(|| format!("dimension {j} of tensor '{name}'"))?);
    }
    // ggml stores ne as int64: reject "negative" dimensions and element
    // counts that overflow int64. Zero-sized dimensions are allowed (as in ggml).
    if let Some(j) = shape.iter().position(|&n| n > i64::MAX as u64) {
        return Err(GgufError::InvalidShape {
            reason: format!("dimension {j} is negative as int64"),
            name,
            shape,
        });
    }
    let mut n_elements: u64 = 1;
    for &n in &shape {
        match n_elements.checked_mul(n) {
            Some(p) if p <= i64::MAX as u64 => n_elements = p,
            _ => {
                return Err(GgufError::InvalidShape {
                    reason: "element count overflows int64".to_string(),
                    name,
                    shape,
                })
            }
        }
    }

    let type_offset = r.offset();
    let type_id = r.u32(|| format!("type of tensor '{name}'"))?;
    let Some(dtype) = GgmlType::from_u32(type_id) else {
        return Err(GgufError::UnknownType {
            name,
            type_id,
            offset: type_offset,
        });
    };
    let Some(row_bytes) = dtype.row_bytes(shape[0]) else {
        return Err(GgufError::NotBlockMultiple {
            dtype: dtype.name(),
            ne0: shape[0],
            block_size: dtype.block_size(),
            name,
        });
    };
    // Divides n_elements unless a dimension is 0 (then n_elements is 0 whatever the
    // others are, and their product may overflow): checked.
    let n_rows = shape[1..].iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let Some(n_bytes) = n_rows.and_then(|n| row_bytes.checked_mul(n)) else {
        return Err(GgufError::InvalidShape {
            reason: "byte size overflows u64".to_string(),
            name,
            shape,
        });
    };

    let offset = r.u64(|| format!("data offset of tensor '{name}'"))?;
    Ok(TensorInfo {
        name,
        shape,
        dtype,
        offset,
        n_bytes,
    })
}

/// Resolves relative tensor offsets to absolute ones and checks alignment,
/// bounds and overlap.
fn place_tensors(
    tensors: &mut [TensorInfo],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors.iter_mut() {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                name: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => t.offset = start,
            _ => {
                let start = data_offset.saturating_add(t.offset);
                return Err(GgufError::TensorOutOfBounds {
                    name: t.name.clone(),
                    start,
                    end: start.saturating_add(t.n_bytes),
                    file_len,
                });
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        let (a, b) = (w[0], w[1]);
        let a_end = a.offset + a.n_bytes; // checked above
        if b.offset < a_end {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                first_start: a.offset,
                first_end: a_end,
                second: b.name.clone(),
                second_start: b.offset,
            });
        }
    }
    Ok(())
}

/// Parses and validates a complete GGUF file.
pub(crate) fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut r = Reader { buf, pos: 0 };
    let file_len = u64_of(buf.len());

    let magic: [u8; 4] = r.array(|| "magic".to_string())?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = r.u32(|| "version".to_string())?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion { version });
    }
    let tensor_count_offset = r.offset();
    let tensor_count = r.u64(|| "tensor count".to_string())?;
    let kv_count_offset = r.offset();
    let kv_count = r.u64(|| "key/value count".to_string())?;

    r.check_count(
        tensor_count,
        MIN_TENSOR_INFO_BYTES,
        tensor_count_offset,
        || "tensor".to_string(),
    )?;
    r.check_count(kv_count, MIN_KV_BYTES, kv_count_offset, || {
        "metadata key/value".to_string()
    })?;
    // Both share the remaining bytes.
    let min_header = (tensor_count * MIN_TENSOR_INFO_BYTES).checked_add(kv_count * MIN_KV_BYTES);
    if min_header.is_none_or(|n| n > r.remaining()) {
        return Err(GgufError::CountTooLarge {
            what: format!("tensor ({tensor_count}) + metadata key/value"),
            count: kv_count,
            offset: kv_count_offset,
            min_bytes: min_header.unwrap_or(u64::MAX),
            available: r.remaining(),
        });
    }

    let mut metadata = Metadata::default();
    for i in 0..kv_count {
        read_kv(&mut r, i, &mut metadata)?;
    }
    let alignment = read_alignment(&metadata)?;

    let mut tensors = Vec::with_capacity(capacity(tensor_count));
    let mut seen = HashSet::with_capacity(capacity(tensor_count));
    for i in 0..tensor_count {
        tensors.push(read_tensor_info(&mut r, i, &mut seen)?);
    }

    let end_of_infos = r.offset();
    let padded = end_of_infos
        .checked_next_multiple_of(alignment)
        .unwrap_or(u64::MAX);
    let data_offset = if padded <= file_len {
        padded
    } else if tensors.is_empty() {
        // Like ggml: without tensors the data section need not be padded.
        end_of_infos
    } else {
        return Err(GgufError::DataSectionOutOfBounds {
            data_offset: padded,
            file_len,
        });
    };
    place_tensors(&mut tensors, data_offset, alignment, file_len)?;

    Ok(Parsed {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use crate::{GgufError, GgufFile};

    /// Found by libFuzzer (fuzz target `gguf`): a zero first dimension made the
    /// element count 0, so the product of the other dimensions (the row count)
    /// could overflow u64 and panic. It is an `InvalidShape` error.
    #[test]
    fn zero_dimension_with_overflowing_row_count_is_an_error() {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes()); // version
        b.extend_from_slice(&1u64.to_le_bytes()); // tensors
        b.extend_from_slice(&0u64.to_le_bytes()); // metadata
        b.extend_from_slice(&1u64.to_le_bytes()); // name length
        b.push(b't');
        b.extend_from_slice(&3u32.to_le_bytes()); // dimensions
        for d in [0u64, 1 << 40, 1 << 40] {
            b.extend_from_slice(&d.to_le_bytes());
        }
        b.extend_from_slice(&0u32.to_le_bytes()); // F32
        b.extend_from_slice(&0u64.to_le_bytes()); // offset
        b.resize(b.len().next_multiple_of(32), 0);
        match GgufFile::from_bytes(b) {
            Err(GgufError::InvalidShape { .. }) => {}
            other => panic!("want InvalidShape, got {:?}", other.map(|_| ())),
        }
    }
}
