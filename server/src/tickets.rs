//! Tickets as capabilities. A take's ticket is a token the server signs: what it charged
//! (each part's rule, version and key, and the library's [`Ticket`]), when it was issued and
//! when it expires, and 128 random bits, under HMAC-SHA256 with the server's secret. Nothing
//! is kept per open ticket, so no client can fill a table; no client can settle a ticket it
//! was not given (the bits cannot be guessed) or change what one charged (the MAC); a ticket
//! settles once: a settled one's nonce is remembered until it expires (and Redis marks each
//! part's settle, across replicas). Replicas given one `--ticket-secret` settle each other's
//! tickets on the Redis backend, whose marks make a settle once across them; on the others a
//! ticket names the process that issued it (128 random bits of its own), and only that one
//! settles it, since its settle-once memory is that process's alone.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use hotlimit::Ticket;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// One descriptor's charge in a ticket.
#[derive(Debug, Serialize, Deserialize)]
pub struct Part {
    /// The rule's id (its place in the configuration).
    pub rule: String,
    /// The rule's version: a hash of its fingerprint (a changed rule settles nothing).
    pub version: u64,
    /// The descriptor's key (`<domain>|<key>=<value>...`), as the rule matched it.
    pub key: String,
    /// The library's ticket.
    pub ticket: Ticket,
}

/// What a token says.
#[derive(Debug, Serialize, Deserialize)]
pub struct Claims {
    /// 128 random bits, hex: the ticket's identity for settle-once.
    pub nonce: String,
    /// The issuing process's 128 random bits: where settles are remembered per process, only
    /// the issuer settles the ticket.
    pub issuer: u128,
    /// Issued, ms since the Unix epoch.
    pub issued: u64,
    /// Expires, ms since the Unix epoch.
    pub expires: u64,
    /// The charges.
    pub parts: Vec<Part>,
}

/// Why no token was issued.
#[derive(Debug)]
pub enum NotIssued {
    /// No randomness for its nonce, or it could not be written.
    Io(std::io::Error),
    /// It would be `len` bytes, over the bound: its parts, handed back to be given back.
    TooLarge {
        /// The token's length, in bytes.
        len: usize,
        /// The charges it would have carried.
        parts: Vec<Part>,
    },
}

/// Why a token settles nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// Not a token of this server (malformed, or its MAC does not verify), expired, or
    /// already settled: one answer for all, so a guess learns nothing.
    Unknown,
}

/// How many settled tickets' nonces are remembered at once by default: 48 bytes each (32 by
/// expiry, 16 in the set) and their tables' slack, 50 to 100 MB in all.
pub const DEFAULT_MAX_SETTLED: usize = 1_000_000;

/// The server's tickets: its MAC key, their lifetime, the nonces of settled ones.
pub struct Tickets {
    key: [u8; 32],
    ttl: Duration,
    settled: Mutex<Settled>,
    /// This process's 128 random bits, in every ticket it issues.
    issuer: u128,
    /// Whether another replica's tickets settle here (a backend that settles each part once
    /// across replicas): otherwise only this process's do.
    shared: bool,
}

/// The nonces of settled tickets until they expire. Bounded: when full, the one nearest its
/// expiry is forgotten and every ticket issued up to it is refused from then on (its
/// `floor`), so a flood of settles shortens how long tickets live, never lets one settle
/// twice, and never refuses a take. Kept by expiry, not by the order of settles, so that an
/// expired one is dropped wherever it stands: a permit of a long lease, settled early, kept
/// every ticket settled after it until its own expiry, and a full set raised the floor over
/// tickets still open.
struct Settled {
    /// (expires, issued, nonce), the nearest expiry first; an unclaimed one stays until it is
    /// popped, or the heap passes twice `max`, and counts for nothing (no longer in `set`).
    by_expiry: BinaryHeap<Reverse<(u64, u64, u128)>>,
    set: HashSet<u128>,
    max: usize,
    /// Tickets issued at or before this (ms) are refused.
    floor: u64,
}

impl std::fmt::Debug for Tickets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tickets")
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

/// Milliseconds since the Unix epoch.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

