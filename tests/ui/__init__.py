"""Browser tests of the web UI (see conftest.py)."""
