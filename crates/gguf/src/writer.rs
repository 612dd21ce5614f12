//! Writing GGUF v3 files (the layout llama.cpp's converter produces), streaming
//! tensor data so files larger than memory can be written.
//!
//! Declare metadata and tensors first (names, shapes, types), then call
//! [`GgufWriter::write`] with a callback that produces each tensor's bytes in
//! declaration order; offsets and padding are computed here.

use std::io::{self, Write};

use crate::metadata::{ArrayValue, Value};
use crate::{GgmlType, DEFAULT_ALIGNMENT, KEY_ALIGNMENT, MAX_DIMS, MAX_TENSOR_NAME_LEN};

/// A tensor declared for writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDecl {
    /// Tensor name.
    pub name: String,
    /// Dimensions, innermost first.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// Bytes of data.
    pub n_bytes: u64,
}

/// Builds a GGUF file: metadata key/values in insertion order, then tensors.
#[derive(Debug, Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<TensorDecl>,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl GgufWriter {
    /// An empty file description.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Sets metadata `key` (replacing an earlier value of the same key).
    pub fn set(&mut self, key: &str, value: Value) -> &mut Self {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
        self
    }

    /// Declares a tensor; its data comes later, in declaration order.
    pub fn add_tensor(
        &mut self,
        name: &str,
        shape: &[u64],
        dtype: GgmlType,
    ) -> io::Result<&TensorDecl> {
        if name.is_empty() || name.len() > MAX_TENSOR_NAME_LEN {
            return Err(invalid(format!(
                "tensor name '{name}' is empty or too long"
            )));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(invalid(format!("duplicate tensor {name}")));
        }
        if shape.is_empty() || shape.len() > MAX_DIMS || shape.contains(&0) {
            return Err(invalid(format!("tensor {name}: bad shape {shape:?}")));
        }
        let row = dtype.row_bytes(shape[0]).ok_or_else(|| {
            invalid(format!(
                "tensor {name}: {} values per row are not whole {} blocks",
                shape[0],
                dtype.name()
            ))
        })?;
        let n_bytes = shape[1..]
            .iter()
            .try_fold(row, |n, &d| n.checked_mul(d))
            .ok_or_else(|| invalid(format!("tensor {name}: size overflows")))?;
        self.tensors.push(TensorDecl {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            n_bytes,
        });
        Ok(self.tensors.last().expect("just pushed"))
    }

    /// The declared tensors, in order.
    pub fn tensors(&self) -> &[TensorDecl] {
        &self.tensors
    }

    fn alignment(&self) -> io::Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == KEY_ALIGNMENT) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, Value::U32(a))) if a.is_power_of_two() => Ok(*a as u64),
            Some((_, v)) => Err(invalid(format!(
                "{KEY_ALIGNMENT} must be a power-of-two u32, got {v:?}"
            ))),
        }
    }

    /// Writes the file to `out`. `data(i, decl, out)` must write exactly
    /// `decl.n_bytes` bytes of tensor `i`; the writer checks the count and pads.
    /// Returns the number of bytes written.
    pub fn write<W: Write>(
        &self,
        out: &mut W,
        mut data: impl FnMut(usize, &TensorDecl, &mut dyn Write) -> io::Result<()>,
    ) -> io::Result<u64> {
        let align = self.alignment()?;
        let mut w = Counting { inner: out, n: 0 };
        w.write_all(b"GGUF")?;
        w.write_all(&3u32.to_le_bytes())?;
        w.write_all(&(self.tensors.len() as u64).to_le_bytes())?;
        w.write_all(&(self.metadata.len() as u64).to_le_bytes())?;
        for (k, v) in &self.metadata {
            write_str(&mut w, k)?;
            write_value(&mut w, v, true)?;
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            write_str(&mut w, &t.name)?;
            w.write_all(&(t.shape.len() as u32).to_le_bytes())?;
            for &d in &t.shape {
                w.write_all(&d.to_le_bytes())?;
            }
            w.write_all(&t.dtype.id().to_le_bytes())?;
            w.write_all(&offset.to_le_bytes())?;
            offset += t.n_bytes.next_multiple_of(align);
        }
        pad(&mut w, align)?;
        for (i, t) in self.tensors.iter().enumerate() {
            let start = w.n;
            data(i, t, &mut w)?;
            if w.n - start != t.n_bytes {
                return Err(invalid(format!(
                    "tensor {}: {} bytes written, {} declared",
                    t.name,
                    w.n - start,
                    t.n_bytes
                )));
            }
            pad(&mut w, align)?;
        }
        w.flush()?;
        Ok(w.n)
    }

    /// Writes the whole file into memory, taking each tensor's bytes from `data(i)`.
    pub fn to_bytes(&self, mut data: impl FnMut(usize) -> Vec<u8>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write(&mut out, |i, _, w| w.write_all(&data(i)))?;
        Ok(out)
    }
}

