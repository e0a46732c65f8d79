"""Where a checkpoint's bytes live: a local directory or an object-storage prefix (SPEC 2, 10).

Owns opening files inside a checkpoint directory and only there (SPEC 2.2), turning a path or
URL into a location, object storage through fsspec (ranged reads, versions, retries), reading
the manifest of a location, and the commit rule: data first, the manifest last (SPEC 10).

Imports :mod:`shardspec.format` only.
"""
