"""Secrets by reference: what a job's ``secrets=`` may name, and the entry that resolves them in the job.

Every remote backend takes ``secrets={"NAME": reference}``, and only the reference travels in the
request to the service: whoever may describe the job reads the reference, never the value. AWS Batch
resolves references itself (``containerProperties.secrets``), Kubernetes through ``secretKeyRef``;
SageMaker has no such field, so its backend puts the references into the job's environment as JSON
(``GPU_PROVIDER_SECRET_REFS``) and runs the command through this module::

    python3 -m gpu_provider.runtime.secrets -- <command> [args...]

which reads each one with the job's own role (boto3 in the image; the training role needs
``secretsmanager:GetSecretValue`` or ``ssm:GetParameter``, and ``kms:Decrypt`` for a customer key),
puts the values into the command's environment and ``exec``s it. It never prints a value: an error
names the variable, the reference and the service's error code only.

An AWS reference is the ARN of a Secrets Manager secret (``arn:aws:secretsmanager:<region>:<account>:
secret:<name>``, optionally followed by ``:<json-key>:<version-stage>:<version-id>`` as in ECS), the
ARN of an SSM parameter (``arn:aws:ssm:<region>:<account>:parameter/<name>``), or an SSM parameter
name starting with ``/`` (``/team/hf-token``, read in the job's region).

Exit status when the command cannot be started: 2 when a reference cannot be read (or for a usage
error), 127 when the command is not found, 126 when it cannot be executed.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpu_provider.names import ENV_SECRET_REFS

USAGE = "usage: python -m gpu_provider.runtime.secrets -- <command> [args...]"
_PREFIX = "gpu_provider.runtime.secrets"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SECRETS_MANAGER = re.compile(r"arn:aws[a-z-]*:secretsmanager:([a-z0-9-]+):(\d{12}):secret:[A-Za-z0-9/_+=.@-]+(:.*)?")
_SSM_ARN = re.compile(r"arn:aws[a-z-]*:ssm:([a-z0-9-]+):(\d{12}):parameter/[A-Za-z0-9/_.-]+")
_SSM_NAME = re.compile(r"/[A-Za-z0-9/_.-]+")
ALLOWED = (
    "the ARN of a Secrets Manager secret (arn:aws:secretsmanager:...), the ARN of an SSM parameter "
    "(arn:aws:ssm:...:parameter/...) or an SSM parameter name starting with '/'"
)


def check_refs(value: Any, field: str = "secrets") -> dict[str, str]:
    """``secrets=`` of an AWS backend: a mapping (or JSON text) of variable names to references.

    Errors name the variable and never echo a value: a value passed here by mistake may be a secret.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"{field} must be a mapping of variable names to references ({ALLOWED}), as a dict or JSON text "
                'like {"HF_TOKEN": "arn:aws:secretsmanager:..."}'
            ) from None
    if not isinstance(value, Mapping):
        raise TypeError(f"{field} ({type(value).__name__}) must be a mapping of variable names to references")
    out: dict[str, str] = {}
    for key, ref in value.items():
        if not isinstance(key, str) or not _NAME.fullmatch(key):
            raise ValueError(f"{field} key {key!r} is not a valid environment variable name")
        if not isinstance(ref, str) or not is_reference(ref):
            raise ValueError(f"{field}[{key!r}] must be {ALLOWED}, not the secret itself")
        out[key] = ref
    return out


def is_reference(ref: str) -> bool:
    return bool(_SECRETS_MANAGER.fullmatch(ref) or _SSM_ARN.fullmatch(ref) or _SSM_NAME.fullmatch(ref))


def resolve(refs: Mapping[str, str], client: Callable[[str, str | None], Any]) -> dict[str, str]:
    """The value behind each reference; ``client(service, region)`` gives a boto3 client.

    Raises ``LookupError`` naming the variable, the reference and the service's error code.
    """
    out: dict[str, str] = {}
    for name, ref in refs.items():
        try:
            out[name] = _read(ref, client)
        except Exception as err:  # botocore's errors, a missing JSON key: named, never the value
            code = getattr(err, "response", {}).get("Error", {}).get("Code") or type(err).__name__
            raise LookupError(f"secrets[{name!r}] = {ref!r} could not be read: {code}") from None
    return out


def _read(ref: str, client: Callable[[str, str | None], Any]) -> str:
    match = _SECRETS_MANAGER.fullmatch(ref)
    if match:
        region, suffix = match.group(1), match.group(3) or ""
        arn = ref[: len(ref) - len(suffix)] if suffix else ref
        key, stage, version = ([*suffix[1:].split(":"), "", "", ""])[:3] if suffix else ("", "", "")
        args: dict[str, str] = {"SecretId": arn}
        if stage:
            args["VersionStage"] = stage
        if version:
            args["VersionId"] = version
        answer = client("secretsmanager", region).get_secret_value(**args)
        text = answer.get("SecretString")
        if text is None:
            raise ValueError("the secret is binary (SecretBinary): give it as a string")
        if key:
            value = json.loads(text)[key]
            return value if isinstance(value, str) else json.dumps(value)
        return str(text)
    match = _SSM_ARN.fullmatch(ref)
    region = match.group(1) if match else None
    answer = client("ssm", region).get_parameter(Name=ref, WithDecryption=True)
    return str(answer["Parameter"]["Value"])


def _boto3_client(service: str, region: str | None) -> Any:
    import boto3

    return boto3.client(service, region_name=region) if region else boto3.client(service)


def main(argv: Sequence[str] | None = None) -> int:
    """Resolve ``GPU_PROVIDER_SECRET_REFS`` into the environment and ``exec`` the command.

    :return: 2, 126 or 127 as described in the module documentation (only when the command cannot start).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--":
        args = args[1:]
    if not args:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        refs = check_refs(os.environ.get(ENV_SECRET_REFS) or None, ENV_SECRET_REFS)
        values = resolve(refs, _boto3_client) if refs else {}
    except ImportError:
        print(f"{_PREFIX}: secrets need boto3 in the job's image: pip install boto3", file=sys.stderr)
        return 2
    except (LookupError, ValueError, TypeError) as err:
        print(f"{_PREFIX}: {err}", file=sys.stderr)
        return 2
    if values:
        print(f"{_PREFIX}: set {', '.join(sorted(values))} from their references", file=sys.stderr)
    child_env = {**os.environ, **values}
    child_env.pop(ENV_SECRET_REFS, None)
    sys.stdout.flush()
    sys.stderr.flush()
    from gpu_provider.runtime.launch import start_command

    def execute() -> int:
        os.execvpe(args[0], args, child_env)  # replaces this process: returns only by raising

    return start_command(_PREFIX, args, execute)


if __name__ == "__main__":
    sys.exit(main())
