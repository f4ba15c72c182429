//! What the table holds of a chunk, as the destination store and the ledger tell it: load
//! asks before and after it moves parts, `ferry skip` before it closes a load.

use ferry_common::paths;
use ferry_ledger::{Ledger, Part};
use ferry_storage::Store;

use crate::error::{Failure, StageError};

/// Whether the table holds `target`: None if not, else whether it is part `p` (size and
/// hash). A file that goes between the look and the hash (another publisher took it back) is
/// not there.
pub async fn in_table<F: Failure>(dest: &Store, target: &str, p: &Part) -> Result<Option<bool>, StageError<F>> {
    let Some(h) = dest.head(target).await? else { return Ok(None) };
    if h.size as i64 != p.bytes {
        return Ok(Some(false));
    }
    match dest.hash(target).await {
        Ok((_, hash)) => Ok(Some(hash == p.content_hash)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The parts of `chunk` that are in the table (its bytes at its table path) while no
/// `published` row of it names them, with their table paths: moved there by a sibling's switch
/// of the chunk's version, or by an attempt of its own that died (or could not take them back)
/// before recording them. Only the store can tell the second case; `ferry skip` asks here
/// before it closes a load, as closing it would leave them in the table unnamed.
pub async fn unrecorded_in_table<F: Failure>(
    ledger: &Ledger,
    table: &str,
    dest: &Store,
    chunk: &str,
) -> Result<Vec<(Part, String)>, StageError<F>> {
    let recorded: std::collections::HashSet<String> = ledger.published_of(chunk).await?.into_iter().map(|(p, _)| p).collect();
    let mut found = Vec::new();
    for p in ledger.parts(chunk).await? {
        let target = paths::table_file(table, &p.rel_path());
        if !recorded.contains(&target) && in_table::<F>(dest, &target, &p).await? == Some(true) {
            found.push((p, target));
        }
    }
    Ok(found)
}
