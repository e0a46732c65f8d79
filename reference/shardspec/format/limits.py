"""Every limit a shardspec reader enforces, each next to the SPEC section that sets it.

SPEC.md section 12 lists the same numbers; ``tests/docs/test_spec_agreement.py`` holds the two
together.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_FILE_SIZE",
    "MANIFEST_NAME",
    "MAX_DIMS",
    "MAX_JSON_DEPTH",
    "MAX_MANIFEST_BYTES",
    "MAX_NAME_BYTES",
    "MAX_PATH_BYTES",
    "MAX_SAFETENSORS_HEADER_BYTES",
    "MAX_SIZE",
    "MAX_WORLD_SIZE",
    "SUPPORTED_MAJOR",
    "SUPPORTED_MINOR",
]

#: SPEC 2.1: the manifest's file name at the checkpoint root; its presence commits the checkpoint.
MANIFEST_NAME = "shardspec.json"

#: SPEC 4.1: the format version this implementation reads and writes.
SUPPORTED_MAJOR = 1
SUPPORTED_MINOR = 3

#: SPEC 3.4: largest manifest a reader must accept, in bytes (256 MiB since format 1.1; 64 MiB
#: in 1.0, too small for a million-piece mixture of experts).
MAX_MANIFEST_BYTES = 256 * 1024 * 1024

#: SPEC 3.4: deepest nesting of JSON arrays and objects in a manifest.
MAX_JSON_DEPTH = 64

#: SPEC 6.3: largest safetensors JSON header, in bytes (the safetensors library's own cap).
MAX_SAFETENSORS_HEADER_BYTES = 100_000_000

#: SPEC 7.1: most dimensions a tensor may have.
MAX_DIMS = 64

#: SPEC 7.1: longest tensor name, in UTF-8 bytes.
MAX_NAME_BYTES = 1024

#: SPEC 2.2: longest relative path, in UTF-8 bytes.
MAX_PATH_BYTES = 1024

#: SPEC 5.1: largest world size (and so the most pieces one tensor can have).
MAX_WORLD_SIZE = 65536

#: SPEC 12: every size, element count and byte count is below 2**63; arithmetic that would
#: pass it is an error, never a wrap-around.
MAX_SIZE = 2**63 - 1

#: SPEC 6.1: the reference writer's default cap on one data file (a SHOULD, not a reader limit).
DEFAULT_MAX_FILE_SIZE = 5 * 1024**3
