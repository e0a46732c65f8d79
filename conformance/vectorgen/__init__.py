"""The generator of the conformance vectors, by part: hand-made bytes (:mod:`.raw`), checkpoints
in memory and vectors on disk (:mod:`.checkpoints`), the valid bases (:mod:`.bases`), then the
valid vectors (:mod:`.valid`) and the invalid ones, manifest rules (:mod:`.invalid_manifest`)
and data files (:mod:`.invalid_files`). ``conformance/make_vectors.py`` runs it.
"""
