//! A `RateLimitRequest`'s shape read off its protobuf wire form, before it is decoded.
//!
//! A descriptor or an entry costs 2 bytes on the wire (its tag and an empty length) and
//! 50-odd in memory once decoded: a message of `--max-body-bytes` of empty descriptors decoded
//! to 14 MB, on every thread at once. So the gRPC port reads how many descriptors a request
//! has, and how many entries each, without allocating; a request past the limits is refused
//! as [`Service::admit`](crate::service::Service) would refuse it decoded (the same checks,
//! in the same order: one [`Shape`] walk), and never decoded.

use std::borrow::Cow;

use crate::service::Shape;

/// A field of a message on the wire: its number and, for a length-delimited one, its bytes.
#[derive(Debug, PartialEq)]
enum Field<'a> {
    Bytes(u32, &'a [u8]),
    Other(u32),
}

/// The fields of the message `buf` in order; `None` at the first malformed byte (prost's
/// decoder then says what is wrong with it).
fn fields(mut buf: &[u8]) -> impl Iterator<Item = Option<Field<'_>>> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        let field = (|| {
            let key = varint(&mut buf)?;
            let number = u32::try_from(key >> 3).ok()?;
            match key & 7 {
                0 => varint(&mut buf).map(|_| Field::Other(number)),
                1 => skip(&mut buf, 8).map(|_| Field::Other(number)),
                2 => {
                    let len = usize::try_from(varint(&mut buf)?).ok()?;
                    skip(&mut buf, len).map(|bytes| Field::Bytes(number, bytes))
                }
                5 => skip(&mut buf, 4).map(|_| Field::Other(number)),
                // Groups: not in these messages.
                _ => None,
            }
        })();
        if field.is_none() {
            buf = &[];
        }
        Some(field)
    })
}

fn varint(buf: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let (&byte, rest) = buf.split_first()?;
        *buf = rest;
        value |= u64::from(byte & 0x7F) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn skip<'a>(buf: &mut &'a [u8], len: usize) -> Option<&'a [u8]> {
    (len <= buf.len()).then(|| {
        let (head, rest) = buf.split_at(len);
        *buf = rest;
        head
    })
}

/// How many length-delimited fields numbered `number` `message` has; `None` if it is
/// malformed.
fn count(message: &[u8], number: u32) -> Option<usize> {
    let mut n = 0;
    for field in fields(message) {
        n += usize::from(matches!(field?, Field::Bytes(m, _) if m == number));
    }
    Some(n)
}

/// The last length-delimited field numbered `number` of `message` (protobuf's rule for a
/// string), or empty.
fn last(message: &[u8], number: u32) -> &[u8] {
    fields(message)
        .map_while(|f| f)
        .filter_map(|f| match f {
            Field::Bytes(n, bytes) if n == number => Some(bytes),
            _ => None,
        })
        .last()
        .unwrap_or_default()
}

