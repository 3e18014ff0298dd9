//! Histories, not totals (issue #49): concurrent histories recorded under real threads on
//! every in-memory store and every algorithm, each checked for linearizability against the
//! sequential model (the algorithm's own pure state machine) by a Wing–Gong search with
//! Lowe's memoization.
//!
//! Pins G1 (docs/GUARANTEES.md): decisions are linearizable per key.
//!
//! The totals tests (`tests/stress.rs`, `tests/settle.rs`, `tests/grants.rs`) show that N
//! threads get as much as one thread would; they cannot see answers that are wrong while the
//! totals are right (two admissions that both report the `remaining` of the state before
//! either, a `retry_after` from a state no order produces, a denial that returned before the
//! admission that explains it began). Here every answer of every operation (`Decision`s
//! compared exactly, grants, settles) must be that of one sequential order of the history
//! that respects real time.
//!
//! The sequential model is the algorithm's own state machine (`Algorithm::update`,
//! a partial grant, `peek`, `settle`), on a cloned state: what every store runs on the state it
//! keeps (and what `tests/settle.rs` and `tests/grants.rs` compare every store with, one
//! request at a time), so it covers every algorithm, and a state is cheap to clone where a
//! limiter is not.
//!
//! How a run works: 2–4 threads share 1–3 keys (the single cell: its one key) of one limiter
//! on a [`ManualClock`]. They run rounds; a rendezvous separates rounds, and the last thread
//! into it sets the clock for the next round, so within a round `now` is fixed and between
//! rounds time moves (none, within a rate's interval, across windows), refilling and aging
//! states. The operations: `check`, `check_n`, `peek`, a partial grant (`up_to`), and `take`
//! with its `settle` in the same round or a later one (refunds, overruns, the estimate; now
//! and then a ticket settled twice, or denied, which must change nothing); on the keyed
//! stores, sweeps race the rounds too, invisible to the model (an idle key's eviction must
//! change no answer). Each round is one history: every operation's invocation and response are stamped
//! from one shared counter (a `fetch_add` before the call and one after), which orders them
//! as real time does. Every operation of a round happens before every operation of the
//! next, so a run is linearizable if and only if each round is, from a state that some
//! linearization of the rounds before it leaves; and linearizability is local, so each key is
//! checked on its own. The checker carries, per key, every state the rounds so far can have
//! left, and checks each round from all of them.

use hotlimit::algo::{
    Algorithm, AllOf, Bias, Earrrl, Exponential, FixedWindow, Gcra, SlidingLog, SlidingWindow,
    SubWindow,
};
use hotlimit::store::{Cas, Locked};
use hotlimit::{
    CasLimiter, Clock, CompactLimiter, Decision, DirectLimiter, Limiter, Live, ManualClock,
    MutexLimiter, Policy, QuantaClock, Rate, RateLimiter, Requests,
};
use hotlimit::{QuotaError, Ticket};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Rounds (histories) per algorithm configuration per store: 24 configurations, so
/// 24 × 420 = 10,080 histories per store.
const ROUNDS_PER_CONFIG: usize = 420;
/// Rounds per run (one set of threads, one set of keys).
const ROUNDS_PER_RUN: usize = 30;
/// The most operations a history holds (threads × operations per thread).
const MAX_OPS: usize = 12;

// ---------------------------------------------------------------------------------------
// Histories

/// An operation, with what the model needs to replay it.
#[derive(Debug, Clone)]
enum Op {
    /// `check(key)`.
    Check,
    /// `check_n(key, cost)`.
    CheckN(u64),
    /// `request(key).cost(cost).peek()`: a read, which must see a linearized state too.
    Peek(u64),
    /// `request(key).cost(most).up_to()`: a partial grant.
    UpTo(u64),
    /// `request(key).cost(cost).take()`: the ticket's decision.
    Take(u64),
    /// `request(key).settle(&mut ticket, actual)` of a ticket taken at `taken_at` for
    /// `charged`, open (not denied, not settled yet) when the settle was called.
    Settle {
        taken_at: u64,
        charged: u64,
        open: bool,
        actual: u64,
    },
}

/// What an operation answered. `Decision`'s equality is exact (allowed, retry_after,
/// remaining, reset_after, the rate's bits).
#[derive(Debug, Clone, PartialEq)]
enum Out {
    Decided(Decision),
    Granted(u64, Decision),
    Settled(bool),
}

/// One completed operation: invoked at stamp `invoke`, returned at stamp `ret`.
#[derive(Debug, Clone)]
struct Event {
    thread: usize,
    key: u64,
    op: Op,
    out: Out,
    invoke: u64,
    ret: u64,
}

/// Whether two operations' intervals intersect (neither returned before the other began).
fn overlap(a: &Event, b: &Event) -> bool {
    a.invoke < b.ret && b.invoke < a.ret
}