/// Counts bytes on their way to the inner writer (for offsets and padding).
struct Counting<'a, W: Write> {
    inner: &'a mut W,
    n: u64,
}

impl<W: Write> Write for Counting<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let k = self.inner.write(buf)?;
        self.n += k as u64;
        Ok(k)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn pad<W: Write>(w: &mut Counting<'_, W>, align: u64) -> io::Result<()> {
    let n = (w.n.next_multiple_of(align) - w.n) as usize;
    w.write_all(&vec![0u8; n])
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

/// GGUF value type id of a scalar value or array element.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn array_elem_type(a: &ArrayValue) -> u32 {
    match a {
        ArrayValue::U8(_) => 0,
        ArrayValue::I8(_) => 1,
        ArrayValue::U16(_) => 2,
        ArrayValue::I16(_) => 3,
        ArrayValue::U32(_) => 4,
        ArrayValue::I32(_) => 5,
        ArrayValue::F32(_) => 6,
        ArrayValue::Bool(_) => 7,
        ArrayValue::String(_) => 8,
        ArrayValue::Array(_) => 9,
        ArrayValue::U64(_) => 10,
        ArrayValue::I64(_) => 11,
        ArrayValue::F64(_) => 12,
    }
}

fn write_value(w: &mut impl Write, v: &Value, with_type: bool) -> io::Result<()> {
    if with_type {
        w.write_all(&type_id(v).to_le_bytes())?;
    }
    match v {
        Value::U8(x) => w.write_all(&[*x]),
        Value::I8(x) => w.write_all(&x.to_le_bytes()),
        Value::U16(x) => w.write_all(&x.to_le_bytes()),
        Value::I16(x) => w.write_all(&x.to_le_bytes()),
        Value::U32(x) => w.write_all(&x.to_le_bytes()),
        Value::I32(x) => w.write_all(&x.to_le_bytes()),
        Value::U64(x) => w.write_all(&x.to_le_bytes()),
        Value::I64(x) => w.write_all(&x.to_le_bytes()),
        Value::F32(x) => w.write_all(&x.to_le_bytes()),
        Value::F64(x) => w.write_all(&x.to_le_bytes()),
        Value::Bool(x) => w.write_all(&[*x as u8]),
        Value::String(s) => write_str(w, s),
        Value::Array(a) => write_array(w, a),
    }
}

