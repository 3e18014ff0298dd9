//! Batched checks (`check_batch`, `check_n_batch` on every keyed store): the requests are
//! taken a chunk at a time; first every key of the chunk is located (no write, no insert),
//! then the chunk is decided in order. Locating is a chain of dependent loads per key (hash,
//! table slot, entry); with the chunk's look-ups back to back, the CPU overlaps the cache
//! misses of independent keys instead of paying them one after another, and by the time a
//! decision runs its key's line is in cache. All in safe Rust: no prefetch intrinsic, only
//! loads issued early.

use crate::decision::Decision;
use crate::error::CostError;

/// Requests located per pass: enough independent look-ups in flight to cover a miss to
/// memory, few enough that the first key's line is still in L1 when its decision runs.
const CHUNK: usize = 32;

/// A request of a chunk: its key, its cost, and what `find` made of it.
type Located<'k, Q, F> = (&'k Q, u64, Result<F, CostError>);

/// Runs `requests` through a store a chunk at a time: `find` locates a key (or refuses its
/// cost) without writing anything, `decide` decides it from what `find` returned, in request
/// order; `emit` receives each answer in order. Two requests for one key in a chunk are both
/// located before either is decided; `decide` must therefore treat what `find` returned as a
/// hint (a key absent at `find` may be present by its turn, a cell found may be dead).
#[inline(always)]
pub(crate) fn in_chunks<'k, Q: ?Sized + 'k, F: Copy>(
    requests: impl IntoIterator<Item = (&'k Q, u64)>,
    mut find: impl FnMut(&'k Q, u64) -> Result<F, CostError>,
    mut decide: impl FnMut(&'k Q, u64, F) -> Decision,
    mut emit: impl FnMut(Result<Decision, CostError>),
) {
    let mut requests = requests.into_iter();
    let mut chunk: [Option<Located<'k, Q, F>>; CHUNK] = [None; CHUNK];
    loop {
        let mut len = 0;
        for (slot, (key, cost)) in chunk.iter_mut().zip(requests.by_ref()) {
            *slot = Some((key, cost, find(key, cost)));
            len += 1;
        }
        for (key, cost, found) in chunk[..len].iter().flatten() {
            emit(found.map(|f| decide(key, *cost, f)));
        }
        if len < CHUNK {
            return;
        }
    }
}