/// Whether any two of `events` overlap.
fn any_overlap<'a>(events: impl IntoIterator<Item = &'a Event>) -> bool {
    let events: Vec<&Event> = events.into_iter().collect();
    events
        .iter()
        .enumerate()
        .any(|(i, a)| events[i + 1..].iter().any(|b| overlap(a, b)))
}

// ---------------------------------------------------------------------------------------
// The sequential model and the checker

/// A partial grant of at most `most` units as the specification has it: the most units a
/// peek admits, tried from the top (as `tests/grants.rs`'s model), then that update; 0 and
/// the decision of one unit if none. Not the limiters' bisection: the spec does not call the
/// code under test.
fn up_to<A: Algorithm>(algo: &A, state: &mut A::State, now: u64, most: u64) -> (u64, Decision) {
    let granted = (1..=most)
        .rev()
        .find(|&c| algo.peek(state, now, c).is_allowed())
        .unwrap_or(0);
    (granted, algo.update(state, now, granted.max(1)))
}

/// The sequential specification: `op` applied to `state` at `now` by the algorithm's own
/// state machine, as a limiter running alone would (the stores add only where the state is
/// kept, so this is what every store must be equivalent to).
fn apply<A: Algorithm>(algo: &A, state: &mut A::State, now: u64, op: &Op) -> Out {
    match *op {
        Op::Check => Out::Decided(algo.update(state, now, 1)),
        Op::CheckN(cost) => Out::Decided(algo.update(state, now, cost)),
        Op::Take(cost) => Out::Decided(algo.take(state, now, cost)),
        Op::Peek(cost) => Out::Decided(algo.peek(state, now, cost)),
        // The limiters cap a grant at the capacity before the algorithm sees it.
        Op::UpTo(most) => {
            let (granted, d) = up_to(algo, state, now, most.min(algo.capacity()));
            Out::Granted(granted, d)
        }
        Op::Settle {
            taken_at,
            charged,
            open,
            actual,
        } => {
            // A closed ticket (denied, or settled before) changes nothing; neither does an
            // actual cost equal to the charge.
            if open && actual != charged {
                algo.settle(state, now, taken_at, charged, actual);
            }
            Out::Settled(open)
        }
    }
}

/// A state's identity for memoization and deduplication: its `Debug` form, exact for every
/// state of the crate (floats are kept as their bits, logs and buckets print every entry).
fn print<S: std::fmt::Debug>(state: &S) -> String {
    format!("{state:?}")
}

/// Wing & Gong's search, with Lowe's memoization of (operations linearized, state) pairs:
/// every state one key can be in after `events` (all on that key, all at `now`), linearized
/// in an order that respects real time and where each operation answers what the model
/// answers, from any of `starts`. Empty: the history is not linearizable.
///
/// Exhaustive rather than stopping at the first order, because the next round must start
/// from whatever state the store really reached, which may be another order's.
fn linearize<A: Algorithm>(
    algo: &A,
    now: u64,
    events: &[&Event],
    starts: &[A::State],
) -> Vec<A::State> {
    struct Search<'a, A: Algorithm> {
        algo: &'a A,
        now: u64,
        events: &'a [&'a Event],
        full: u32,
        seen: HashSet<(u32, String)>,
        ends: BTreeMap<String, A::State>,
    }

    impl<A: Algorithm> Search<'_, A> {
        fn dfs(&mut self, done: u32, state: A::State) {
            if done == self.full {
                self.ends.entry(print(&state)).or_insert(state);
                return;
            }
            if !self.seen.insert((done, print(&state))) {
                return;
            }
            let pending = || (0..self.events.len()).filter(move |i| done & (1 << i) == 0);
            // An operation may go next only if no pending one returned before it was invoked.
            let first_return = pending().map(|i| self.events[i].ret).min().unwrap();
            let candidates: Vec<usize> = pending()
                .filter(|&i| self.events[i].invoke < first_return)
                .collect();
            for i in candidates {
                let mut next = state.clone();
                let e = self.events[i];
                if apply(self.algo, &mut next, self.now, &e.op) == e.out {
                    self.dfs(done | 1 << i, next);
                }
            }
        }
    }

    assert!(events.len() < 32, "a history too long for the search");
    let mut search = Search {
        algo,
        now,
        events,
        full: (1u32 << events.len()) - 1,
        seen: HashSet::new(),
        ends: BTreeMap::new(),
    };
    for start in starts {
        search.dfs(0, start.clone());
    }
    search.ends.into_values().collect()
}

/// The states each key may be in, carried from round to round.
struct Model<'a, A: Algorithm> {
    algo: &'a A,
    states: HashMap<u64, Vec<A::State>>,
}

impl<'a, A: Algorithm> Model<'a, A> {
    fn new(algo: &'a A) -> Self {
        Model {
            algo,
            states: HashMap::new(),
        }
    }

