"""A rank's plan of reads -> its tensors on a device (SPEC 11).

Owns the plan (which files a rank reads and what each must hold), the reads themselves (large
sequential reads, memory maps, object-storage requests), host memory, the pinned staging ring
that overlaps reads with host-to-device copies, and choosing the device.

Imports :mod:`shardspec.format` and :mod:`shardspec.storage`.
"""
