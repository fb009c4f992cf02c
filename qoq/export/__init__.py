"""Artifact export (docs/design.md §4): qweight packing, writer/reader with checksums, inspection."""

from qoq.export.artifact import (
    Artifact,
    ArtifactError,
    is_artifact,
    load_manifest,
    read_artifact,
    verify_artifact,
    write_artifact,
)
from qoq.export.inspect import inspect_artifact, render_inspect
from qoq.export.packing import (
    deinterleave_s2,
    interleave_s2,
    pack_qweight,
    pack_qweight_closed_form,
    unpack_qweight,
)

__all__ = [
    "Artifact",
    "ArtifactError",
    "deinterleave_s2",
    "inspect_artifact",
    "interleave_s2",
    "is_artifact",
    "load_manifest",
    "pack_qweight",
    "pack_qweight_closed_form",
    "read_artifact",
    "render_inspect",
    "unpack_qweight",
    "verify_artifact",
    "write_artifact",
]
