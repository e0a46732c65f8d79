//! Manifest semantics that the schema cannot express (SPEC 3.5 rule 3; 11.1 step 7):
//! paths 2.1/2.2, layout 5.1–5.3, files 6.1, tensors 7.1–7.6. Ties (8.4) are in ties.rs,
//! joining a rank's several pieces (7.2 rule 7) in joins.rs.

use std::collections::{HashMap, HashSet};

use crate::dtype;
use crate::joins;
use crate::error::Result;
use crate::fail;
use crate::model::*;
use crate::schema::MAX_PATH_BYTES;

/// The coordinates (tp, pp, ep) of `rank` under `rank_order` (SPEC 5.2 rule 2).
pub fn coordinates(layout: &Layout, rank: u64) -> (u64, u64, u64) {
    let axes: Vec<&str> = layout.rank_order.split('-').collect();
    let size = |axis: &str| match axis {
        "tp" => layout.tp_size,
        "pp" => layout.pp_size,
        _ => layout.ep_size,
    };
    let (sb, sc) = (size(axes[1]), size(axes[2]));
    let c = rank % sc;
    let b = (rank / sc) % sb;
    let a = rank / (sb * sc);
    let mut coord = HashMap::new();
    coord.insert(axes[0], a);
    coord.insert(axes[1], b);
    coord.insert(axes[2], c);
    (coord["tp"], coord["pp"], coord["ep"])
}

/// 2.1 rule 3 and 2.2 rules 1–4 for every listed path.
fn check_paths(m: &Manifest) -> Result<()> {
    let mut seen = HashSet::new();
    let listed = m.ranks.iter().flat_map(|r| r.files.iter()).chain(m.extra_files.iter());
    for f in listed {
        if f.path.len() > MAX_PATH_BYTES {
            fail!("path-unsafe", "path of {} UTF-8 bytes, over MAX_PATH_BYTES {MAX_PATH_BYTES} \
                   (SPEC 2.2 rule 1)", f.path.len());
        }
        if f.path == "shardspec.json" {
            fail!("path-unsafe", "a listed path is the manifest's own name \"shardspec.json\" \
                   (SPEC 2.1 rule 3)");
        }
        if !seen.insert(f.path.as_str()) {
            fail!("file-duplicate", "path {:?} is listed more than once", f.path);
        }
    }
    Ok(())
}

/// 5.1–5.3.
fn check_layout(m: &Manifest) -> Result<()> {
    let l = &m.layout;
    let product = l.tp_size * l.pp_size * l.ep_size; // each <= 65536: no overflow in u64
    if l.world_size != product {
        fail!("layout-world-size", "world_size {} differs from tp_size x pp_size x ep_size = {}",
              l.world_size, product);
    }
    if m.ranks.len() as u64 != l.world_size {
        fail!("layout-world-size", "{} rank records for world_size {}", m.ranks.len(),
              l.world_size);
    }
    for (i, r) in m.ranks.iter().enumerate() {
        if r.rank != i as u64 {
            fail!("layout-ranks", "ranks[{i}] has rank {} (must be {i})", r.rank);
        }
    }
    for r in &m.ranks {
        let (tp, pp, ep) = coordinates(l, r.rank);
        if (r.tp_rank, r.pp_rank, r.ep_rank) != (tp, pp, ep) {
            fail!("layout-rank-order", "rank {} has (tp_rank, pp_rank, ep_rank) = ({}, {}, {}); \
                   rank order {} gives ({tp}, {pp}, {ep})", r.rank, r.tp_rank, r.pp_rank,
                  r.ep_rank, l.rank_order);
        }
    }
    Ok(())
}

/// Two pieces overlap iff they intersect in every dimension (SPEC 7.3 rule 2).
fn overlap(o1: &[u64], s1: &[u64], o2: &[u64], s2: &[u64]) -> bool {
    (0..o1.len()).all(|d| o1[d].max(o2[d]) < (o1[d] + s1[d]).min(o2[d] + s2[d]))
}

