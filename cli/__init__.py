"""Command-line interfaces: `leveret` (the server and tools) and `leveret-streams`.

Presentation only: parse, call, render with rich, and exit 1 with one clear line on errors.
"""
