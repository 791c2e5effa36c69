//! The proxy-wasm serialisation of a list of pairs, which the host uses for
//! header maps and for map-valued properties (such as a route's metadata):
//! a u32 count `n`, then `n` pairs of u32 lengths (first, second), then each
//! first and second followed by a NUL byte; integers little-endian.
//!
//! The buffer comes from the host: read defensively (malformed is `None`,
//! never a panic), without allocating.

fn u32_at(buf: &[u8], at: usize) -> Option<usize> {
    let bytes: [u8; 4] = buf.get(at..at.checked_add(4)?)?.try_into().ok()?;
    usize::try_from(u32::from_le_bytes(bytes)).ok()
}

/// Calls `each` with every pair in order; `None` if the buffer is
/// malformed (pairs before the fault may have been seen).
pub fn for_each<'a>(buf: &'a [u8], mut each: impl FnMut(&'a [u8], &'a [u8])) -> Option<()> {
    let count = u32_at(buf, 0)?;
    // Each pair needs 8 bytes of lengths and 2 NULs: reject absurd counts
    // before doing arithmetic with them.
    if count > buf.len() / 10 {
        return None;
    }
    let mut data = 4usize.checked_add(count.checked_mul(8)?)?;
    for i in 0..count {
        let lengths = 4 + i * 8;
        let (first_len, second_len) = (u32_at(buf, lengths)?, u32_at(buf, lengths + 4)?);
        let first = buf.get(data..data.checked_add(first_len)?)?;
        data = data.checked_add(first_len)?.checked_add(1)?;
        let second = buf.get(data..data.checked_add(second_len)?)?;
        data = data.checked_add(second_len)?.checked_add(1)?;
        each(first, second);
    }
    // The last value's NUL must be inside the buffer too.
    (data <= buf.len()).then_some(())
}

/// The pairs, collected; `None` if the buffer is malformed.
pub fn decode(buf: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    let mut pairs = Vec::new();
    for_each(buf, |a, b| pairs.push((a, b)))?;
    Some(pairs)
}

/// Serialises pairs the way the host does (tests and fuzzing seeds).
pub fn serialise<A: AsRef<[u8]>, B: AsRef<[u8]>>(pairs: &[(A, B)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (a, b) in pairs {
        out.extend_from_slice(&(a.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(b.as_ref().len() as u32).to_le_bytes());
    }
    for (a, b) in pairs {
        out.extend_from_slice(a.as_ref());
        out.push(0);
        out.extend_from_slice(b.as_ref());
        out.push(0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_read_back_and_malformed_buffers_are_none() {
        let good = serialise(&[("a", "1"), ("bc", "")]);
        assert_eq!(
            decode(&good),
            Some(vec![(&b"a"[..], &b"1"[..]), (&b"bc"[..], &b""[..])])
        );
        for cut in 0..good.len() {
            assert_eq!(decode(&good[..cut]), None, "cut at {cut}");
        }
        assert_eq!(decode(&[0xff, 0xff, 0xff, 0xff]), None);
        let mut long = good.clone();
        long[4] = 0xff; // first name's length past the end
        assert_eq!(decode(&long), None);
    }
}