fn write_array(w: &mut impl Write, a: &ArrayValue) -> io::Result<()> {
    w.write_all(&array_elem_type(a).to_le_bytes())?;
    macro_rules! each {
        ($v:expr, $f:expr) => {{
            w.write_all(&($v.len() as u64).to_le_bytes())?;
            for x in $v {
                $f(w, x)?;
            }
            Ok(())
        }};
    }
    match a {
        ArrayValue::U8(v) => each!(v, |w: &mut _, x: &u8| write_value(w, &Value::U8(*x), false)),
        ArrayValue::I8(v) => each!(v, |w: &mut _, x: &i8| write_value(w, &Value::I8(*x), false)),
        ArrayValue::U16(v) => each!(v, |w: &mut _, x: &u16| write_value(
            w,
            &Value::U16(*x),
            false
        )),
        ArrayValue::I16(v) => each!(v, |w: &mut _, x: &i16| write_value(
            w,
            &Value::I16(*x),
            false
        )),
        ArrayValue::U32(v) => each!(v, |w: &mut _, x: &u32| write_value(
            w,
            &Value::U32(*x),
            false
        )),
        ArrayValue::I32(v) => each!(v, |w: &mut _, x: &i32| write_value(
            w,
            &Value::I32(*x),
            false
        )),
        ArrayValue::U64(v) => each!(v, |w: &mut _, x: &u64| write_value(
            w,
            &Value::U64(*x),
            false
        )),
        ArrayValue::I64(v) => each!(v, |w: &mut _, x: &i64| write_value(
            w,
            &Value::I64(*x),
            false
        )),
        ArrayValue::F32(v) => each!(v, |w: &mut _, x: &f32| write_value(
            w,
            &Value::F32(*x),
            false
        )),
        ArrayValue::F64(v) => each!(v, |w: &mut _, x: &f64| write_value(
            w,
            &Value::F64(*x),
            false
        )),
        ArrayValue::Bool(v) => {
            each!(v, |w: &mut _, x: &bool| write_value(
                w,
                &Value::Bool(*x),
                false
            ))
        }
        ArrayValue::String(v) => each!(v, |w: &mut _, x: &String| write_str(w, x)),
        ArrayValue::Array(v) => each!(v, |w: &mut _, x: &ArrayValue| write_array(w, x)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::GgufFile;

    #[test]
    fn written_files_parse_back() {
        let mut g = GgufWriter::new();
        g.set("general.architecture", Value::String("llama".into()))
            .set("llama.block_count", Value::U32(2))
            .set("x.f", Value::F32(0.5))
            .set("x.b", Value::Bool(true))
            .set(
                "x.strs",
                Value::Array(ArrayValue::String(vec!["a".into(), "bc".into()])),
            )
            .set("x.ints", Value::Array(ArrayValue::I32(vec![1, -2, 3])))
            .set("general.alignment", Value::U32(64));
        g.add_tensor("a", &[3, 2], GgmlType::F32).unwrap();
        g.add_tensor("q", &[256, 4], GgmlType::Q4_K).unwrap();
        assert!(g.add_tensor("bad", &[100], GgmlType::Q4_K).is_err());
        assert!(g.add_tensor("a", &[1], GgmlType::F32).is_err());
        let bytes = g
            .to_bytes(|i| vec![i as u8 + 1; g.tensors()[i].n_bytes as usize])
            .unwrap();
        let f = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(f.alignment(), 64);
        assert_eq!(f.architecture().unwrap(), "llama");
        let md = f.metadata();
        assert_eq!(md.get_u32("llama.block_count").unwrap(), Some(2));
        assert_eq!(md.get_f32("x.f").unwrap(), Some(0.5));
        assert_eq!(md.get_bool("x.b").unwrap(), Some(true));
        assert_eq!(
            md.get_str_array("x.strs").unwrap().unwrap(),
            vec!["a".to_string(), "bc".to_string()]
        );
        assert_eq!(md.get_i32_array("x.ints").unwrap().unwrap(), vec![1, -2, 3]);
        let q = f.tensor("q").unwrap();
        assert_eq!(q.n_bytes, 4 * 144);
        assert_eq!(q.offset % 64, 0);
        assert!(f.tensor_bytes(q).iter().all(|&b| b == 2));
        assert_eq!(f.tensor_bytes(f.tensor("a").unwrap()), &[1u8; 24][..]);
    }

    #[test]
    fn wrong_data_length_is_an_error() {
        let mut g = GgufWriter::new();
        g.add_tensor("a", &[4], GgmlType::F32).unwrap();
        assert!(g.to_bytes(|_| vec![0; 15]).is_err());
    }
}
