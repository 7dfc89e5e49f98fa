"""`streamer loadtest`: the live-streaming load client (`client.py`), the real recordings it
streams (`corpus.py`) and how its figures are reported (`report.py`); `benchmarks/` uses the
last two as well."""