/// A request's wire form, where decoding it would take more than its limits allow: its
/// domain, how many descriptors it has, and each one's [`Shape`] (read as it is walked).
/// `None` where it is within them (or malformed: prost's decoder says how), and is decoded.
/// `RateLimitRequest`: domain 1, descriptors 2; a descriptor: entries 1; an entry: key 1,
/// value 2.
pub(crate) fn oversized(
    message: &[u8],
    max_descriptors: usize,
    max_entries: usize,
    max_value_bytes: usize,
) -> Option<(Cow<'_, str>, usize, impl Iterator<Item = Shape<'_>>)> {
    let descriptors = count(message, 2)?;
    let too_many_entries = || {
        fields(message).any(|f| {
            matches!(f, Some(Field::Bytes(2, d)) if count(d, 1).is_some_and(|n| n > max_entries))
        })
    };
    if descriptors <= max_descriptors && !too_many_entries() {
        return None;
    }
    let domain = String::from_utf8_lossy(last(message, 1));
    let shapes = fields(message)
        .map_while(|f| f)
        .filter_map(move |f| match f {
            Field::Bytes(2, d) => {
                let too_long = fields(d).map_while(|f| f).find_map(|f| match f {
                    Field::Bytes(1, e)
                        if last(e, 1).len() > max_value_bytes
                            || last(e, 2).len() > max_value_bytes =>
                    {
                        Some(String::from_utf8_lossy(last(e, 1)))
                    }
                    _ => None,
                });
                Some(Shape {
                    entries: count(d, 1).unwrap_or(0),
                    too_long,
                })
            }
            _ => None,
        });
    Some((domain, descriptors, shapes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        rate_limit_descriptor::Entry, RateLimitDescriptor,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use tonic_prost::prost::Message;

    fn wire(descriptors: Vec<Vec<(&str, &str)>>) -> Vec<u8> {
        RateLimitRequest {
            domain: "d".into(),
            descriptors: descriptors
                .into_iter()
                .map(|entries| RateLimitDescriptor {
                    entries: entries
                        .into_iter()
                        .map(|(k, v)| Entry {
                            key: k.into(),
                            value: v.into(),
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            hits_addend: 3,
        }
        .encode_to_vec()
    }

    #[test]
    fn a_request_within_its_limits_is_left_to_the_decoder() {
        let w = wire(vec![vec![("user", "alice")]; 4]);
        assert!(oversized(&w, 4, 16, 1024).is_none());
        // Malformed: a length past the end. prost says so.
        assert!(oversized(&[0x12, 0x05, 0x0A], 0, 0, 0).is_none());
    }

    /// xorshift64*: the tests' own numbers, the same every run.
    fn numbers(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
    }

    #[test]
    fn any_bytes_are_read_without_a_panic_and_any_request_as_decoded() {
        let mut next = numbers(7);
        // Bytes of every kind, and encodings cut short or with bytes changed.
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = oversized(&bytes, 2, 2, 4).map(|(_, _, shapes)| shapes.count());
        }
        // Requests of 0 to 6 descriptors of 0 to 6 entries, keys and values of 0 to 6 bytes:
        // read off the wire exactly as decoded.
        for _ in 0..5_000 {
            let descriptors: Vec<Vec<(String, String)>> = (0..next() % 7)
                .map(|_| {
                    (0..next() % 7)
                        .map(|_| {
                            (
                                "k".repeat((next() % 7) as usize),
                                "v".repeat((next() % 7) as usize),
                            )
                        })
                        .collect()
                })
                .collect();
            let (max_descriptors, max_entries, max_value) = (3, 3, 3);
            let over = descriptors.len() > max_descriptors
                || descriptors.iter().any(|d| d.len() > max_entries);
            let pairs: Vec<Vec<(&str, &str)>> = descriptors
                .iter()
                .map(|d| d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
                .collect();
            let w = wire(pairs);
            let read = oversized(&w, max_descriptors, max_entries, max_value);
            assert_eq!(read.is_some(), over, "{descriptors:?}");
            if let Some((domain, n, shapes)) = read {
                assert_eq!((domain.as_ref(), n), ("d", descriptors.len()));
                let shapes: Vec<_> = shapes.map(|s| (s.entries, s.too_long)).collect();
                let decoded: Vec<_> = descriptors
                    .iter()
                    .map(|d| {
                        let too_long = d
                            .iter()
                            .find(|(k, v)| k.len() > max_value || v.len() > max_value)
                            .map(|(k, _)| Cow::Borrowed(k.as_str()));
                        (d.len(), too_long)
                    })
                    .collect();
                assert_eq!(shapes, decoded);
            }
        }
        // Truncated encodings: never a panic.
        let w = wire(vec![vec![("user", "alice")]; 5]);
        for cut in 0..w.len() {
            let _ = oversized(&w[..cut], 2, 2, 4).map(|(_, _, shapes)| shapes.count());
        }
    }

    #[test]
    fn descriptors_and_entries_are_counted_off_the_wire() {
        let w = wire(vec![vec![("user", "alice")]; 5]);
        let (domain, n, shapes) = oversized(&w, 4, 16, 1024).expect("5 descriptors over 4");
        assert_eq!((domain.as_ref(), n), ("d", 5));
        let shapes: Vec<_> = shapes.map(|s| (s.entries, s.too_long)).collect();
        assert_eq!(shapes, vec![(1, None); 5]);

        let long = "x".repeat(20);
        let w = wire(vec![
            vec![("a", "1")],
            vec![("a", "1"), ("b", long.as_str()), ("c", "3")],
        ]);
        let (_, n, shapes) = oversized(&w, 4, 2, 10).expect("3 entries over 2");
        assert_eq!(n, 2);
        let shapes: Vec<_> = shapes.map(|s| (s.entries, s.too_long)).collect();
        assert_eq!(shapes, vec![(1, None), (3, Some("b".into()))]);
    }
}
