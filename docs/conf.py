"""Sphinx configuration of the airflow-provider-gpu documentation (``make docs``; see about-these-docs.md)."""

from __future__ import annotations

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(0, str(DOCS.parent))  # this checkout's gpu_provider, for autodoc and the generated reference

from gpu_provider import __version__  # noqa: E402

project = "airflow-provider-gpu"
author = "airflow-provider-gpu developers"
copyright = "airflow-provider-gpu developers, Apache-2.0"
version = release = __version__

extensions = [
    "myst_parser",  # Markdown pages
    "sphinx.ext.autodoc",  # the reference, from the docstrings
    "gpu_provider_docs",  # the generated reference (config keys, CLI) and the offline link check
]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]

# every cross-reference must resolve (with -W in `make docs`, a broken one fails the build)
nitpicky = True
# names from outside this package that the docstrings mention but no page here documents
nitpick_ignore_regex = [
    (r"py:.*", r"(airflow|datetime|collections|typing|pathlib|pydantic|jinja2|kubernetes|botocore|boto3)(\..*)?"),
    (r"py:class", r"(Any|Sequence|Mapping|Callable|Iterable|Iterator|timedelta|datetime|Path|NoReturn)"),
    # module constants and internal modules the docstrings name; the pages give their values
    (r"py:data", r"(GPU_TYPES|MAX_INTERRUPTIONS|MAX_BACKOFF_S)"),
    (r"py:mod", r"gpu_provider\.spend\.reaper"),
]

# anchors for headings down to ####, so [text](page.md#heading) links are checked
myst_heading_anchors = 4
myst_enable_extensions = ["deflist"]

# signatures without type hints: the :param: text says what each takes (types live in the code)
autodoc_typehints = "none"
autodoc_member_order = "bysource"
autodoc_default_options = {"exclude-members": "__init__, __new__"}

html_theme = "alabaster"
html_title = f"airflow-provider-gpu {release}"
html_static_path: list[str] = []
