//! Short text on the stack: header values and keys are written without the formatting
//! machinery or a heap buffer, which would cost more than the limiter's check.

use std::fmt;

/// Up to `N` (at most 255) bytes of text on the stack, written with `fmt::Write`.
#[derive(Clone, Copy)]
pub(crate) struct Buf<const N: usize> {
    len: u8,
    buf: [u8; N],
}

impl<const N: usize> Buf<N> {
    pub(crate) const fn new() -> Self {
        Self {
            len: 0,
            buf: [0; N],
        }
    }

    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len as usize]
    }

    /// The text (the tower layer's keys, tests).
    #[cfg(test)]
    #[inline]
    pub(crate) fn as_str(&self) -> &str {
        // Only whole `str`s and ASCII digits are written, so this never fails.
        std::str::from_utf8(self.as_bytes()).unwrap_or("")
    }

    /// Writes `n` in decimal, without the formatting machinery.
    pub(crate) fn push_u64(&mut self, mut n: u64) -> fmt::Result {
        let mut digits = [0u8; 20];
        let mut at = digits.len();
        loop {
            at -= 1;
            digits[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        self.push(&digits[at..])
    }

    #[inline]
    pub(crate) fn push(&mut self, bytes: &[u8]) -> fmt::Result {
        let start = self.len as usize;
        let end = start + bytes.len();
        if end > N.min(u8::MAX as usize) {
            return Err(fmt::Error);
        }
        self.buf[start..end].copy_from_slice(bytes);
        self.len = end as u8;
        Ok(())
    }
}

impl<const N: usize> fmt::Write for Buf<N> {
    #[inline]
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.push(s.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_match_display() {
        for n in [0, 1, 9, 10, 99, 100, 12345, u64::MAX - 1, u64::MAX] {
            let mut b = Buf::<20>::new();
            b.push_u64(n).unwrap();
            assert_eq!(b.as_str(), n.to_string());
        }
    }
}
