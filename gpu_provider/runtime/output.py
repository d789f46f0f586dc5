"""Tell the backend where the job put its output (a model, predictions, a report)."""

from __future__ import annotations

import os
import secrets

from gpu_provider.names import ENV_OUTPUT_FILE

#: start of the line :func:`declare_output` prints; backends look for it in the job's logs
OUTPUT_LINE_PREFIX = "gpu_provider: output_uri="


def declare_output(uri: str) -> None:
    """Record the job's output location, for the backend to put into the task's result.

    Writes ``uri`` to the file named by ``GPU_PROVIDER_OUTPUT_FILE`` when that is set (atomically:
    a temporary file in the same folder, then a rename), and always prints one line
    ``gpu_provider: output_uri=<uri>`` to stdout, flushed, for backends that only see the logs.
    Calling it again replaces the recorded location.

    :param uri: where the output is, e.g. ``s3://bucket/models/run-42/``.
    :raises ValueError: ``uri`` is empty or spans several lines.
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ValueError(f"output URI must be a non-empty string, got {uri!r}")
    if "\n" in uri or "\r" in uri:
        raise ValueError(f"output URI must be a single line, got {uri!r}")

    path = os.environ.get(ENV_OUTPUT_FILE, "").strip()
    if path:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        temp = os.path.join(directory, f".tmp-{os.path.basename(path)}-{secrets.token_hex(4)}")
        try:
            with open(temp, "w", encoding="utf-8") as handle:
                handle.write(uri)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise

    print(f"{OUTPUT_LINE_PREFIX}{uri}", flush=True)