    /// Checks one round (every event at `now`), key by key; on success keeps, per key, every
    /// state the round may have left. On failure, the key whose history no order explains.
    fn round(&mut self, now: u64, events: &[Event]) -> Result<(), u64> {
        let mut by_key: BTreeMap<u64, Vec<&Event>> = BTreeMap::new();
        for e in events {
            by_key.entry(e.key).or_default().push(e);
        }
        for (key, events) in by_key {
            let algo = self.algo;
            let starts = self.states.entry(key).or_insert_with(|| vec![algo.fresh()]);
            let ends = linearize(algo, now, &events, starts);
            if ends.is_empty() {
                return Err(key);
            }
            *starts = ends;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// The stores

/// One limiter under test, its keys as `u64` (the single cell maps every key to `()`).
trait Target<A>: Sync {
    fn check(&self, key: u64) -> Decision;
    fn check_n(&self, key: u64, cost: u64) -> Decision;
    fn peek(&self, key: u64, cost: u64) -> Decision;
    fn up_to(&self, key: u64, most: u64) -> (u64, Decision);
    fn take(&self, key: u64, cost: u64) -> Ticket;
    fn settle(&self, key: u64, ticket: &mut Ticket, actual: u64) -> bool;
    /// A sweep; the idle keys it evicted.
    fn sweep(&self) -> u64;
    /// Whether it takes and settles tickets (every limiter; not the racy store below).
    fn tickets(&self) -> bool {
        true
    }
}

trait KeyOf: 'static {
    fn of(key: u64) -> Self;
}

impl KeyOf for u64 {
    fn of(key: u64) -> Self {
        key
    }
}

impl KeyOf for () {
    fn of(_: u64) -> Self {}
}

/// A limiter with keys of type `Q`, through its public traits: `check` and `check_n` are the
/// limiters' own (`RateLimiter`, the hot path), the rest `Request`s.
struct On<L, Q>(L, PhantomData<fn() -> Q>);

impl<Q: KeyOf, S> Target<S::Algo> for On<Limiter<S>, Q>
where
    S: hotlimit::store::Keys<Q>,
    Limiter<S>: Requests<Q, Algo = S::Algo, Error = QuotaError>,
{
    fn check(&self, key: u64) -> Decision {
        RateLimiter::check(&self.0, &Q::of(key))
    }
    fn check_n(&self, key: u64, cost: u64) -> Decision {
        RateLimiter::check_n(&self.0, &Q::of(key), cost).unwrap()
    }
    fn peek(&self, key: u64, cost: u64) -> Decision {
        self.0.request(&Q::of(key)).cost(cost).peek().unwrap()
    }
    fn up_to(&self, key: u64, most: u64) -> (u64, Decision) {
        self.0.request(&Q::of(key)).cost(most).up_to().unwrap()
    }
    fn take(&self, key: u64, cost: u64) -> Ticket {
        self.0.request(&Q::of(key)).cost(cost).take().unwrap()
    }
    fn settle(&self, key: u64, ticket: &mut Ticket, actual: u64) -> bool {
        self.0.request(&Q::of(key)).settle(ticket, actual).unwrap()
    }
    fn sweep(&self) -> u64 {
        self.0.sweep().evicted_idle
    }
}

fn on<Q, S>(limiter: Limiter<S>) -> Box<dyn Target<S::Algo>>
where
    Q: KeyOf,
    S: hotlimit::store::Keys<Q>,
    Limiter<S>: Requests<Q, Algo = S::Algo, Error = QuotaError>,
{
    Box::new(On(limiter, PhantomData))
}

/// Store `name` of `algo` on `clock`. The keyed stores sweep with no grace: on a manual clock
/// moved only between rounds, a key idle at the round's `now` is idle for every request of
/// it, so a sweep racing the round may evict it and must change no answer.
fn store<A: Algorithm + Clone>(name: &str, algo: &A, clock: &ManualClock) -> Box<dyn Target<A>> {
    let (a, c, no_grace) = (algo.clone(), clock.clone(), Duration::ZERO);
    match name {
        "cas" => on::<u64, _>(
            CasLimiter::<u64, A>::builder(a)
                .clock(c)
                .sweep_grace(no_grace)
                .build()
                .unwrap(),
        ),
        "mutex" => on::<u64, _>(
            MutexLimiter::<u64, A>::builder(a)
                .clock(c)
                .sweep_grace(no_grace)
                .build()
                .unwrap(),
        ),
        "compact" => on::<u64, _>(
            CompactLimiter::<u64, A, QuantaClock, Cas>::builder(a)
                .max_keys(256)
                .clock(c)
                .sweep_grace(no_grace)
                .build()
                .unwrap(),
        ),
        "compact-mutex" => on::<u64, _>(
            CompactLimiter::<u64, A, QuantaClock, Locked>::builder(a)
                .max_keys(256)
                .clock(c)
                .sweep_grace(no_grace)
                .build()
                .unwrap(),
        ),
        "direct" => on::<(), _>(DirectLimiter::<A, _>::with_clock(a, c)),
        "direct-mutex" => on::<(), _>(DirectLimiter::<A, _, Locked>::with_clock(a, c)),
        _ => unreachable!("no store {name}"),
    }
}

// ---------------------------------------------------------------------------------------
// Recording

/// A spinning rendezvous: a parking `Barrier` wakes
/// its threads one by one, often after the first has run its whole round, so histories
/// overlap less (measured on 2 cores, same load: `std::sync::Barrier` twice a round, 31–37%
/// of histories overlapping on one key; this gate, 68–92%). It yields while it waits, so 4
/// threads on 2 cores still make progress.
struct Gate {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    left: AtomicUsize,
}

impl Gate {
    fn new(threads: usize) -> Self {
        Gate {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            left: AtomicUsize::new(0),
        }
    }

    /// Waits for every thread; the last to arrive runs `last` before releasing the others.
    /// Then waits again for every thread to have left: the last to arrive would otherwise
    /// start its operations at once, often done before a thread that spun itself to sleep
    /// (yielded) is back on a core.
    fn wait(&self, last: impl FnOnce()) {
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            last();
            self.generation.store(generation + 1, Ordering::Release);
        } else {
            spin_until(|| self.generation.load(Ordering::Acquire) != generation);
        }
        // `left` only grows: this generation's start line is at (generation + 1) × threads.
        let line = (generation + 1) * self.threads;
        self.left.fetch_add(1, Ordering::AcqRel);
        spin_until(|| self.left.load(Ordering::Acquire) >= line);
    }
}

/// Spins until `done`, yielding after a while so that more threads than cores make progress.
fn spin_until(done: impl Fn() -> bool) {
    let mut spins = 0u32;
    while !done() {
        if spins < 200 {
            std::hint::spin_loop();
            spins += 1;
        } else {
            std::thread::yield_now();
        }
    }
}

/// What a set of runs on one store showed.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    histories: u64,
    /// Histories where at least two operations overlap.
    overlapping: u64,
    /// Histories where two operations on the same key overlap.
    same_key: u64,
    ops: u64,
    /// Idle keys evicted by sweeps racing the rounds.
    evicted: u64,
    /// Denials (checks, takes, grants of nothing), partial grants (fewer than asked, more than
    /// none) and settles that moved a state: what makes the histories more than admissions.
    denied: u64,
    partial: u64,
    settled: u64,
}

