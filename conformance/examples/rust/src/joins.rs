//! Several pieces of one global tensor on one rank (SPEC 7.2 rules 3, 6, 7; since format 1.3):
//! when they are joinable, and their join.

/// SPEC 7.2 rule 7: the dimension d along which k ≥ 2 pieces `(offset, shape)` of one rank,
/// of a dtype of `bits` bits per element, are joinable, or None. They must have the same offset
/// and size in every dimension other than d, pairwise distinct offsets along d (a piece of size
/// 0 along d included) and, in increasing offset along d, each must end no later than the next
/// begins. For a dtype of fewer than 8 bits (SPEC 6.5), each piece's run `s[d] × … × s[n−1]`
/// elements must also be whole bytes. These are conditions of offsets and shapes alone, so they
/// hold pieces with no elements too: an empty piece inside another's run, or empty pieces whose
/// sub-byte runs end inside a byte, do not join. A scalar (no dimension) never joins.
pub fn join_dimension(pieces: &[(&[u64], &[u64])], bits: u64) -> Option<usize> {
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
    // a run's bit count modulo 8, taken factor by factor: the product itself may pass u64
    // where an earlier dimension is 0 (`[0, 2^62, 4]`)
    let whole_bytes = pieces.iter().all(|(_, s)| {
        s[d..].iter().fold(bits % 8, |acc, &x| acc * (x % 8) % 8) == 0
    });
    (apart && whole_bytes).then_some(d)
}

