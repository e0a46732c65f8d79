//! Tied tensors (SPEC 8.4): a scale, zero point or group index described in blocks of its
//! base's grid. Runs after checks.rs, so every piece is inside its tensor.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::error::Result;
use crate::fail;
use crate::model::*;

fn global_shape(t: &Tensor) -> Option<(&[u64], Option<&Tie>)> {
    match &t.kind {
        TensorKind::Global { shape, tied_to } => Some((shape.as_slice(), tied_to.as_ref())),
        _ => None,
    }
}

fn div_ceil(a: u64, b: u64) -> u64 {
    a / b + u64::from(a % b != 0)
}

/// Check one tie of tensor `t` to its base (rules 1–4).
fn check_tie(index: &HashMap<&str, &Tensor>, t: &Tensor, t_shape: &[u64], tie: &Tie)
             -> Result<()> {
    let name = &t.name;
    // rule 1: the base is another global tensor without a tie of its own
    let base = match index.get(tie.tensor.as_str()) {
        None => fail!("tie-target", "tensor {name:?} is tied to {:?}, which is not a tensor",
                      tie.tensor),
        Some(b) => *b,
    };
    if base.name == *name {
        fail!("tie-target", "tensor {name:?} is tied to itself");
    }
    let Some((w_shape, w_tie)) = global_shape(base) else {
        fail!("tie-target", "tensor {name:?} is tied to {:?}, which is not a global tensor",
              tie.tensor);
    };
    if w_tie.is_some() {
        fail!("tie-target", "tensor {name:?} is tied to {:?}, which is tied itself", tie.tensor);
    }
    // rule 2: the grid and the packing
    let grid: &[u64] = base.logical.as_ref().map(|l| l.shape.as_slice()).unwrap_or(w_shape);
    let n = grid.len();
    if w_shape.len() < n {
        fail!("tie-shape", "tensor {name:?}: base {:?} has fewer dimensions than its grid",
              tie.tensor);
    }
    let mut pack = vec![1u64; n];
    for d in 0..n {
        let (l, w) = (grid[d], w_shape[d]);
        if l == 0 && w == 0 {
            continue;
        }
        if l == 0 || w == 0 || l % w != 0 {
            fail!("tie-shape", "tensor {name:?}: base {:?} dimension {d} ({w}) does not divide \
                   its grid ({l})", tie.tensor);
        }
        pack[d] = l / w;
    }
    // rule 3: T's shape is the grid in blocks
    let (block, axes): (Vec<u64>, Vec<u64>) = match &tie.block {
        Some(block) => {
            let axes = tie.axes.clone().unwrap_or_else(|| (0..block.len() as u64).collect());
            (block.clone(), axes)
        }
        None => (Vec::new(), Vec::new()),
    };
    let k = block.len();
    if tie.block.is_some() {
        if axes.len() != k {
            fail!("tie-shape", "tensor {name:?}: axes and block differ in length");
        }
        let distinct: BTreeSet<u64> = axes.iter().copied().collect();
        if distinct.len() != k || axes.iter().any(|a| *a as usize >= n) {
            fail!("tie-shape", "tensor {name:?}: axes {axes:?} are not distinct dimensions of a \
                   grid of {n}");
        }
        if t_shape.len() < k {
            fail!("tie-shape", "tensor {name:?}: shape {t_shape:?} has fewer than {k} dimensions");
        }
        for j in 0..k {
            let want = div_ceil(grid[axes[j] as usize], block[j]);
            if t_shape[j] != want {
                fail!("tie-shape", "tensor {name:?}: dimension {j} is {}, but grid dimension {} \
                       ({}) in blocks of {} is {want}", t_shape[j], axes[j],
                      grid[axes[j] as usize], block[j]);
            }
        }
    } else if crate::dtype::element_count(t_shape) != Some(1) {
        fail!("tie-shape", "tensor {name:?}: a tie without block needs exactly one element, \
               shape is {t_shape:?}");
    }
    // rule 4: placement
    let t_pieces: BTreeMap<u64, &Piece> = t.pieces.iter().map(|p| (p.rank, p)).collect();
    let w_ranks: BTreeSet<u64> = base.pieces.iter().map(|p| p.rank).collect();
    let t_ranks: BTreeSet<u64> = t_pieces.keys().copied().collect();
    if w_ranks != t_ranks {
        fail!("tie-split", "tensor {name:?} has pieces on ranks {t_ranks:?}, its base {:?} on \
               {w_ranks:?}", tie.tensor);
    }
    for wp in &base.pieces {
        let o = wp.offset.as_deref().unwrap();
        let s = &wp.shape;
        let r = wp.rank;
        for d in n..w_shape.len() {
            if o[d] != 0 || s[d] != w_shape[d] {
                fail!("tie-split", "tensor {name:?}: the base's piece on rank {r} cuts inner \
                       dimension {d}");
            }
        }
        let mut want_offset = Vec::new();
        let mut want_shape = Vec::new();
        for j in 0..k {
            let d = axes[j] as usize;
            let b = block[j];
            let lo = o[d] as u128 * pack[d] as u128;
            let hi = (o[d] + s[d]) as u128 * pack[d] as u128;
            let (lo, hi) = (lo as u64, hi as u64); // both <= grid[d] <= MAX_SIZE
            if lo % b != 0 || (hi % b != 0 && hi != grid[d]) {
                fail!("tie-split", "tensor {name:?}: the base's piece on rank {r} spans grid \
                       elements {lo}..{hi} of dimension {d}, not whole blocks of {b}");
            }
            want_offset.push(lo / b);
            want_shape.push(div_ceil(hi, b) - lo / b);
        }
        for &size in t_shape.iter().skip(k) {
            want_offset.push(0);
            want_shape.push(size);
        }
        let tp = t_pieces[&r];
        if tp.offset.as_deref() != Some(want_offset.as_slice()) || tp.shape != want_shape {
            fail!("tie-split", "tensor {name:?}: its piece on rank {r} has offset {:?} and shape \
                   {:?}; the base's piece there gives {want_offset:?} and {want_shape:?}",
                  tp.offset.as_deref().unwrap_or(&[]), tp.shape);
        }
    }
    Ok(())
}

/// SPEC 8.4 for every tied tensor.
pub fn check_ties(m: &Manifest) -> Result<()> {
    let index: HashMap<&str, &Tensor> = m.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    for t in &m.tensors {
        if let Some((shape, Some(tie))) = global_shape(t) {
            check_tie(&index, t, shape, tie)?;
        }
    }
    Ok(())
}
