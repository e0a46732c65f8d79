"""Engines plugging shardspec in from above: serving engines and training frameworks.

Each module here adapts one engine's loading or saving interface to :mod:`shardspec`'s public
reader and writer; it may import anything below it, and nothing in the package imports it.
"""
