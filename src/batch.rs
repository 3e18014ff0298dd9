//! Batched checks (`check_batch`, `check_n_batch` on every keyed store): the requests are
//! taken a chunk at a time, in three passes. First every key of the chunk is placed (its hash
//! and where it would live: arithmetic, no load of the table); then every key's place is
//! loaded (no write, no insert); then the chunk is decided in order. A miss to memory costs
//! far more than the work between two keys, and the CPU overlaps the misses of independent
//! keys only as far as its reorder window reaches: with the hashing out of the loads' pass,
//! a few instructions separate two loads and the window spans many keys' misses instead of a
//! few (the measurements are in `BENCHMARKS.md`, "Batches: what overlaps"). By the time a
//! decision runs its key's line is in cache. All in safe Rust: no prefetch intrinsic, only
//! loads issued early.

use crate::decision::Decision;
use crate::error::QuotaError;

/// Requests located per pass: enough independent look-ups in flight to cover a miss to
/// memory, few enough that the first key's line is still in L1 when its decision runs.
const CHUNK: usize = 32;

/// A request of a chunk: its key (a reference, or a handle as small), its cost, and what
/// `place` and `find` made of it.
type Located<Q, F> = (Q, u64, Result<F, QuotaError>);

/// Runs `requests` through a store a chunk at a time: `place` refuses a request's cost or
/// computes where its key lives without touching the table, `find` loads that place (and may
/// note what it found in `F`), `decide` decides a request from its `F`, in request order;
/// `emit` receives each answer in order. Two requests for one key in a chunk are both found
/// before either is decided; `decide` must therefore treat `F` as a hint (a key absent at
/// `find` may be present by its turn, a cell found may be dead).
#[inline(always)]
pub(crate) fn in_chunks<Q: Copy, F: Copy>(
    requests: impl IntoIterator<Item = (Q, u64)>,
    mut place: impl FnMut(Q, u64) -> Result<F, QuotaError>,
    mut find: impl FnMut(Q, &mut F),
    mut decide: impl FnMut(Q, u64, F) -> Decision,
    mut emit: impl FnMut(Result<Decision, QuotaError>),
) {
    let mut requests = requests.into_iter();
    let mut chunk: [Option<Located<Q, F>>; CHUNK] = [const { None }; CHUNK];
    loop {
        let mut len = 0;
        for (slot, (key, cost)) in chunk.iter_mut().zip(requests.by_ref()) {
            *slot = Some((key, cost, place(key, cost)));
            len += 1;
        }
        for (key, _, placed) in chunk[..len].iter_mut().flatten() {
            if let Ok(f) = placed {
                find(*key, f);
            }
        }
        for (key, cost, found) in chunk[..len].iter_mut().flat_map(Option::take) {
            emit(found.map(|f| decide(key, cost, f)));
        }
        if len < CHUNK {
            return;
        }
    }
}
