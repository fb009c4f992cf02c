"""qoq: compile LLMs to W4A8KV4 (QServe/QoQ) and run them."""

__version__ = "0.1.0"
FORMAT_VERSION = 1  # artifact format (qoq.json "format_version"); readers refuse others
