//! Source formats as units: each module owns its framing (where records begin and end; for
//! Avro the container's header, blocks and codecs) and, with the `decode` feature, its
//! decoding into Arrow in the table's column types ([`decode::Decode`]). Extract splits files
//! into chunks with these (without the feature: no Arrow); transform decodes chunks through
//! [`decode::decoder`]; the sample generator writes Avro with the same writer.
//!
//! Adding a source format: a variant of [`spec::Format`] (its name and file extensions), a
//! module here with its splitter and its [`decode::Decode`], and a branch in [`split`] and in
//! [`decode::decoder`]. The configuration (`ferry-common`) holds the plain types of [`spec`]
//! only, so copy, which reads the configuration, links no codec (features `split`, `decode`).
//!
//! Chunks end at record boundaries and hold at most `chunk_size` bytes (a single record larger
//! than that becomes a chunk of its own):
//! - JSON lines: whole lines.
//! - CSV: whole records (a quoted field may hold newlines), the header repeated in every chunk.
//! - Avro object container files: whole blocks, each chunk the original header (schema, codec,
//!   sync marker) followed by its blocks, so every chunk is a valid Avro file.

#[cfg(feature = "split")]
pub mod avro;
#[cfg(feature = "split")]
pub mod csv;
#[cfg(feature = "decode")]
pub mod decode;
#[cfg(feature = "split")]
mod framing;
#[cfg(feature = "split")]
pub mod jsonl;
pub mod pool;
pub mod spec;

#[cfg(feature = "split")]
pub use framing::{Cut, Piece, SplitError, compression_of, split};
