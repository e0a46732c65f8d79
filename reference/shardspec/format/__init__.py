"""The rules of the format, from bytes: what a manifest and a data file must be (SPEC 3-9).

Owns the JSON dialect (SPEC 3), the one schema file, the typed manifest and its parsing (with
its fast path), the checks a schema cannot express (layout, files, pieces, coverage, ties),
dtypes, limits, error codes, the safetensors header (SPEC 6), file digests (SPEC 9.2), and the
informative naming rules tools use to choose a layout (routed experts, pipeline stages,
attention heads: `heads.heads_of_rank` is vLLM's rule, shared with the vLLM integration).

Nothing here opens a file by name or knows where a checkpoint lives: it reads bytes and handles
it is given. It imports no other folder of the package; every other folder imports it.
"""
