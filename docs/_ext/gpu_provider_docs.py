"""Sphinx extension of these docs: the parts of the reference generated from the code, and the link check.

* ``{gpu-config-options}``: the ``[gpu_provider]`` config keys, read from ``get_provider_info()`` (what
  Airflow itself reads), so a key added to the code is documented by the next build and a removed one
  disappears.
* ``{gpu-cli-reference}``: every ``gpu-provider`` command's ``--help``, from the argparse parser of
  ``gpu_provider/cli.py`` (and the checker's own parser), so the reference is what the command says.
* ``{gpu-known-limits-index}``: a list of every page with a "Known limits" heading (found in the page
  sources at build time), so a page that adds one is listed without editing the known-limits page.
* Offline link check: every external link must be a well-formed ``http(s)://host/...`` URL (nothing is
  fetched: CI has no network). Internal links and anchors are checked by Sphinx and MyST themselves
  (``nitpicky``, ``myst_heading_anchors``) and fail the build under ``-W``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
from typing import Any
from urllib.parse import urlsplit

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)

#: the width the CLI's help is rendered at (argparse wraps at $COLUMNS)
HELP_COLUMNS = 100


def config_options() -> dict[str, dict[str, Any]]:
    """The ``[gpu_provider]`` options as the provider declares them to Airflow."""
    from gpu_provider.get_provider_info import get_provider_info

    options: dict[str, dict[str, Any]] = get_provider_info()["config"]["gpu_provider"]["options"]
    return options


def _help(argv: list[str]) -> str:
    from gpu_provider.cli import main

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(HELP_COLUMNS)
    try:
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([*argv, "--help"])
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue().rstrip() + "\n"


def cli_commands() -> list[tuple[list[str], str]]:
    """``(command path, its --help)`` for ``gpu-provider`` and each of its subcommands, depth first."""
    import argparse

    from gpu_provider.cli import build_parser

    found: list[tuple[list[str], str]] = []

    def walk(parser: argparse.ArgumentParser, path: list[str]) -> None:
        found.append((path, _help(path)))
        for action in parser._actions:  # argparse keeps subcommands here; there is no public accessor
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])

    walk(build_parser(), [])
    return found


def _env_name(key: str) -> str:
    return f"AIRFLOW__GPU_PROVIDER__{key.upper()}"


class ConfigOptions(Directive):
    """A definition list of the ``[gpu_provider]`` options, one anchor ``config-<key>`` each."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        items = nodes.definition_list()
        for key, info in config_options().items():
            term = nodes.term()
            term += nodes.literal(text=key)
            target_id = nodes.make_id(f"config-{key}")
            term["ids"].append(target_id)
            body = nodes.definition()
            body += nodes.paragraph(text=str(info.get("description", "")).strip())
            facts = nodes.bullet_list()
            default = info.get("default")
            shown_default = "empty" if default in (None, "") else str(default)
            for label, value in (
                ("default", shown_default),
                ("type", str(info.get("type", "string"))),
                ("example", info.get("example")),
                ("environment variable", _env_name(key)),
                ("since", info.get("version_added")),
            ):
                if value in (None, ""):
                    continue
                para = nodes.paragraph()
                para += nodes.strong(text=f"{label}: ")
                para += nodes.literal(text=str(value))
                facts += nodes.list_item("", para)
            body += facts
            items += nodes.definition_list_item("", term, body)
        return [items]


class CliReference(Directive):
    """One section per ``gpu-provider`` command with its ``--help``."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for path, text in cli_commands():
            name = " ".join(["gpu-provider", *path])
            section = nodes.section(ids=[nodes.make_id("cli-" + "-".join(path or ["gpu-provider"]))])
            section += nodes.title(text=name)
            section += nodes.literal_block(text, text, language="text")
            out.append(section)
        return out


#: a Markdown heading that opens a page's known limits ("## Known limits", "### Known limits of ...")
_KNOWN_LIMITS = re.compile(r"^#{1,6}\s+Known limits\b.*$", re.M)
_TITLE = re.compile(r"^#\s+(.+)$", re.M)
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)


def pages_with_known_limits(srcdir: str, exclude: str) -> list[tuple[str, str, str]]:
    """``(docname, page title, heading text)`` of every page (but ``exclude``) with a "Known limits" heading."""
    from pathlib import Path

    found = []
    root = Path(srcdir)
    for path in sorted(root.rglob("*.md")):
        rel = path.relative_to(root)
        if rel.parts[0].startswith("_"):
            continue
        docname = rel.with_suffix("").as_posix()
        if docname == exclude:
            continue
        text = _FENCE.sub("", path.read_text(encoding="utf-8"))
        heading = _KNOWN_LIMITS.search(text)
        title = _TITLE.search(text)
        if heading:
            found.append((docname, title.group(1).strip() if title else docname, heading.group(0).lstrip("#").strip()))
    return found


class KnownLimitsIndex(Directive):
    """Links to the "Known limits" sections of the other pages."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from sphinx import addnodes

        env = self.state.document.settings.env
        items = nodes.bullet_list()
        for docname, title, heading in pages_with_known_limits(env.srcdir, env.docname):
            env.note_dependency(str(env.doc2path(docname)))
            para = nodes.paragraph()
            ref = addnodes.pending_xref(
                "", refdomain="std", reftype="doc", reftarget="/" + docname, refexplicit=True, refwarn=True
            )
            ref += nodes.inline(text=title)
            para += ref
            para += nodes.Text(f" ({heading})")
            items += nodes.list_item("", para)
        if not len(items):
            return [nodes.paragraph(text="No other page has a known-limits section.")]
        return [items]


#: what a well-formed external link looks like: a scheme we link to and a host name with a dot
_HOST = re.compile(r"^[A-Za-z0-9.-]+\.[A-Za-z]{2,}(:\d+)?$|^localhost(:\d+)?$")


def malformed_link(uri: str) -> str | None:
    """Why ``uri`` is not a well-formed external link, or ``None`` when it is (nothing is fetched)."""
    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https", "mailto"):
        return f"scheme {parts.scheme!r} (allowed: http, https, mailto)"
    if parts.scheme == "mailto":
        return None if "@" in parts.path else "no address"
    if not _HOST.match(parts.netloc):
        return f"host {parts.netloc!r} is not a host name"
    if any(c.isspace() for c in uri):
        return "contains whitespace"
    return None


def check_external_links(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    for ref in doctree.findall(nodes.reference):
        uri = ref.get("refuri", "")
        if "://" not in uri and not uri.startswith("mailto:"):
            continue
        problem = malformed_link(uri)
        if problem:
            logger.warning("malformed external link %r: %s", uri, problem, location=ref)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("gpu-config-options", ConfigOptions)
    app.add_directive("gpu-cli-reference", CliReference)
    app.add_directive("gpu-known-limits-index", KnownLimitsIndex)
    app.connect("doctree-resolved", check_external_links)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
