//! An algorithm's step by value, for tests: [`Algorithm::update`] on a copy of a word state,
//! returning the decision and the new word (`None` when unchanged).

use hotlimit::algo::Algorithm;
use hotlimit::Decision;

/// The result of one step by value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Step<S> {
    /// The answer to the request.
    pub decision: Decision,
    /// The new state, if it changed.
    pub state: Option<S>,
}

/// `step` on every algorithm whose state is a word.
pub trait WordStep: Algorithm {
    /// Decides one request for a key in `state`.
    fn step(&self, state: Self::State, now: u64, cost: u64) -> Step<Self::State>;
}

impl<A: Algorithm> WordStep for A
where
    A::State: Copy + PartialEq,
{
    fn step(&self, state: A::State, now: u64, cost: u64) -> Step<A::State> {
        let mut new = state;
        let decision = self.update(&mut new, now, cost);
        Step {
            decision,
            state: (new != state).then_some(new),
        }
    }
}