/// 7.3: the replica-0 pieces cover every element exactly once; a sweep along dimension 0.
fn check_coverage(t: &Tensor, shape: &[u64], elements: u64) -> Result<()> {
    let primaries: Vec<&Piece> = t.pieces.iter().filter(|p| p.replica == 0).collect();
    let mut total: u128 = 0;
    for p in &primaries {
        total += dtype::element_count(&p.shape).unwrap_or(0) as u128;
    }
    if shape.is_empty() {
        if primaries.len() > 1 {
            fail!("coverage-overlap", "tensor {:?}: {} replica-0 pieces of a scalar", t.name,
                  primaries.len());
        }
    } else {
        // pieces with no element cannot overlap anything
        let mut sorted: Vec<(&[u64], &[u64], u64)> = primaries.iter()
            .filter(|p| !p.shape.contains(&0))
            .map(|p| {
                let o = p.offset.as_deref().unwrap();
                (o, p.shape.as_slice(), p.rank)
            })
            .collect();
        sorted.sort_by_key(|(o, _, _)| o[0]);
        let mut active: Vec<(&[u64], &[u64], u64)> = Vec::new();
        for (o, s, rank) in sorted {
            active.retain(|(ao, as_, _)| ao[0] + as_[0] > o[0]);
            for (ao, as_, arank) in &active {
                if overlap(o, s, ao, as_) {
                    fail!("coverage-overlap", "tensor {:?}: the replica-0 pieces of ranks {arank} \
                           and {rank} overlap", t.name);
                }
            }
            active.push((o, s, rank));
        }
    }
    if total != elements as u128 {
        fail!("coverage-gap", "tensor {:?}: replica-0 pieces hold {total} of its {elements} \
               elements", t.name);
    }
    Ok(())
}

/// 7.2 rule 3: a rank's several pieces of one tensor. Only a manifest of format 1.3 or later
/// may have them (4.2 rule 4), and only for a global tensor that is neither tied nor the base
/// of a tie (8.4 rule 1); each must lie in a file of its own, and they must be joinable (7.2
/// rule 7; for a sub-byte dtype, in runs of whole bytes). Files are told apart by their listed
/// paths, as strings (2.1 rule 3): a path that links to another listed one is another file,
/// read from its own path.
fn check_several(t: &Tensor, rank: u64, held: &[&Piece], is_base: bool, minor: u64)
                 -> Result<()> {
    if minor < 3 {
        fail!("piece-duplicate", "tensor {:?}: rank {rank} holds {} pieces, which format 1.{minor} \
               does not allow (1.3 first does, SPEC 4.2 rule 4)", t.name, held.len());
    }
    let one_only = match &t.kind {
        TensorKind::Global { tied_to, .. } => tied_to.is_some() || is_base,
        _ => true,
    };
    if one_only {
        fail!("piece-duplicate", "tensor {:?}: rank {rank} holds {} pieces of a tensor with one \
               piece per rank (rank-local, tied, or the base of a tie)", t.name, held.len());
    }
    let files: HashSet<&str> = held.iter().map(|p| p.file.as_str()).collect();
    if files.len() != held.len() {
        fail!("piece-duplicate", "tensor {:?}: rank {rank} holds two pieces in one file", t.name);
    }
    let keys: Vec<(&[u64], &[u64])> = held.iter()
        .map(|p| (p.offset.as_deref().unwrap(), p.shape.as_slice()))
        .collect();
    let bits = dtype::bits(&t.dtype).expect("schema checked the dtype");
    if joins::join_dimension(&keys, bits).is_none() {
        fail!("piece-duplicate", "tensor {:?}: rank {rank}'s {} pieces cannot be joined along \
               one dimension (rule 7)", t.name, held.len());
    }
    Ok(())
}

