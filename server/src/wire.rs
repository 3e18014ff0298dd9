//! A `RateLimitRequest`'s shape read off its protobuf wire form, before it is decoded.
//!
//! A descriptor or an entry costs 2 bytes on the wire (its tag and an empty length) and
//! 50-odd in memory once decoded: a message of `--max-body-bytes` of empty descriptors decoded
//! to 14 MB, on every thread at once. So the gRPC port reads how many descriptors a request
//! has, and how many entries each, without allocating; a request past the limits is refused
//! as [`Service::admit`](crate::service::Service) would refuse it decoded (the same checks,
//! in the same order: one walk of the descriptors' entry counts), and never decoded. A message it cannot read is
//! refused undecoded too ([`Malformed`]): prost would refuse it, but only after decoding all
//! that comes before the fault (a tail cut short after 120,000 empty descriptors).

use std::borrow::Cow;

/// A field of a message on the wire: its number and, for a length-delimited one, its bytes.
#[derive(Debug, PartialEq)]
enum Field<'a> {
    Bytes(u32, &'a [u8]),
    Other(u32),
}

/// How deep groups may nest: more than prost allows (100), so that the scan reads every
/// message prost reads.
const MAX_DEPTH: u32 = 128;

/// A message the scan cannot read: one prost refuses too (the scan reads every message prost
/// reads, and more: it checks no UTF-8 and no nested message but the descriptors').
#[derive(Debug, PartialEq)]
pub(crate) struct Malformed;

/// The fields of the message `buf` in order; `None` at the first malformed byte.
fn fields(mut buf: &[u8]) -> impl Iterator<Item = Option<Field<'_>>> {
    std::iter::from_fn(move || {
        if buf.is_empty() {
            return None;
        }
        // An end of group with none open is malformed.
        let field = match read(&mut buf, MAX_DEPTH) {
            Some(Read::Field(f)) => Some(f),
            _ => None,
        };
        if field.is_none() {
            buf = &[];
        }
        Some(field)
    })
}

/// What [`read`] found: a field, or the end of the group numbered so.
enum Read<'a> {
    Field(Field<'a>),
    End(u32),
}