impl Tally {
    fn add(&mut self, other: Tally) {
        self.histories += other.histories;
        self.overlapping += other.overlapping;
        self.same_key += other.same_key;
        self.ops += other.ops;
        self.evicted += other.evicted;
        self.denied += other.denied;
        self.partial += other.partial;
        self.settled += other.settled;
    }

    fn count(&mut self, e: &Event, capacity: u64) {
        match (&e.op, &e.out) {
            (Op::Peek(_), _) => {}
            (Op::UpTo(most), Out::Granted(granted, d)) => {
                self.denied += d.is_denied() as u64;
                self.partial += (*granted > 0 && *granted < *most.min(&capacity)) as u64;
            }
            (
                Op::Settle {
                    charged, actual, ..
                },
                Out::Settled(open),
            ) => {
                self.settled += (*open && actual != charged) as u64;
            }
            (_, Out::Decided(d)) => self.denied += d.is_denied() as u64,
            _ => {}
        }
    }
}

/// A round's clock step: none, a few units' refill (GCRA's interval is 10 ms, the windows
/// 100 ms long), across a window, or long enough for most states to be idle (so sweeps
/// evict). A round's dozen operations ask for more than a burst: about half the answers are
/// denials, at the limit's edge where the races matter.
fn step(rng: &mut fastrand::Rng) -> u64 {
    const MS: u64 = 1_000_000;
    match rng.u32(0..20) {
        0..=3 => 0,
        4..=11 => rng.u64(1..=50 * MS),
        12..=18 => rng.u64(50 * MS..=200 * MS),
        _ => rng.u64(1_000 * MS..=3_000 * MS),
    }
}

