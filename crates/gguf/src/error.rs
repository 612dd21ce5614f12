//! Errors produced while opening, validating or querying a GGUF file.

use std::path::PathBuf;

/// Everything that can go wrong reading a GGUF file.
///
/// Offsets are absolute byte offsets from the start of the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, inspected or mapped.
    #[error("cannot read GGUF file {}: {source}", path.display())]
    Io {
        /// The path that was being opened.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },

    /// The file ends before a structure that must be there.
    #[error(
        "GGUF file truncated at byte offset {offset}: reading {what} needs {needed} bytes, only {available} left"
    )]
    Truncated {
        /// Where the read started.
        offset: u64,
        /// What was being read.
        what: String,
        /// How many bytes the read needed.
        needed: u64,
        /// How many bytes were left in the file.
        available: u64,
    },

    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic at byte offset 0 is {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
    },

    /// The version is not 2 or 3.
    #[error("unsupported GGUF version {version} at byte offset 4 (supported: 2, 3)")]
    UnsupportedVersion {
        /// The version found.
        version: u32,
    },

    /// A count (tensors, key/value pairs, array elements) cannot fit in the remaining bytes.
    #[error(
        "{what} count {count} at byte offset {offset} is impossible: it needs at least {min_bytes} bytes but only {available} remain"
    )]
    CountTooLarge {
        /// What is being counted.
        what: String,
        /// The count read from the file.
        count: u64,
        /// Where the count was read.
        offset: u64,
        /// Minimum bytes (saturated) the claimed items would occupy.
        min_bytes: u64,
        /// Bytes remaining after the count.
        available: u64,
    },

    /// A string is not valid UTF-8.
    #[error("{what} at byte offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// What the string is (key, value of a key, tensor name).
        what: String,
        /// Offset of the string's bytes.
        offset: u64,
    },

    /// A metadata key is empty.
    #[error("metadata key #{index} at byte offset {offset} is empty")]
    EmptyKey {
        /// Index of the key/value pair.
        index: u64,
        /// Offset of the key.
        offset: u64,
    },

    /// The same metadata key appears twice.
    #[error("duplicate metadata key '{key}' at byte offset {offset}")]
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// Offset of the second occurrence.
        offset: u64,
    },

    /// A metadata value (or array element) type id is not a GGUF value type.
    #[error("metadata key '{key}' has invalid value type id {type_id} at byte offset {offset}")]
    InvalidValueType {
        /// The key being read.
        key: String,
        /// The type id found.
        type_id: u32,
        /// Offset of the type id.
        offset: u64,
    },

    /// Arrays are nested deeper than supported.
    #[error(
        "metadata key '{key}' nests arrays deeper than {max_depth} levels at byte offset {offset}"
    )]
    NestingTooDeep {
        /// The key being read.
        key: String,
        /// The maximum nesting depth.
        max_depth: usize,
        /// Offset of the offending array header.
        offset: u64,
    },

    /// `general.alignment` has the wrong type or is not a power of two.
    #[error("invalid general.alignment: {reason}")]
    BadAlignment {
        /// What is wrong with it.
        reason: String,
    },

    /// A metadata value exists but cannot be read as the requested type.
    #[error("metadata key '{key}' is {found}, expected {expected}")]
    MetadataType {
        /// The key.
        key: String,
        /// The requested type.
        expected: &'static str,
        /// Description of what is stored.
        found: String,
    },

    /// A required metadata key is absent.
    #[error("required metadata key '{key}' is missing")]
    MissingKey {
        /// The missing key.
        key: String,
    },

    /// The same tensor name appears twice.
    #[error("duplicate tensor name '{name}' at byte offset {offset}")]
    DuplicateTensor {
        /// The repeated name.
        name: String,
        /// Offset of the second occurrence's name.
        offset: u64,
    },

    /// A tensor name does not fit ggml's 64-byte name buffer.
    #[error(
        "tensor name '{name}' at byte offset {offset} is {len} bytes long; ggml allows at most 63"
    )]
    TensorNameTooLong {
        /// The name.
        name: String,
        /// Its length in bytes.
        len: usize,
        /// Offset of the name.
        offset: u64,
    },

    /// A tensor's dimension count is outside 1..=4.
    #[error("tensor '{name}' has {n_dims} dimensions at byte offset {offset}; must be 1..=4")]
    InvalidDims {
        /// The tensor.
        name: String,
        /// The dimension count found.
        n_dims: u32,
        /// Offset of the dimension count.
        offset: u64,
    },

    /// A tensor's shape is invalid (negative as int64, or element count overflows).
    #[error("tensor '{name}' has invalid shape {shape:?}: {reason}")]
    InvalidShape {
        /// The tensor.
        name: String,
        /// The shape as read.
        shape: Vec<u64>,
        /// What is wrong with it.
        reason: String,
    },

    /// A tensor's ggml type id is unknown or removed.
    #[error("tensor '{name}' has unknown ggml type id {type_id} at byte offset {offset}")]
    UnknownType {
        /// The tensor.
        name: String,
        /// The type id found.
        type_id: u32,
        /// Offset of the type id.
        offset: u64,
    },

    /// A tensor's row length is not a multiple of its type's block size.
    #[error("tensor '{name}' of type {dtype} has ne0 = {ne0}, not a multiple of the block size {block_size}")]
    NotBlockMultiple {
        /// The tensor.
        name: String,
        /// Its type name.
        dtype: &'static str,
        /// Its row length.
        ne0: u64,
        /// The type's block size.
        block_size: u64,
    },

    /// A tensor's offset (relative to the data section) is not a multiple of the alignment.
    #[error("tensor '{name}' data offset {offset} (relative to the data section) is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        name: String,
        /// The relative offset found.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },

    /// The data section starts past the end of the file.
    #[error("data section would start at byte offset {data_offset}, past the end of the {file_len}-byte file")]
    DataSectionOutOfBounds {
        /// Where the (aligned) data section would start.
        data_offset: u64,
        /// The file length.
        file_len: u64,
    },

    /// A tensor's bytes extend past the end of the file.
    #[error("tensor '{name}' data [{start}, {end}) lies outside the {file_len}-byte file")]
    TensorOutOfBounds {
        /// The tensor.
        name: String,
        /// Absolute start offset (saturated).
        start: u64,
        /// Absolute end offset (saturated).
        end: u64,
        /// The file length.
        file_len: u64,
    },

    /// Two tensors' byte ranges overlap.
    #[error("tensor '{first}' [{first_start}, {first_end}) overlaps tensor '{second}' starting at byte offset {second_start}")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// Its absolute start.
        first_start: u64,
        /// Its absolute end.
        first_end: u64,
        /// The tensor it overlaps.
        second: String,
        /// The second tensor's absolute start.
        second_start: u64,
    },
}