/// The next field of `buf`; `None` where malformed. A group, unknown to these messages, is
/// skipped whole as prost skips it, nested groups too, `depth` deep at most.
fn read<'a>(buf: &mut &'a [u8], depth: u32) -> Option<Read<'a>> {
    let key = varint(buf)?;
    let number = u32::try_from(key >> 3).ok()?;
    let other = Read::Field(Field::Other(number));
    match key & 7 {
        0 => varint(buf).map(|_| other),
        1 => skip(buf, 8).map(|_| other),
        2 => {
            let len = usize::try_from(varint(buf)?).ok()?;
            skip(buf, len).map(|bytes| Read::Field(Field::Bytes(number, bytes)))
        }
        5 => skip(buf, 4).map(|_| other),
        3 => {
            let depth = depth.checked_sub(1)?;
            loop {
                match read(buf, depth)? {
                    Read::End(n) if n == number => return Some(other),
                    Read::End(_) => return None,
                    Read::Field(_) => {}
                }
            }
        }
        4 => Some(Read::End(number)),
        // A wire type that does not exist.
        _ => None,
    }
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
/// domain, how many descriptors it has, and how many entries each has (read as it is walked).
/// `Ok(None)` where it is within them, and is decoded; [`Malformed`] where the message, or
/// one of its descriptors, cannot be read. `RateLimitRequest`: domain 1, descriptors 2; a
/// descriptor: entries 1; an entry: key 1, value 2.
#[allow(clippy::type_complexity)]
pub(crate) fn oversized(
    message: &[u8],
    max_descriptors: usize,
    max_entries: usize,
) -> Result<Option<(Cow<'_, str>, usize, impl Iterator<Item = usize> + '_)>, Malformed> {
    let descriptors = count(message, 2).ok_or(Malformed)?;
    let mut too_many_entries = false;
    for field in fields(message) {
        if let Field::Bytes(2, d) = field.ok_or(Malformed)? {
            too_many_entries |= count(d, 1).ok_or(Malformed)? > max_entries;
        }
    }
    if descriptors <= max_descriptors && !too_many_entries {
        return Ok(None);
    }
    let domain = String::from_utf8_lossy(last(message, 1));
    let entries = fields(message).map_while(|f| f).filter_map(|f| match f {
        Field::Bytes(2, d) => Some(count(d, 1).unwrap_or(0)),
        _ => None,
    });
    Ok(Some((domain, descriptors, entries)))
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
        assert!(matches!(oversized(&w, 4, 16), Ok(None)));
        // Malformed: a length past the end, at the top or in a descriptor. prost refuses it
        // too, after decoding what came before.
        assert!(oversized(&[0x12, 0x05, 0x0A], 0, 0).is_err());
        assert!(oversized(&[0x12, 0x02, 0x0A, 0x05], 9, 9).is_err());
    }

    // An unknown group (wire types 3 and 4) is skipped, as prost skips it: before the scan
    // took it for a fault and left the message to prost, which decoded 120,000 empty
    // descriptors after it before refusing them.
    // Pins G75.
    #[test]
    fn an_unknown_group_is_skipped_as_prost_skips_it() {
        // Field 15 as an empty group, a nested one in field 16's, the domain, 5 descriptors.
        let mut w = vec![
            0x7B, 0x7C, 0x83, 0x01, 0x7B, 0x7C, 0x84, 0x01, 0x0A, 0x01, b'd',
        ];
        w.extend([0x12, 0x00].repeat(5));
        assert!(RateLimitRequest::decode(&w[..]).is_ok());
        let (domain, n, _) = oversized(&w, 4, 16).unwrap().expect("5 over 4");
        assert_eq!((domain.as_ref(), n), ("d", 5));
        // An end of group with none open, or groups nested past the depth: malformed.
        assert!(oversized(&[0x7C], 4, 16).is_err());
        let deep: Vec<u8> = [0x7B]
            .repeat(129)
            .into_iter()
            .chain([0x7C].repeat(129))
            .collect();
        assert!(oversized(&deep, 4, 16).is_err());
        assert!(RateLimitRequest::decode(&deep[..]).is_err());
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
        // Bytes of every kind: never a panic, and what the scan cannot read prost refuses
        // (refused undecoded, it refuses nothing prost would decode).
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            match oversized(&bytes, 2, 2) {
                Ok(read) => drop(read.map(|(_, _, shapes)| shapes.count())),
                Err(Malformed) => assert!(
                    RateLimitRequest::decode(&bytes[..]).is_err(),
                    "{bytes:02x?}"
                ),
            };
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
            let (max_descriptors, max_entries) = (3, 3);
            let over = descriptors.len() > max_descriptors
                || descriptors.iter().any(|d| d.len() > max_entries);
            let pairs: Vec<Vec<(&str, &str)>> = descriptors
                .iter()
                .map(|d| d.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
                .collect();
            let w = wire(pairs);
            let read = oversized(&w, max_descriptors, max_entries).unwrap();
            assert_eq!(read.is_some(), over, "{descriptors:?}");
            if let Some((domain, n, shapes)) = read {
                assert_eq!((domain.as_ref(), n), ("d", descriptors.len()));
                let shapes: Vec<usize> = shapes.collect();
                let decoded: Vec<usize> = descriptors.iter().map(Vec::len).collect();
                assert_eq!(shapes, decoded);
            }
        }
        // Truncated encodings: never a panic, and refused undecoded only where prost refuses.
        let w = wire(vec![vec![("user", "alice")]; 5]);
        for cut in 0..w.len() {
            match oversized(&w[..cut], 2, 2) {
                Ok(read) => drop(read.map(|(_, _, shapes)| shapes.count())),
                Err(Malformed) => assert!(RateLimitRequest::decode(&w[..cut]).is_err()),
            };
        }
    }

    #[test]
    fn descriptors_and_entries_are_counted_off_the_wire() {
        let w = wire(vec![vec![("user", "alice")]; 5]);
        let (domain, n, shapes) = oversized(&w, 4, 16).unwrap().expect("5 descriptors over 4");
        assert_eq!((domain.as_ref(), n), ("d", 5));
        assert_eq!(shapes.collect::<Vec<_>>(), vec![1; 5]);

        let long = "x".repeat(20);
        let w = wire(vec![
            vec![("a", "1")],
            vec![("a", "1"), ("b", long.as_str()), ("c", "3")],
        ]);
        let (_, n, shapes) = oversized(&w, 4, 2).unwrap().expect("3 entries over 2");
        assert_eq!(n, 2);
        assert_eq!(shapes.collect::<Vec<_>>(), vec![1, 3]);
    }
}