/// One thread's operations of one round, recorded.
#[allow(clippy::too_many_arguments)]
fn play<A: Algorithm>(
    target: &dyn Target<A>,
    capacity: u64,
    keys: &[u64],
    keyed: bool,
    thread: usize,
    ops: usize,
    rng: &mut fastrand::Rng,
    tickets: &mut Vec<(u64, Ticket)>,
    stamp: &AtomicU64,
    out: &mut Vec<Event>,
    evicted: &mut u64,
) {
    let small = capacity.min(3);
    for _ in 0..ops {
        let key = keys[rng.usize(0..keys.len())];
        // A sweep now and then (keyed stores): no answer, no effect on the model.
        if keyed && rng.u32(0..16) == 0 {
            *evicted += target.sweep();
            continue;
        }
        let kind = rng.u32(0..if target.tickets() { 12 } else { 7 });
        // Settle a pending ticket (on the key it was taken for), or a settled one again.
        if kind >= 9 && !tickets.is_empty() {
            let i = rng.usize(0..tickets.len());
            let (key, ticket) = &mut tickets[i];
            let key = *key;
            let actual = rng.u64(0..=6);
            let op = Op::Settle {
                taken_at: ticket.taken_at(),
                charged: ticket.charged(),
                open: ticket.is_open(),
                actual,
            };
            let invoke = stamp.fetch_add(1, Ordering::SeqCst);
            let settled = target.settle(key, ticket, actual);
            let ret = stamp.fetch_add(1, Ordering::SeqCst);
            // Keep a settled ticket now and then, to settle it again (which must do nothing).
            if !ticket.is_open() && rng.bool() {
                drop(tickets.swap_remove(i));
            }
            out.push(Event {
                thread,
                key,
                op,
                out: Out::Settled(settled),
                invoke,
                ret,
            });
            continue;
        }
        let op = match kind {
            0..=1 => Op::Check,
            2..=3 => Op::CheckN(rng.u64(1..=small)),
            4 => Op::Peek(rng.u64(1..=small)),
            5..=6 => Op::UpTo(rng.u64(1..=capacity.min(6) + 2)),
            _ => Op::Take(rng.u64(1..=small)),
        };
        let invoke = stamp.fetch_add(1, Ordering::SeqCst);
        let result = match op {
            Op::Check => Out::Decided(target.check(key)),
            Op::CheckN(cost) => Out::Decided(target.check_n(key, cost)),
            Op::Peek(cost) => Out::Decided(target.peek(key, cost)),
            Op::UpTo(most) => {
                let (granted, d) = target.up_to(key, most);
                Out::Granted(granted, d)
            }
            Op::Take(cost) => {
                let ticket = target.take(key, cost);
                let d = ticket.decision();
                assert_eq!(ticket.is_open(), d.is_allowed(), "a take's ticket");
                tickets.push((key, ticket));
                Out::Decided(d)
            }
            Op::Settle { .. } => unreachable!(),
        };
        let ret = stamp.fetch_add(1, Ordering::SeqCst);
        out.push(Event {
            thread,
            key,
            op,
            out: result,
            invoke,
            ret,
        });
    }
}

