//! Whole records out of a byte stream. quiche writes a connection's key log lines
//! ([`crate::keylog`]) and qlog events into a `Write` piece by piece (a
//! label, then hex; a record separator, then serde_json's many small writes, then a newline);
//! [`Records`] keeps the pieces until a newline ends them and hands on whole records only, so
//! a record is written, or dropped, whole.
//!
//! A record longer than its bound is no record of ours: it is dropped (counted by the caller)
//! with everything up to the next newline, so what follows is still whole records.

use std::io::{self, Write};

/// A `Write` that hands whole newline-ended records (one or more) to `emit`, keeping at most
/// `max` bytes of an unfinished one.
pub struct Records<F: FnMut(&[u8], u64)> {
    pending: Vec<u8>,
    max: usize,
    /// Inside an overlong record: bytes are dropped up to the next newline.
    skipping: bool,
    /// Called with whole records and how many (their newlines); with an empty slice and 1
    /// for an overlong record dropped.
    emit: F,
}

impl<F: FnMut(&[u8], u64)> Records<F> {
    /// Records of at most `max` bytes, handed to `emit`.
    pub fn new(max: usize, emit: F) -> Records<F> {
        Records { pending: Vec::new(), max, skipping: false, emit }
    }
}

impl<F: FnMut(&[u8], u64)> std::fmt::Debug for Records<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Records").field("pending", &self.pending.len()).field("max", &self.max).finish()
    }
}

impl<F: FnMut(&[u8], u64)> Write for Records<F> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut rest = buf;
        if self.skipping {
            match rest.iter().position(|&b| b == b'\n') {
                None => return Ok(buf.len()),
                Some(end) => {
                    self.skipping = false;
                    rest = &rest[end + 1..];
                }
            }
        }
        match rest.iter().rposition(|&b| b == b'\n') {
            Some(end) => {
                let n = rest[..=end].iter().filter(|&&b| b == b'\n').count() as u64;
                if self.pending.is_empty() {
                    (self.emit)(&rest[..=end], n);
                } else {
                    self.pending.extend_from_slice(&rest[..=end]);
                    (self.emit)(&self.pending, n);
                    self.pending.clear();
                }
                rest = &rest[end + 1..];
            }
            None if self.pending.len() + rest.len() > self.max => {
                self.pending.clear();
                self.skipping = true;
                (self.emit)(&[], 1);
                return Ok(buf.len());
            }
            None => {}
        }
        self.pending.extend_from_slice(rest);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_become_whole_records_and_an_overlong_one_is_dropped_whole() {
        let mut got: Vec<(Vec<u8>, u64)> = Vec::new();
        let mut r = Records::new(8, |b: &[u8], n| got.push((b.to_vec(), n)));
        r.write_all(b"ab").unwrap();
        r.write_all(b"c\n").unwrap();
        r.write_all(b"d\ne\nf").unwrap();
        r.write_all(b"0123456789").unwrap(); // "f0123456789": past 8, dropped to its newline
        r.write_all(b"more\nok\n").unwrap();
        drop(r);
        let want: Vec<(&[u8], u64)> = vec![(b"abc\n", 1), (b"d\ne\n", 2), (b"", 1), (b"ok\n", 1)];
        assert_eq!(got.iter().map(|(b, n)| (&b[..], *n)).collect::<Vec<_>>(), want);
    }
}