/// The join (SPEC 7.2 rule 7) of joinable pieces `(offset, shape, bytes)`: its shape and its
/// bytes. Along the join dimension d (where their offsets differ) the pieces follow one
/// another in increasing offset; in row-major order that is, for each index of the dimensions
/// before d, each piece's run of that index in turn. Every run is whole bytes, for a sub-byte
/// dtype too (the manifest checks refused any other), so the runs' bytes are laid one after
/// the other. The order is the offsets' alone, not the manifest's nor the files' part order.
pub fn join(pieces: &[(&[u64], &[u64], &[u8])]) -> (Vec<u64>, Vec<u8>) {
    let o0 = pieces[0].0;
    let d = (0..o0.len()).find(|&e| pieces.iter().any(|(o, _, _)| o[e] != o0[e]))
        .expect("the manifest checks made the pieces joinable");
    let mut order: Vec<&(&[u64], &[u64], &[u8])> = pieces.iter().collect();
    order.sort_by_key(|(o, _, _)| o[d]);
    let mut shape = order[0].1.to_vec();
    shape[d] = order.iter().map(|(_, s, _)| s[d]).sum();
    let outer = shape[..d].iter().product::<u64>() as usize;
    let mut out = Vec::with_capacity(order.iter().map(|(_, _, b)| b.len()).sum());
    if outer == 0 {
        return (shape, out);
    }
    // each piece holds `outer` runs of equal length: its byte count over `outer`
    for i in 0..outer {
        for (_, _, bytes) in &order {
            let run = bytes.len() / outer;
            out.extend_from_slice(&bytes[i * run..(i + 1) * run]);
        }
    }
    (shape, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn joinable() {
        let rows: [(&[u64], &[u64]); 2] = [(&[4, 0], &[2, 4]), (&[0, 0], &[2, 4])];
        assert_eq!(join_dimension(&rows, 32), Some(0));
        let corners: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 2]), (&[2, 2], &[2, 2])];
        assert_eq!(join_dimension(&corners, 32), None); // offsets differ in two dimensions
        let sizes: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 4]), (&[2, 0], &[2, 3])];
        assert_eq!(join_dimension(&sizes, 32), None); // sizes differ outside d
        let same: [(&[u64], &[u64]); 2] = [(&[0], &[4]), (&[0], &[4])];
        assert_eq!(join_dimension(&same, 32), None); // offsets differ nowhere
        let over: [(&[u64], &[u64]); 2] = [(&[0], &[3]), (&[2], &[2])];
        assert_eq!(join_dimension(&over, 32), None); // overlap along d
        let equal: [(&[u64], &[u64]); 3] = [(&[0], &[0]), (&[0], &[2]), (&[2], &[2])];
        assert_eq!(join_dimension(&equal, 32), None); // offsets not distinct
        let empty: [(&[u64], &[u64]); 2] = [(&[0, 2], &[2, 0]), (&[0, 2], &[2, 2])];
        assert_eq!(join_dimension(&empty, 32), None); // a size-0 piece at another's offset
        let scalars: [(&[u64], &[u64]); 2] = [(&[], &[]), (&[], &[])];
        assert_eq!(join_dimension(&scalars, 32), None);
    }

    #[test]
    fn sub_byte_runs() {
        // F4 [2, 1] pieces: a row's run is one nibble (SPEC 7.2 rule 7)
        let halves: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 1]), (&[0, 2], &[2, 1])];
        assert_eq!(join_dimension(&halves, 4), None);
        assert_eq!(join_dimension(&halves, 8), Some(1));
        let bytes: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 2]), (&[0, 4], &[2, 2])];
        assert_eq!(join_dimension(&bytes, 4), Some(1));
        assert_eq!(join_dimension(&bytes, 6), None); // 12 bits
        let quads: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 4]), (&[0, 4], &[2, 4])];
        assert_eq!(join_dimension(&quads, 6), Some(1)); // 24 bits
        let rows: [(&[u64], &[u64]); 2] = [(&[0, 0], &[1, 1]), (&[2, 0], &[1, 1])];
        assert_eq!(join_dimension(&rows, 4), None); // runs (whole pieces) of one nibble
        let empty: [(&[u64], &[u64]); 2] = [(&[0, 0], &[2, 0]), (&[0, 1], &[2, 2])];
        assert_eq!(join_dimension(&empty, 4), Some(1)); // a run of 0 bits is whole bytes
    }

    #[test]
    fn empty_pieces() {
        // joinability is of offsets and shapes alone, pieces without elements included
        let inside: [(&[u64], &[u64]); 2] = [(&[0], &[4]), (&[2], &[0])];
        assert_eq!(join_dimension(&inside, 32), None); // empty, inside the other's run
        let at_end: [(&[u64], &[u64]); 2] = [(&[0], &[4]), (&[4], &[0])];
        assert_eq!(join_dimension(&at_end, 32), Some(0));
        let overlapping: [(&[u64], &[u64]); 2] = [(&[0, 0], &[4, 0]), (&[2, 0], &[4, 0])];
        assert_eq!(join_dimension(&overlapping, 32), None); // runs overlap along 0
        let whole: [(&[u64], &[u64]); 2] = [(&[0, 0], &[0, 4]), (&[0, 4], &[0, 4])];
        assert_eq!(join_dimension(&whole, 4), Some(1)); // F4 runs of 16 bits
        let halves: [(&[u64], &[u64]); 2] = [(&[0, 0], &[0, 3]), (&[0, 3], &[0, 3])];
        assert_eq!(join_dimension(&halves, 4), None); // F4 runs of 12 bits
    }

    #[test]
    fn join_rows_and_columns() {
        // U8 [2, 2] at columns 3 and 0 of a [2, 4]: rows interleave
        let (a, b) = ([1u8, 2, 5, 6], [9u8, 10]);
        let pieces: [(&[u64], &[u64], &[u8]); 2] = [(&[0, 3], &[2, 1], &b), (&[0, 0], &[2, 2], &a)];
        assert_eq!(join(&pieces), (vec![2, 3], vec![1, 2, 9, 5, 6, 10]));
        // F4 columns, two elements (one byte) per row of a piece: bytes alternate
        let (c, d) = ([0x21u8, 0x43], [0x65u8, 0x87]);
        let pieces: [(&[u64], &[u64], &[u8]); 2] = [(&[0, 4], &[2, 2], &d), (&[0, 0], &[2, 2], &c)];
        assert_eq!(join(&pieces), (vec![2, 4], vec![0x21, 0x65, 0x43, 0x87]));
    }
}