/// One run: threads, keys and clock steps from `seed`; every round recorded, then checked.
fn run<A: Algorithm>(
    label: &str,
    algo: &A,
    target: &dyn Target<A>,
    keyed: bool,
    clock: &ManualClock,
    key_base: u64,
    seed: u64,
) -> Result<Tally, String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let threads = rng.usize(2..=4);
    let per_thread = MAX_OPS / threads;
    let keys: Vec<u64> = if keyed {
        (0..rng.u64(1..=3)).map(|k| key_base + k).collect()
    } else {
        vec![0]
    };
    let mut times = Vec::with_capacity(ROUNDS_PER_RUN);
    let mut now = clock.now() + step(&mut rng);
    for _ in 0..ROUNDS_PER_RUN {
        times.push(now);
        now += step(&mut rng);
    }
    let capacity = algo.capacity();
    let (gate, stamp) = (Gate::new(threads), AtomicU64::new(0));
    let (times, keys) = (&times, &keys);
    let recorded: Vec<(Vec<Vec<Event>>, u64)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                let (gate, stamp) = (&gate, &stamp);
                let mut rng = fastrand::Rng::with_seed(seed ^ ((thread as u64 + 1) << 32));
                s.spawn(move || {
                    let mut tickets = Vec::new();
                    let mut evicted = 0;
                    let rounds: Vec<Vec<Event>> = (0..ROUNDS_PER_RUN)
                        .map(|r| {
                            gate.wait(|| clock.set(Duration::from_nanos(times[r])));
                            let mut out = Vec::with_capacity(per_thread);
                            play(
                                target,
                                capacity,
                                keys,
                                keyed,
                                thread,
                                per_thread,
                                &mut rng,
                                &mut tickets,
                                stamp,
                                &mut out,
                                &mut evicted,
                            );
                            out
                        })
                        .collect();
                    (rounds, evicted)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // The recording itself: each thread's operations one after another.
    for (rounds, _) in &recorded {
        let mine: Vec<&Event> = rounds.iter().flatten().collect();
        assert!(mine.windows(2).all(|w| w[0].ret < w[1].invoke));
        assert!(mine.iter().all(|e| e.thread == mine[0].thread));
    }
    let mut tally = Tally::default();
    let mut model = Model::new(algo);
    for (r, &now) in times.iter().enumerate() {
        let events: Vec<Event> = recorded
            .iter()
            .flat_map(|(rounds, _)| rounds[r].iter().cloned())
            .collect();
        if let Err(key) = model.round(now, &events) {
            let history: Vec<&Event> = events.iter().filter(|e| e.key == key).collect();
            return Err(format!(
                "{label}: round {r} (seed {seed}, now {now}) is not linearizable on key {key} \
                 from any of {:?}:\n{history:#?}",
                model.states.get(&key)
            ));
        }
        tally.histories += 1;
        tally.ops += events.len() as u64;
        for e in &events {
            tally.count(e, capacity);
        }
        tally.overlapping += any_overlap(&events) as u64;
        let same_key = keys
            .iter()
            .any(|&k| any_overlap(events.iter().filter(|e| e.key == k)));
        tally.same_key += same_key as u64;
    }
    tally.evicted = recorded.iter().map(|(_, evicted)| evicted).sum();
    Ok(tally)
}

/// Runs `ROUNDS_PER_CONFIG` rounds of `algo` on store `store_name`, a limiter per run's keys.
fn on_store<A: Algorithm + Clone>(store_name: &str, config: &str, algo: A, seed: u64) -> Tally {
    let clock = ManualClock::default();
    let keyed = !store_name.starts_with("direct");
    // One keyed limiter for every run, each run on keys of its own (sweeps racing a run may
    // evict an earlier run's keys); the single cell has one key, so a limiter per run.
    let shared = keyed.then(|| store(store_name, &algo, &clock));
    let mut tally = Tally::default();
    let runs = ROUNDS_PER_CONFIG.div_ceil(ROUNDS_PER_RUN);
    for i in 0..runs {
        let own;
        let target: &dyn Target<A> = match &shared {
            Some(t) => t.as_ref(),
            None => {
                own = store(store_name, &algo, &clock);
                own.as_ref()
            }
        };
        let label = format!("{store_name}/{config}");
        let seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64;
        match run(&label, &algo, target, keyed, &clock, 3 * i as u64, seed) {
            Ok(t) => tally.add(t),
            Err(history) => panic!("{history}"),
        }
    }
    tally
}

/// A test over one algorithm configuration, generic over the algorithm (which a closure
/// cannot be).
trait OnAlgorithm {
    fn run<A: Algorithm + Clone>(&mut self, name: &str, algo: A);
}

/// Every algorithm of the crate in `policy` (both biases of each window), two `AllOf` pairs
/// and a `Live` GCRA: 12 configurations. Small limits, so a round's dozen operations meet
/// denials, partial grants and refills.
fn on_every_algorithm(policy: Policy, test: &mut impl OnAlgorithm) {
    let window = Duration::from_millis(100);
    let gcra = "100/s burst 4".parse::<Gcra>().unwrap().with_policy(policy);
    test.run("gcra", gcra);
    let earrrl = Earrrl::new(
        Duration::from_millis(200),
        Rate::new(30.0, Duration::from_secs(1)).unwrap(),
    )
    .unwrap()
    .with_policy(policy);
    test.run("earrrl", earrrl);
    let exp = Exponential::new(6.0, window).unwrap().with_policy(policy);
    test.run("exponential", exp);
    let fixed = FixedWindow::new(6, window).unwrap().with_policy(policy);
    test.run("fixed-window", fixed);
    for bias in [Bias::Strict, Bias::Lenient] {
        let sliding = SlidingWindow::new(6, window)
            .unwrap()
            .with_policy(policy)
            .with_bias(bias);
        test.run(&format!("sliding-window/{bias:?}"), sliding);
    }
    let log = SlidingLog::new(6, window).unwrap().with_policy(policy);
    test.run("sliding-log", log);
    for bias in [Bias::Strict, Bias::Lenient] {
        let sub = SubWindow::new(6, window, 5)
            .unwrap()
            .with_policy(policy)
            .with_bias(bias);
        test.run(&format!("sub-window/{bias:?}"), sub);
    }
    let per_100ms = "10/s burst 5".parse::<Gcra>().unwrap().with_policy(policy);
    test.run("all-of/gcra+earrrl", AllOf::new(per_100ms, earrrl));
    test.run("all-of/gcra+sliding-log", AllOf::new(gcra, log));
    test.run("live/gcra", Live::new(gcra));
}

/// [`on_store`] for every configuration, tallied.
struct OnStore<'a> {
    store: &'a str,
    policy: Policy,
    seed: u64,
    tally: Tally,
}

impl OnAlgorithm for OnStore<'_> {
    fn run<A: Algorithm + Clone>(&mut self, name: &str, algo: A) {
        let config = format!("{name}/{}", self.policy);
        self.seed += 1;
        self.tally
            .add(on_store(self.store, &config, algo, self.seed));
    }
}