/// 7.1 rule 4, 7.2 rules 2–4, 7.3, 7.4, 7.5 for one global or rank-local tensor.
fn check_tensor(m: &Manifest, rank_files: &[HashSet<&str>], t: &Tensor, is_base: bool)
                -> Result<()> {
    let bits = dtype::bits(&t.dtype).expect("schema checked the dtype");
    let global_shape = match &t.kind {
        TensorKind::Global { shape, .. } => Some(shape.as_slice()),
        _ => None,
    };
    let mut elements = 0;
    if let Some(shape) = global_shape {
        match (dtype::element_count(shape), dtype::bit_count(shape, bits)) {
            (Some(n), Some(_)) => elements = n,
            _ => fail!("shape-overflow", "tensor {:?}: shape {shape:?} has more than \
                        MAX_SIZE elements or bits", t.name),
        }
    }
    if let Some(l) = &t.logical {
        let logical_bits = dtype::bits(&l.dtype).expect("schema checked the dtype");
        if dtype::bit_count(&l.shape, logical_bits).is_none() {
            fail!("shape-overflow", "tensor {:?}: logical shape {:?} has more than MAX_SIZE \
                   elements or bits", t.name, l.shape);
        }
    }
    let mut by_rank: HashMap<u64, Vec<&Piece>> = HashMap::new();
    for p in &t.pieces {
        if p.rank >= m.layout.world_size {
            fail!("piece-rank", "tensor {:?}: a piece names rank {}, outside world_size {}",
                  t.name, p.rank, m.layout.world_size);
        }
        if p.file.len() > MAX_PATH_BYTES {
            fail!("path-unsafe", "tensor {:?}: piece file of {} UTF-8 bytes (SPEC 2.2 rule 1)",
                  t.name, p.file.len());
        }
        if !rank_files[p.rank as usize].contains(p.file.as_str()) {
            fail!("file-rank", "tensor {:?}: the piece of rank {} names {:?}, not a file of \
                   that rank", t.name, p.rank, p.file);
        }
        by_rank.entry(p.rank).or_default().push(p);
        if let Some(g) = global_shape {
            let o = p.offset.as_deref().unwrap();
            let s = &p.shape;
            let inside = o.len() == g.len() && s.len() == g.len()
                && (0..g.len()).all(|d| (o[d] as u128) + (s[d] as u128) <= g[d] as u128);
            if !inside {
                fail!("piece-bounds", "tensor {:?}: the piece of rank {} (offset {o:?}, shape \
                       {s:?}) is not inside shape {g:?}", t.name, p.rank);
            }
        }
        if dtype::byte_count(&p.shape, bits).is_none() {
            fail!("st-size", "tensor {:?}: the piece of rank {} (shape {:?}, {}) has a bit count \
                   that is not a multiple of 8 or over MAX_SIZE (SPEC 6.5 rule 2)", t.name,
                  p.rank, p.shape, t.dtype);
        }
    }
    // 7.2 rule 3, once every piece lies inside its tensor (in rank order: a stable message)
    let mut several: Vec<(&u64, &Vec<&Piece>)> = by_rank.iter().filter(|(_, v)| v.len() > 1)
        .collect();
    several.sort_by_key(|(r, _)| **r);
    for (rank, held) in several {
        check_several(t, *rank, held, is_base, m.minor)?;
    }
    if let Some(shape) = global_shape {
        if elements > 0 {
            check_coverage(t, shape, elements)?;
        }
        // 7.4: every replica copies a replica-0 piece
        for p in t.pieces.iter().filter(|p| p.replica > 0) {
            let matches = t.pieces.iter()
                .any(|q| q.replica == 0 && q.offset == p.offset && q.shape == p.shape);
            if !matches {
                fail!("replica-mismatch", "tensor {:?}: replica {} on rank {} matches no \
                       replica-0 piece", t.name, p.replica, p.rank);
            }
        }
    }
    Ok(())
}

/// SPEC 11.1 step 7 (ties: ties.rs).
pub fn check_manifest(m: &Manifest) -> Result<()> {
    check_paths(m)?;
    check_layout(m)?;
    let rank_files: Vec<HashSet<&str>> = m.ranks.iter()
        .map(|r| r.files.iter().map(|f| f.path.as_str()).collect())
        .collect();
    // the bases of ties (8.4 rule 1), which hold one piece per rank (7.2 rule 3)
    let bases: HashSet<&str> = m.tensors.iter()
        .filter_map(|t| match &t.kind {
            TensorKind::Global { tied_to: Some(tie), .. } => Some(tie.tensor.as_str()),
            _ => None,
        })
        .collect();
    for t in &m.tensors {
        if !matches!(t.kind, TensorKind::Alias { .. }) {
            check_tensor(m, &rank_files, t, bases.contains(t.name.as_str()))?;
        }
    }
    // 7.6: an alias names an existing tensor that is not an alias
    let kinds: HashMap<&str, &TensorKind> = m.tensors.iter().map(|t| (t.name.as_str(), &t.kind))
        .collect();
    for t in &m.tensors {
        if let TensorKind::Alias { target } = &t.kind {
            match kinds.get(target.as_str()) {
                None => fail!("alias-target", "alias {:?} names {target:?}, which is not a tensor",
                              t.name),
                Some(TensorKind::Alias { .. }) => {
                    fail!("alias-target", "alias {:?} names {target:?}, which is an alias", t.name)
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_order_coordinates() {
        let mut l = Layout { tp_size: 2, pp_size: 2, ep_size: 1, world_size: 4,
                             rank_order: "pp-ep-tp".into() };
        let got: Vec<_> = (0..4).map(|r| coordinates(&l, r)).collect();
        assert_eq!(got, vec![(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]);
        l.rank_order = "tp-pp-ep".into();
        let got: Vec<_> = (0..4).map(|r| coordinates(&l, r)).collect();
        assert_eq!(got, vec![(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]);
    }
}
