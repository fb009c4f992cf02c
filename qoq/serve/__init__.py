"""`qoq serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) on the inference engine.

Nothing here imports FastAPI at package import time: `qoq --help` works without the `serve` extra.
"""
