"""The fixtures and options every test folder shares, from ``tests/helpers/`` (on the path by
``pythonpath`` in pyproject.toml): ``checkpoints.py`` (a tiny checkpoint, manifest edits, the
hypothesis profiles, the command-line options) and ``s3_server.py`` (a local S3 server: the
``s3_server`` and ``s3_bucket`` fixtures)."""

pytest_plugins = ["checkpoints", "s3_server"]
