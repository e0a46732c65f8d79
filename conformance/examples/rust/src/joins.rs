//! Several pieces of one global tensor on one rank (SPEC 7.2 rules 3, 6, 7; since format 1.3):
//! when they are joinable, and their join.

/// SPEC 7.2 rule 7: the dimension d along which k ≥ 2 pieces `(offset, shape)` of one rank
/// are joinable, or None. They must have the same offset and size in every dimension other
/// than d, distinct offsets along d and, in increasing offset along d, each must end no later
/// than the next begins. A scalar (no dimension) never joins.
pub fn join_dimension(pieces: &[(&[u64], &[u64])]) -> Option<usize> {
    let (o0, s0) = *pieces.first()?;
    let n = o0.len();
    let differ: Vec<usize> = (0..n).filter(|&d| pieces.iter().any(|(o, _)| o[d] != o0[d]))
        .collect();
    let [d] = differ.as_slice() else { return None };
    let d = *d;
    if pieces.iter().any(|(_, s)| (0..n).any(|e| e != d && s[e] != s0[e])) {
        return None;
    }
    let mut runs: Vec<(u64, u64)> = pieces.iter().map(|(o, s)| (o[d], s[d])).collect();
    runs.sort_unstable();
    // offsets are at most MAX_SIZE and sizes too (bounds were checked), so no u64 overflow
    let apart = runs.windows(2).all(|w| w[0].0 != w[1].0 && w[0].0 + w[0].1 <= w[1].0);
    apart.then_some(d)
}

/// The join (SPEC 7.2 rule 7) of joinable pieces `(offset, shape, bytes)`: its shape and its
/// bytes. Along the join dimension d the pieces follow one another
/// in increasing offset; in row-major order that is, for each index of the dimensions before
/// d, each piece's block of that index in turn. A block of a sub-byte dtype (SPEC 6.5) may
/// end inside a byte, so blocks are copied as bit strings.
pub fn join(pieces: &[(&[u64], &[u64], &[u8])]) -> (Vec<u64>, Vec<u8>) {
    let keys: Vec<(&[u64], &[u64])> = pieces.iter().map(|(o, s, _)| (*o, *s)).collect();
    let d = join_dimension(&keys).expect("the manifest checks made the pieces joinable");
    let mut order: Vec<&(&[u64], &[u64], &[u8])> = pieces.iter().collect();
    order.sort_by_key(|(o, _, _)| o[d]);
    let mut shape = order[0].1.to_vec();
    shape[d] = order.iter().map(|(_, s, _)| s[d]).sum();
    let outer: u64 = shape[..d].iter().product();
    let total_bits: u64 = order.iter().map(|(_, _, b)| b.len() as u64 * 8).sum();
    let mut out = vec![0u8; (total_bits / 8) as usize];
    if outer == 0 || total_bits == 0 {
        return (shape, out);
    }
    // each piece holds `outer` blocks of equal length (its bit count over `outer`)
    let block_bits: Vec<u64> = order.iter().map(|(_, _, b)| b.len() as u64 * 8 / outer).collect();
    let mut at = 0u64; // bit position in `out`
    for i in 0..outer {
        for (p, (_, _, bytes)) in order.iter().enumerate() {
            let n = block_bits[p];
            copy_bits(bytes, i * n, &mut out, at, n);
            at += n;
        }
    }
    (shape, out)
}

/// Copy `n` bits of the bit stream `src` (SPEC 6.5 rule 3: stream bit k is bit k mod 8 of
/// byte k div 8) from bit `from` to bit `to` of `dst`.
fn copy_bits(src: &[u8], from: u64, dst: &mut [u8], to: u64, n: u64) {
    if from % 8 == 0 && to % 8 == 0 && n % 8 == 0 {
        let (f, t, len) = ((from / 8) as usize, (to / 8) as usize, (n / 8) as usize);
        dst[t..t + len].copy_from_slice(&src[f..f + len]);
        return;
    }
    for k in 0..n {
        let (s, t) = (from + k, to + k);
        let bit = (src[(s / 8) as usize] >> (s % 8)) & 1;
        dst[(t / 8) as usize] |= bit << (t % 8);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joinable() {
        let rows: [(&[u64], &[u64]); 2] = [(&[4, 0], &[2, 4]), (&[0, 0], &[2, 4])];
        assert_eq!(join_dimension(&rows), Some(0));
        let corners: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 2]), (&[2, 2], &[2, 2])];
        assert_eq!(join_dimension(&corners), None); // offsets differ in two dimensions
        let sizes: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 4]), (&[2, 0], &[2, 3])];
        assert_eq!(join_dimension(&sizes), None); // sizes differ outside d
        let same: [(&[u64], &[u64]); 2] = [(&[0], &[4]), (&[0], &[4])];
        assert_eq!(join_dimension(&same), None); // offsets differ nowhere
        let over: [(&[u64], &[u64]); 2] = [(&[0], &[3]), (&[2], &[2])];
        assert_eq!(join_dimension(&over), None); // overlap along d
        let equal: [(&[u64], &[u64]); 3] = [(&[0], &[0]), (&[0], &[2]), (&[2], &[2])];
        assert_eq!(join_dimension(&equal), None); // offsets not distinct
        let scalars: [(&[u64], &[u64]); 2] = [(&[], &[]), (&[], &[])];
        assert_eq!(join_dimension(&scalars), None);
    }

    #[test]
    fn join_rows_and_columns() {
        // U8 [2, 2] at columns 3 and 0 of a [2, 4]: rows interleave
        let (a, b) = ([1u8, 2, 5, 6], [9u8, 10]);
        let pieces: [(&[u64], &[u64], &[u8]); 2] = [(&[0, 3], &[2, 1], &b), (&[0, 0], &[2, 2], &a)];
        assert_eq!(join(&pieces), (vec![2, 3], vec![1, 2, 9, 5, 6, 10]));
        // F4 columns: each row of a piece is one nibble (SPEC 6.5 rule 4)
        let (c, d) = ([0x21u8], [0x43u8]); // c = [[1], [2]], d = [[3], [4]]
        let pieces: [(&[u64], &[u64], &[u8]); 2] = [(&[0, 0], &[2, 1], &c), (&[0, 2], &[2, 1], &d)];
        assert_eq!(join(&pieces), (vec![2, 2], vec![0x31, 0x42]));
    }
}