/// The store tests take turns: a test's threads overlap only if they have the cores to
/// themselves (side by side on 2 cores, two tests' histories overlapped on one key in 12–18%
/// of rounds; one at a time, in 58–92%).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Every algorithm in both policies on `store`: at least 10,000 histories, each
/// linearizable, and enough of them concurrent on one key to mean something.
fn store_is_linearizable(store: &str) {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let started = std::time::Instant::now();
    let mut test = OnStore {
        store,
        policy: Policy::Leaky,
        seed: 0,
        tally: Tally::default(),
    };
    for policy in [Policy::Leaky, Policy::Strict] {
        test.policy = policy;
        on_every_algorithm(policy, &mut test);
    }
    let t = test.tally;
    let pct = |n: u64| 100.0 * n as f64 / t.histories as f64;
    println!(
        "{store}: {} histories linearizable ({} operations: {} denials, {} partial grants, {} \
         settles) in {:.1?}; {} ({:.1}%) with two overlapping operations, {} ({:.1}%) on one \
         key; {} idle keys evicted by racing sweeps",
        t.histories,
        t.ops,
        t.denied,
        t.partial,
        t.settled,
        started.elapsed(),
        t.overlapping,
        pct(t.overlapping),
        t.same_key,
        pct(t.same_key),
        t.evicted,
    );
    assert!(
        t.denied > 0 && t.partial > 0 && t.settled > 0,
        "{store}: {t:?}"
    );
    assert!(t.histories >= 10_000, "{store}: {} histories", t.histories);
    // Histories that never overlap would check only sequential behaviour. Measured on 2
    // cores: 58–92% of histories overlap on one key on an idle machine, 25–45% beside
    // parallel builds (load 4–7); 10% leaves room for a loaded CI host, and a recording that
    // serialized the threads (0%) still fails.
    assert!(
        t.same_key * 10 > t.histories,
        "{store}: only {} of {} histories overlap on one key",
        t.same_key,
        t.histories
    );
}

/// The papaya store, lock-free cells. Pins the per-key linearizability guarantee
/// (docs/GUARANTEES.md).
// Pins G1.
#[test]
fn cas_store_is_linearizable() {
    store_is_linearizable("cas");
}

/// The papaya store, each state behind a mutex. Pins the per-key linearizability guarantee
/// (docs/GUARANTEES.md).
// Pins G1.
#[test]
fn mutex_store_is_linearizable() {
    store_is_linearizable("mutex");
}

/// The compact table, lock-free pair slots (lock slots for 128-bit and heap states). Pins the
/// per-key linearizability guarantee (docs/GUARANTEES.md).
// Pins G1.
#[test]
fn compact_store_is_linearizable() {
    store_is_linearizable("compact");
}

/// The compact table, every slot locked. Pins the per-key linearizability guarantee
/// (docs/GUARANTEES.md).
// Pins G1.
#[test]
fn compact_mutex_store_is_linearizable() {
    store_is_linearizable("compact-mutex");
}

/// The single cell. Pins G1 (docs/GUARANTEES.md): decisions are linearizable per key.
// Pins G1.
#[test]
fn direct_store_is_linearizable() {
    store_is_linearizable("direct");
}

/// The single cell behind a mutex. Pins the per-key linearizability guarantee
/// (docs/GUARANTEES.md).
// Pins G1.
#[test]
fn direct_mutex_store_is_linearizable() {
    store_is_linearizable("direct-mutex");
}

// ---------------------------------------------------------------------------------------
// The checker can fail

/// A store with the bug linearizability rules out: it reads a key's state, decides, and
/// writes the state back in two steps, so requests racing in between decide on the same
/// state and all but one update are lost. Checks, grants and peeks only (tickets are the
/// limiters' to make).
struct Racy<A: Algorithm> {
    algo: A,
    clock: ManualClock,
    states: Mutex<HashMap<u64, A::State>>,
}

impl<A: Algorithm> Racy<A> {
    fn read(&self, key: u64) -> A::State {
        let states = self.states.lock().unwrap();
        states
            .get(&key)
            .cloned()
            .unwrap_or_else(|| self.algo.fresh())
    }

    fn update<T>(&self, key: u64, f: impl FnOnce(&A, &mut A::State, u64) -> T) -> T {
        let mut state = self.read(key);
        let out = f(&self.algo, &mut state, self.clock.now());
        // The window another request reads the same state in.
        std::thread::yield_now();
        self.states.lock().unwrap().insert(key, state);
        out
    }
}

impl<A: Algorithm> Target<A> for Racy<A> {
    fn check(&self, key: u64) -> Decision {
        self.update(key, |a, s, now| a.update(s, now, 1))
    }
    fn check_n(&self, key: u64, cost: u64) -> Decision {
        self.update(key, |a, s, now| a.update(s, now, cost))
    }
    fn peek(&self, key: u64, cost: u64) -> Decision {
        self.algo.peek(&self.read(key), self.clock.now(), cost)
    }
    fn up_to(&self, key: u64, most: u64) -> (u64, Decision) {
        self.update(key, |a, s, now| up_to(a, s, now, most.min(a.capacity())))
    }
    fn take(&self, _: u64, _: u64) -> Ticket {
        unreachable!("the racy store takes no tickets")
    }
    fn settle(&self, _: u64, _: &mut Ticket, _: u64) -> bool {
        unreachable!("the racy store takes no tickets")
    }
    fn sweep(&self) -> u64 {
        0
    }
    fn tickets(&self) -> bool {
        false
    }
}

