//! The manifest as typed records, built by the schema check (SPEC 3.1, 5, 6, 7, 8).

#[derive(Debug, Clone)]
pub struct FileRecord {
    pub path: String,
    pub size: u64,
    /// algorithm name -> lowercase hex digest (SPEC 9.2)
    pub checksums: Vec<(String, String)>,
}

#[derive(Debug, Clone)]
pub struct RankRecord {
    pub rank: u64,
    pub tp_rank: u64,
    pub pp_rank: u64,
    pub ep_rank: u64,
    pub files: Vec<FileRecord>,
}

#[derive(Debug, Clone)]
pub struct Layout {
    pub tp_size: u64,
    pub pp_size: u64,
    pub ep_size: u64,
    pub world_size: u64,
    pub rank_order: String,
}

#[derive(Debug, Clone)]
pub struct Piece {
    pub rank: u64,
    pub file: String,
    /// None for a rank-local piece (SPEC 7.5)
    pub offset: Option<Vec<u64>>,
    pub shape: Vec<u64>,
    /// defaults to 0 (SPEC 7.2 rule 1)
    pub replica: u64,
}

#[derive(Debug, Clone)]
pub struct Tie {
    pub tensor: String,
    pub block: Option<Vec<u64>>,
    pub axes: Option<Vec<u64>>,
}

#[derive(Debug, Clone)]
pub struct Logical {
    /// informative for readers (SPEC 8.2 rule 2), but its bit count is bounded (7.1 rule 4)
    pub dtype: String,
    pub shape: Vec<u64>,
}

#[derive(Debug, Clone)]
pub enum TensorKind {
    /// a global tensor with its global shape (SPEC 7.2–7.4)
    Global { shape: Vec<u64>, tied_to: Option<Tie> },
    /// a rank-local tensor (SPEC 7.5)
    RankLocal,
    /// an alias of another tensor (SPEC 7.6)
    Alias { target: String },
}

#[derive(Debug, Clone)]
pub struct Tensor {
    pub name: String,
    pub kind: TensorKind,
    /// empty for an alias
    pub dtype: String,
    pub pieces: Vec<Piece>,
    pub logical: Option<Logical>,
}

#[derive(Debug, Clone)]
pub struct Extension {
    pub name: String,
    pub must_understand: bool,
}

#[derive(Debug, Clone)]
pub struct Manifest {
    /// the MINOR of `format_version`: a manifest is read by its own version's rules (SPEC 4.2
    /// rule 4), so several pieces of a tensor on one rank need 1.3 or later (7.2 rule 3)
    pub minor: u64,
    pub layout: Layout,
    pub ranks: Vec<RankRecord>,
    /// compared only when a caller asks for a method (SPEC 8.3); the adapter never does
    #[allow(dead_code)]
    pub quantization_method: String,
    pub tensors: Vec<Tensor>,
    pub extra_files: Vec<FileRecord>,
    pub extensions: Vec<Extension>,
}