impl Tickets {
    /// Tickets signed with a key derived from `secret`, or with 256 random bits when there
    /// is none (this process's alone). Replicas given the same secret accept each other's
    /// only where `shared` (the backend settles each part once across replicas, as Redis
    /// does): otherwise a ticket settles on the process that issued it, the one that
    /// remembers whether it was settled.
    pub fn new(
        secret: Option<&str>,
        ttl: Duration,
        max_settled: usize,
        shared: bool,
    ) -> std::io::Result<Self> {
        let key = match secret {
            Some(s) => Sha256::digest(s.as_bytes()).into(),
            None => {
                let mut k = [0u8; 32];
                getrandom::fill(&mut k).map_err(std::io::Error::other)?;
                k
            }
        };
        let mut issuer = [0u8; 16];
        getrandom::fill(&mut issuer).map_err(std::io::Error::other)?;
        Ok(Tickets {
            key,
            issuer: u128::from_be_bytes(issuer),
            shared,
            // On a shared backend a replica that never saw a settle refuses a second one by
            // Redis' mark alone, which covers a ticket's first `SETTLE_MARK_TTL`: no longer.
            ttl: if shared {
                ttl.min(hotlimit::redis::SETTLE_MARK_TTL)
            } else {
                ttl
            },
            settled: Mutex::new(Settled {
                by_expiry: BinaryHeap::new(),
                set: HashSet::new(),
                max: max_settled.max(1),
                floor: 0,
            }),
        })
    }