/// The whole pipeline can fail, not only the checker: the racy store's lost updates, recorded
/// by the same threads and rounds as the stores under test, are caught (two admissions
/// that each saw the other's budget). Pins the per-key linearizability guarantee
/// (docs/GUARANTEES.md).
#[test]
fn a_store_that_loses_updates_is_caught() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let gcra: Gcra = "100/s burst 4".parse().unwrap();
    let clock = ManualClock::default();
    let racy = Racy {
        algo: gcra,
        clock: clock.clone(),
        states: Mutex::default(),
    };
    let caught = (0..200u64).find_map(|i| {
        let run = run("racy/gcra", &gcra, &racy, true, &clock, 3 * i, i);
        run.err().map(|history| (i, history))
    });
    let (runs, history) = caught.expect("200 runs of a store that loses updates passed");
    println!(
        "racy store caught in run {runs}: {}",
        history.lines().next().unwrap()
    );
    assert!(history.contains("is not linearizable"), "{history}");
}

/// A hand-built event on key 0.
fn event(op: Op, out: Out, invoke: u64, ret: u64) -> Event {
    Event {
        thread: invoke as usize,
        key: 0,
        op,
        out,
        invoke,
        ret,
    }
}

/// The checker rejects what no sequential order explains, and takes real time into account
/// both ways: a burst of 1 admitting two requests, and a denial that returned before the only
/// admission began (sequentially fine the other way round, so only real time rules it out),
/// are rejected; the same denial overlapping the admission is accepted. Pins the per-key
/// linearizability guarantee (docs/GUARANTEES.md): without this, a checker that accepted
/// everything would pass every test above.
// Pins G1.
#[test]
fn the_checker_rejects_histories_no_order_explains() {
    let gcra: Gcra = "10/s burst 1".parse().unwrap();
    let now = 1_000_000_000;
    let (allowed, denied) = {
        let mut s = gcra.fresh();
        (gcra.update(&mut s, now, 1), gcra.update(&mut s, now, 1))
    };
    assert!(allowed.is_allowed() && denied.is_denied());
    let check = |out: Decision, invoke, ret| event(Op::Check, Out::Decided(out), invoke, ret);
    let verdict = |events: &[Event]| Model::new(&gcra).round(now, events);

    // Two admissions with a burst of 1: overlapping or not, no order explains them.
    assert_eq!(
        verdict(&[check(allowed, 0, 1), check(allowed, 2, 3)]),
        Err(0)
    );
    assert_eq!(
        verdict(&[check(allowed, 0, 2), check(allowed, 1, 3)]),
        Err(0)
    );
    // A denial that returned before the admission was invoked: only the order admission,
    // denial explains the answers, and real time forbids it.
    assert_eq!(
        verdict(&[check(denied, 0, 1), check(allowed, 2, 3)]),
        Err(0)
    );
    // The same two overlapping: linearizable (the admission first).
    assert_eq!(
        verdict(&[check(denied, 0, 3), check(allowed, 1, 2)]),
        Ok(())
    );
    // A partial grant of 1 with nothing left to grant, after a grant that took the burst.
    let (took, _) = up_to(&gcra, &mut gcra.fresh(), now, 1);
    assert_eq!(took, 1);
    let grant =
        |n, out: Decision, invoke, ret| event(Op::UpTo(1), Out::Granted(n, out), invoke, ret);
    assert_eq!(
        verdict(&[grant(1, allowed, 0, 1), grant(1, allowed, 2, 3)]),
        Err(0)
    );
    // A wrong field is enough: an admission with a `remaining` no state gives.
    let mut other = gcra.fresh();
    let wrong = "10/s burst 3"
        .parse::<Gcra>()
        .unwrap()
        .update(&mut other, now, 1);
    assert!(wrong.is_allowed() && wrong != allowed);
    assert_eq!(verdict(&[check(wrong, 0, 1)]), Err(0));
}

/// A refund lands where the model puts it: a take of 1 settled with 0 gives the unit back, so
/// a later admission is explained only if the settle comes first; with the settle after it
/// in real time, the checker must reject.
// Pins G1.
#[test]
fn the_checker_orders_settles_by_real_time() {
    let gcra: Gcra = "10/s burst 1".parse().unwrap();
    let now = 1_000_000_000;
    let mut s = gcra.fresh();
    let taken = gcra.update(&mut s, now, 1);
    let refund = Op::Settle {
        taken_at: now,
        charged: 1,
        open: true,
        actual: 0,
    };
    gcra.settle(&mut s, now, now, 1, 0);
    let again = gcra.update(&mut s, now, 1);
    assert!(taken.is_allowed() && again.is_allowed());
    let history = |settle_at: (u64, u64), check_at: (u64, u64)| {
        vec![
            event(Op::Take(1), Out::Decided(taken), 0, 1),
            event(refund.clone(), Out::Settled(true), settle_at.0, settle_at.1),
            event(Op::Check, Out::Decided(again), check_at.0, check_at.1),
        ]
    };
    let verdict = |events: &[Event]| Model::new(&gcra).round(now, events);
    assert_eq!(verdict(&history((2, 3), (4, 5))), Ok(()));
    assert_eq!(verdict(&history((2, 5), (3, 4))), Ok(()));
    assert_eq!(verdict(&history((4, 5), (2, 3))), Err(0));
}
