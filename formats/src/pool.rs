//! Byte buffers reused from chunk to chunk.
//!
//! A chunk's read buffer, its pages and its compressed pages are MiB-sized and live about as long
//! as the chunk. glibc hands blocks that size out as freshly mapped memory and unmaps them when
//! freed, so without reuse every chunk paid the kernel's page faults and zeroing again. Reusing
//! them took transform's system time from ~0.6 to ~0.45 s per GB of Avro (bench/pipeline.sh).
//! Buffers kept here stay mapped.

use std::sync::Mutex;

/// Bytes of idle buffers kept in all; chunks in flight hold their own on top of this.
const KEEP_BYTES: usize = 16 << 20;

static FREE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// An empty buffer with room for at least `capacity` bytes.
pub fn take(capacity: usize) -> Vec<u8> {
    let mut v = {
        let mut f = FREE.lock().unwrap_or_else(|e| e.into_inner());
        // The smallest that fits, and not one far bigger: a read buffer must not end up
        // holding a page.
        let fit = (0..f.len())
            .filter(|&i| f[i].capacity() >= capacity && f[i].capacity() <= capacity.max(1 << 16) * 2)
            .min_by_key(|&i| f[i].capacity());
        fit.map(|i| f.swap_remove(i)).unwrap_or_default()
    };
    v.clear();
    v.reserve(capacity);
    v
}

/// Returns a buffer for reuse (dropped if enough are kept already).
pub fn give(v: Vec<u8>) {
    if v.capacity() == 0 {
        return;
    }
    let mut f = FREE.lock().unwrap_or_else(|e| e.into_inner());
    if f.iter().map(Vec::capacity).sum::<usize>() + v.capacity() <= KEEP_BYTES {
        f.push(v);
    }
}
