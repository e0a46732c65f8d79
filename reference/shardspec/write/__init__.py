"""Tensors -> a committed checkpoint: describe each rank's pieces, plan and check the manifest
before the first byte is written, write the data files, commit the manifest last (SPEC 10).

Imports :mod:`shardspec.format` and :mod:`shardspec.storage`.
"""