    /// A ticket's lifetime.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    fn mac(&self) -> Hmac<Sha256> {
        // HMAC takes a key of any length.
        match Hmac::<Sha256>::new_from_slice(&self.key) {
            Ok(m) => m,
            Err(_) => unreachable!("HMAC accepts every key length"),
        }
    }

    /// The token for `parts`, issued at `now` (ms since the epoch), living the tickets'
    /// lifetime or `at_least`, whichever is longer (an in-flight permit's lease: its release
    /// must still land when the request ends), and at most `max_len` bytes long: a longer one
    /// could not be settled (its settle's body would be over the bound), so none is issued
    /// and the parts are handed back.
    pub fn issue(
        &self,
        parts: Vec<Part>,
        now: u64,
        at_least: Duration,
        max_len: usize,
    ) -> Result<String, NotIssued> {
        let ttl = u64::try_from(at_least.as_millis())
            .unwrap_or(u64::MAX)
            .max(self.ttl_ms());
        let mut nonce = [0u8; 16];
        getrandom::fill(&mut nonce).map_err(|e| NotIssued::Io(std::io::Error::other(e)))?;
        let claims = Claims {
            nonce: format!("{:032x}", u128::from_be_bytes(nonce)),
            issuer: self.issuer,
            issued: now,
            expires: now.saturating_add(ttl),
            parts,
        };
        let bytes =
            postcard::to_allocvec(&claims).map_err(|e| NotIssued::Io(std::io::Error::other(e)))?;
        // The body in base64, a dot, and the tag's 32 bytes in base64 (43 characters).
        let len = (bytes.len() * 4).div_ceil(3) + 1 + 43;
        if len > max_len {
            return Err(NotIssued::TooLarge {
                len,
                parts: claims.parts,
            });
        }
        let body = URL_SAFE_NO_PAD.encode(bytes);
        let mut mac = self.mac();
        mac.update(body.as_bytes());
        let tag = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        Ok(format!("{body}.{tag}"))
    }

    /// The claims of `token` if this server signed it, it has not expired at `now` and it may
    /// settle here (this process issued it, or the backend's settles are shared), settled or
    /// not: [`claim`](Self::claim) says.
    pub fn open(&self, token: &str, now: u64) -> Result<Claims, Refused> {
        let (body, tag) = token.split_once('.').ok_or(Refused::Unknown)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| Refused::Unknown)?;
        let mut mac = self.mac();
        mac.update(body.as_bytes());
        // Constant time: a forger learns nothing from how long a refusal took.
        mac.verify_slice(&tag).map_err(|_| Refused::Unknown)?;
        let json = URL_SAFE_NO_PAD.decode(body).map_err(|_| Refused::Unknown)?;
        let claims: Claims = postcard::from_bytes(&json).map_err(|_| Refused::Unknown)?;
        if now >= claims.expires || !(self.shared || claims.issuer == self.issuer) {
            return Err(Refused::Unknown);
        }
        Ok(claims)
    }

    /// Marks `claims` settled (before its parts are applied: two settles of one ticket racing,
    /// one wins); refused if it already is, or if it was issued at or before the floor.
    pub fn claim(&self, claims: &Claims, now: u64) -> Result<(), Refused> {
        let nonce = u128::from_str_radix(&claims.nonce, 16).map_err(|_| Refused::Unknown)?;
        let mut s = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        while s
            .by_expiry
            .peek()
            .is_some_and(|Reverse((exp, _, _))| *exp <= now)
        {
            if let Some(Reverse((_, _, n))) = s.by_expiry.pop() {
                s.set.remove(&n);
            }
        }
        if claims.issued <= s.floor || s.set.contains(&nonce) {
            return Err(Refused::Unknown);
        }
        while s.set.len() >= s.max {
            let Some(Reverse((_, issued, nearest))) = s.by_expiry.pop() else {
                break;
            };
            if s.set.remove(&nearest) {
                // No ticket issued up to the forgotten one's issue settles from here.
                s.floor = s.floor.max(issued);
            }
        }
        s.by_expiry
            .push(Reverse((claims.expires, claims.issued, nonce)));
        s.set.insert(nonce);
        if s.by_expiry.len() > 2 * s.max {
            // Unclaimed places (settles retried through a backend's outage) kept until their
            // expiry would grow it past the bound: dropped, at most once per `max` claims.
            let Settled { by_expiry, set, .. } = &mut *s;
            by_expiry.retain(|Reverse((_, _, n))| set.contains(n));
        }
        Ok(())
    }

    /// Undoes a [`claim`](Self::claim) whose parts could not all be applied (a backend
    /// error) where the backend marks each part's settle (`shared`: Redis): the client's
    /// retry settles what is left, a part settled already applying no second time. Elsewhere
    /// nothing marks the parts already applied and a retry would refund them again, so the
    /// ticket stays settled and the rest charged (a settle that fails errs strict).
    pub fn unclaim(&self, nonce: &str) {
        let Ok(nonce) = u128::from_str_radix(nonce, 16) else {
            return;
        };
        if !self.shared {
            return;
        }
        let mut s = self.settled.lock().unwrap_or_else(|e| e.into_inner());
        // Its place by expiry stays until popped: at its expiry, or as the nearest when full.
        s.set.remove(&nonce);
    }

    /// How many settled tickets are remembered now.
    pub fn remembered(&self) -> usize {
        self.settled
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(60);

    fn token(t: &Tickets) -> String {
        t.issue(Vec::new(), 1_000, Duration::ZERO, usize::MAX)
            .unwrap()
    }

    /// On Redis a ticket lives no longer than the settle marks cover (a replica that never
    /// saw its settle would take it again once the mark expired); in memory it lives as set.
    // Pins G74.
    #[test]
    fn a_shared_backends_tickets_live_no_longer_than_its_marks() {
        let hour = Duration::from_secs(3_600);
        let shared = Tickets::new(Some("s"), hour, 10, true).unwrap();
        assert_eq!(shared.ttl(), hotlimit::redis::SETTLE_MARK_TTL);
        let alone = Tickets::new(Some("s"), hour, 10, false).unwrap();
        assert_eq!(alone.ttl(), hour);
    }

    /// Two processes given one secret, on a backend whose settles each process remembers
    /// alone (memory, the fleet): each refuses the other's tickets, so no ticket is settled
    /// once per replica.
    #[test]
    fn a_ticket_settles_only_on_its_issuer_unless_the_backend_shares_settles() {
        let (a, b) = (
            Tickets::new(Some("s3cret"), TTL, 8, false).unwrap(),
            Tickets::new(Some("s3cret"), TTL, 8, false).unwrap(),
        );
        let t = token(&a);
        assert_eq!(b.open(&t, 2_000).unwrap_err(), Refused::Unknown);
        let claims = a.open(&t, 2_000).unwrap();
        assert_eq!(a.claim(&claims, 2_000), Ok(()));
        assert_eq!(a.claim(&claims, 2_000), Err(Refused::Unknown));

        // Where the backend marks each settle across replicas (Redis), either opens it.
        let (c, d) = (
            Tickets::new(Some("s3cret"), TTL, 8, true).unwrap(),
            Tickets::new(Some("s3cret"), TTL, 8, true).unwrap(),
        );
        let t = token(&c);
        assert_eq!(d.open(&t, 2_000).map(|c| c.parts.len()), Ok(0));
        // Another secret opens nothing, shared or not.
        let e = Tickets::new(Some("another"), TTL, 8, true).unwrap();
        assert_eq!(e.open(&t, 2_000).unwrap_err(), Refused::Unknown);
    }

    fn claims(nonce: u128, issued: u64, expires: u64) -> Claims {
        Claims {
            nonce: format!("{nonce:032x}"),
            issuer: 0,
            issued,
            expires,
            parts: Vec::new(),
        }
    }

    /// A permit of a long lease settled first, then two tickets that expire: past their
    /// expiry they are dropped though the permit stands before them, so a full set forgets no
    /// live one and raises no floor over a ticket still open.
    #[test]
    fn an_expired_settle_is_dropped_wherever_it_stands() {
        let t = Tickets::new(None, TTL, 3, false).unwrap();
        let (hour, minute) = (3_600_000, 60_000);
        assert_eq!(t.claim(&claims(1, 10, 10 + hour), 100), Ok(()));
        assert_eq!(t.claim(&claims(2, 11, 11 + minute), 100), Ok(()));
        assert_eq!(t.claim(&claims(3, 12, 12 + minute), 100), Ok(()));
        assert_eq!(t.remembered(), 3);
        // A minute on: the two have expired, the permit has not.
        let now = 100_000;
        assert_eq!(t.claim(&claims(4, 90_000, 90_000 + minute), now), Ok(()));
        assert_eq!(t.remembered(), 2);
        // Still remembered: the permit settles no second time.
        assert_eq!(
            t.claim(&claims(1, 10, 10 + hour), now),
            Err(Refused::Unknown)
        );
        // No floor raised: a permit issued before it, still open, settles.
        assert_eq!(t.claim(&claims(5, 5, 5 + hour), now), Ok(()));
        // Full (3): the one nearest its expiry is forgotten, and tickets issued up to it
        // are refused from then on.
        assert_eq!(t.claim(&claims(6, 95_000, 95_000 + minute), now), Ok(()));
        assert_eq!(t.remembered(), 3);
        assert_eq!(
            t.claim(&claims(7, 90_000, 90_000 + minute), now),
            Err(Refused::Unknown)
        );
        assert_eq!(
            t.claim(&claims(4, 90_000, 90_000 + minute), now),
            Err(Refused::Unknown)
        );
    }

    /// Settles retried through a backend's outage (claimed, unclaimed, claimed again, by the
    /// thousand) leave places by expiry behind: dropped once they pass twice the bound, where
    /// they grew until their tickets expired (a client retrying in a loop: without bound).
    // Pins G75.
    #[test]
    fn settles_retried_through_an_outage_keep_the_memory_bounded() {
        let t = Tickets::new(None, TTL, 8, true).unwrap();
        for nonce in 0..10_000u128 {
            let c = claims(nonce, 10, 10 + 60_000);
            assert_eq!(t.claim(&c, 100), Ok(()));
            t.unclaim(&c.nonce);
            let s = t.settled.lock().unwrap();
            assert!(s.by_expiry.len() <= 2 * 8, "{}", s.by_expiry.len());
        }
        // The last retry that succeeds is remembered: no second settle.
        let last = claims(10_000, 10, 10 + 60_000);
        assert_eq!(t.claim(&last, 100), Ok(()));
        assert_eq!(t.claim(&last, 100), Err(Refused::Unknown));
    }
}
