"""File helpers shared by the example job programs (data lives at ``file://`` URIs or plain paths)."""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

try:
    import numpy as np
except ModuleNotFoundError as err:  # job-side code only: a clear message instead of a traceback
    raise SystemExit(
        "error: the example job programs need numpy: pip install 'airflow-provider-gpu[examples]'"
    ) from err

# The stage modules take ``np`` from here, so the missing-numpy message lives in one place.
__all__ = ["as_uri", "np", "uri_to_path", "write_json", "write_npz"]


def uri_to_path(uri: str) -> Path:
    """Map a ``file://`` URI or a plain path to a local path (these examples do not read or write ``s3://`` data).

    :param uri: a ``file://`` URI or a plain path.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "":
        return Path(uri)
    raise SystemExit(f"error: {uri!r}: this example reads and writes only file:// URIs and plain paths")


def as_uri(location: str) -> str:
    """The URI to declare for an output location: URIs as given, plain paths as absolute ``file://`` URIs.

    :param location: a URI or a plain path.
    """
    return location if urlparse(location).scheme else Path(location).resolve().as_uri()


def write_npz(path: Path, arrays: Mapping[str, np.ndarray[Any, Any]]) -> None:
    """Like ``np.savez``, but byte-for-byte reproducible (fixed member timestamps) and written atomically.

    :param path: the ``.npz`` file to write.
    :param arrays: the arrays, by name.
    """
    tmp = path.with_name(path.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, array in arrays.items():
            member = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(member, "w", force_zip64=True) as stream:
                np.lib.format.write_array(stream, np.asarray(array), allow_pickle=False)
    os.replace(tmp, path)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as stable, human-readable JSON, atomically.

    :param path: the file to write.
    :param data: JSON-serialisable values.
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)
