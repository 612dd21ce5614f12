//! GGUF parsing and validation.
//!
//! A self-contained reader for GGUF v2/v3 (little-endian) files. Every field
//! is validated with checked arithmetic before it is used, so hostile or
//! corrupt files produce a [`GgufError`] instead of a panic, an abort or a
//! huge allocation. The validation rules follow ggml's own `gguf.cpp` where
//! it has one (shapes, types, alignment, duplicate names) and are stricter
//! where ggml is silent (tensor ranges must lie inside the file, must be
//! aligned and must not overlap; strings must be UTF-8).

#![warn(missing_docs)]

mod error;
mod metadata;
mod parse;
mod types;
pub mod writer;

use std::collections::HashMap;
use std::path::Path;

pub use error::GgufError;
pub use metadata::{ArrayValue, Metadata, Value};
pub use types::GgmlType;
pub use writer::{GgufWriter, TensorDecl};

/// Metadata key holding the data-section alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Metadata key holding the model architecture name.
pub const KEY_ARCHITECTURE: &str = "general.architecture";
/// Alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Maximum number of dimensions of a tensor (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Maximum tensor name length in bytes (`GGML_MAX_NAME - 1`).
pub const MAX_TENSOR_NAME_LEN: usize = 63;
/// Maximum nesting depth of metadata arrays (an array of scalars is depth 1).
pub const MAX_ARRAY_DEPTH: usize = 4;

/// Description of one tensor stored in a GGUF file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `"blk.0.attn_q.weight"`.
    pub name: String,
    /// Dimensions in ggml `ne` order (innermost / contiguous first); 1 to 4 entries.
    pub shape: Vec<u64>,
    /// Element type.
    pub dtype: GgmlType,
    /// ABSOLUTE byte offset of the tensor's data in the file.
    pub offset: u64,
    /// Size of the tensor's data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Total number of elements (product of `shape`; validated at parse
    /// time to fit in an int64, saturating for hand-built infos).
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d))
    }

    /// The shape padded with 1s to four dimensions, as ggml stores `ne`.
    pub fn ne(&self) -> [u64; MAX_DIMS] {
        let mut ne = [1u64; MAX_DIMS];
        for (d, &n) in ne.iter_mut().zip(&self.shape) {
            *d = n;
        }
        ne
    }
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Storage {
    fn bytes(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed and validated GGUF file, owning its bytes (a read-only memory map
/// or an in-memory buffer).
pub struct GgufFile {
    storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("len", &self.bytes().len())
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Memory-maps `path` read-only and parses it.
    ///
    /// The file must not be modified while it is open (the usual mmap caveat).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // Mapping an empty file is not portable; it is truncated anyway.
            return Self::from_bytes(Vec::new());
        }
        // SAFETY: the mapping is read-only and we never hand out mutable
        // access; like every mmap-based model loader we rely on the file not
        // being truncated or rewritten by another process while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::from_storage(Storage::Mmap(map))
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::from_storage(Storage::Owned(bytes))
    }

    fn from_storage(storage: Storage) -> Result<Self, GgufError> {
        let parsed = parse::parse(storage.bytes())?;
        let tensor_index = parsed
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(GgufFile {
            storage,
            version: parsed.version,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            tensor_index,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data-section alignment in bytes (a power of two).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// The metadata key/value pairs.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// All tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of tensor `t`.
    ///
    /// For a `TensorInfo` obtained from this file the range is validated and
    /// exact. For any other `TensorInfo` whose range is not inside this file
    /// an empty slice is returned (never a panic).
    pub fn tensor_bytes(&self, t: &TensorInfo) -> &[u8] {
        let range = usize::try_from(t.offset).ok().and_then(|start| {
            let len = usize::try_from(t.n_bytes).ok()?;
            Some(start..start.checked_add(len)?)
        });
        range.and_then(|r| self.bytes().get(r)).unwrap_or(&[])
    }

    /// Drops tensor `t`'s bytes from this process's resident memory. A weight copied
    /// into a buffer of its own (a GPU's, or a repacked CPU layout) is never read
    /// from the mapping again, yet its pages would stay counted in the server's RSS
    /// (15 GB for a 35B-A3B model on a GPU). A later read faults them back in from
    /// the file. No-op for a file held in memory.
    pub fn release(&self, t: &TensorInfo) {
        let Storage::Mmap(map) = &self.storage else {
            return;
        };
        let (Ok(start), Ok(len)) = (usize::try_from(t.offset), usize::try_from(t.n_bytes)) else {
            return;
        };
        if len == 0 || start.checked_add(len).is_none_or(|end| end > map.len()) {
            return;
        }
        // SAFETY: MADV_DONTNEED on a private, read-only file mapping only drops clean
        // pages: a read through any live reference faults the same file bytes back in
        // (the file must not change while mapped, as for every mapping here).
        let _ =
            unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, len) };
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        self.storage.bytes()
    }

    /// Absolute file offset of the (aligned) data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The `general.architecture` string, e.g. `"llama"`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.metadata
            .get_str(KEY_ARCHITECTURE)?
            .ok_or_else(|| GgufError::MissingKey {
                key: KEY_ARCHITECTURE.to_string(),
            })
    }
}
