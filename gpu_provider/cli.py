"""The ``gpu-provider`` command line (console script).

Subcommands register themselves in :data:`COMMANDS` (a name and a function that adds its parser), so
a module adds one with a line here::

    gpu-provider pools sync [--dry-run] [--fail-stuck]      team pools in Airflow, from the quota file
    gpu-provider quotas validate [FILE]                     read and check the quota file
    gpu-provider quotas render --batch|--kubernetes|--kueue the services' own quota objects
    gpu-provider emulator batch|sagemaker|kubernetes|ec2    a local emulator, and the settings to paste
    gpu-provider events render --backend batch|sagemaker    the EventBridge rule, queue policy and IAM for events

Exit status: 0 done; 1 an error (the message says which file, field or call); 3 ``pools sync`` found
tasks waiting for a pool that does not exist (and did not fail them).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

#: exit status of ``pools sync`` when tasks wait for a missing pool
EXIT_STUCK = 3
#: environment variables with the Airflow API's credentials (never on the command line, where ps shows them)
ENV_TOKEN = "GPU_PROVIDER_API_TOKEN"
ENV_USERNAME = "GPU_PROVIDER_API_USERNAME"
ENV_PASSWORD = "GPU_PROVIDER_API_PASSWORD"


def _quota_file_arg(parser: argparse.ArgumentParser, positional: bool = False) -> None:
    parser.add_argument(
        "--quota-file",
        metavar="PATH",
        help="the team quota file (default: [gpu_provider] quota_file)",
    )
    if positional:  # `gpu-provider quotas validate FILE`, as people type it
        parser.add_argument("file", nargs="?", metavar="FILE", help="the team quota file (same as --quota-file)")


def _quotas(args: argparse.Namespace) -> Any:
    from gpu_provider.quotas.file import configured_quota_file, load_quotas

    given = getattr(args, "file", None)
    if given and args.quota_file and given != args.quota_file:
        raise ValueError(f"two quota files given: {given} and --quota-file {args.quota_file}; give one")
    path = given or args.quota_file or configured_quota_file()
    if not path:
        raise ValueError("no quota file: pass FILE (or --quota-file) or set [gpu_provider] quota_file")
    return load_quotas(path)


def _api(args: argparse.Namespace) -> Any:
    from gpu_provider.airflow_api import AirflowApi

    if args.api_url:
        return AirflowApi(
            args.api_url,
            username=os.environ.get(ENV_USERNAME) or None,
            password=os.environ.get(ENV_PASSWORD) or None,
            token=os.environ.get(ENV_TOKEN) or None,
        )
    from gpu_provider.backends.base import provider_config

    return AirflowApi.from_connection(args.conn_id or provider_config("reaper_airflow_conn_id") or "airflow_api")


def run_pools_sync(args: argparse.Namespace) -> int:
    from gpu_provider.quotas.pools import PoolSync

    report = PoolSync(_api(args), _quotas(args)).sync(dry_run=args.dry_run, fail_stuck=args.fail_stuck)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print("\n".join(report.lines()))
    if report.stuck and not all(t.failed for t in report.stuck):
        return EXIT_STUCK
    return 0


def _add_pools(sub: Any) -> None:
    pools = sub.add_parser("pools", help="Airflow pools of the teams").add_subparsers(dest="action", required=True)
    sync = pools.add_parser(
        "sync",
        help="create or update one pool gpu_<team> per team (slots = GPUs, include_deferred); deletes nothing",
    )
    _quota_file_arg(sync)
    sync.add_argument("--dry-run", action="store_true", help="show what would change and change nothing")
    sync.add_argument(
        "--fail-stuck",
        action="store_true",
        help="mark tasks waiting for a gpu_* pool that does not exist failed, with a note saying why",
    )
    where = sync.add_mutually_exclusive_group()
    where.add_argument(
        "--api-url",
        metavar="URL",
        help=f"the Airflow API server (credentials from ${ENV_TOKEN}, or ${ENV_USERNAME} and ${ENV_PASSWORD})",
    )
    where.add_argument(
        "--conn-id",
        metavar="ID",
        help="Airflow connection of the API server (default: [gpu_provider] reaper_airflow_conn_id, airflow_api)",
    )
    sync.add_argument("--json", action="store_true", help="print the report as JSON")
    sync.set_defaults(func=run_pools_sync)


def run_quotas_validate(args: argparse.Namespace) -> int:
    quotas = _quotas(args)
    for t in quotas.teams:
        extras = [f"max_priority {t.max_priority}"] if t.max_priority is not None else []
        if t.monthly_budget_usd is not None:
            extras.append(f"${t.monthly_budget_usd:g}/month")
        tail = f" ({', '.join(extras)})" if extras else ""
        print(f"{t.team}: {t.gpus} GPUs, pool {t.pool}, namespace {t.namespace}, share {t.share_identifier}{tail}")
    return 0


def run_quotas_render(args: argparse.Namespace) -> int:
    import yaml

    from gpu_provider.quotas import render

    quotas = _quotas(args)
    if args.target == "batch":
        policy = render.batch_scheduling_policy(
            quotas,
            name=args.policy_name,
            share_decay_seconds=args.share_decay_seconds,
            compute_reservation=args.compute_reservation,
        )
        print(json.dumps(policy, indent=2))
        return 0
    docs = render.resource_quotas(quotas) if args.target == "kubernetes" else render.kueue_queues(quotas)
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


def _add_quotas(sub: Any) -> None:
    quotas = sub.add_parser("quotas", help="the team quota file").add_subparsers(dest="action", required=True)
    validate = quotas.add_parser("validate", help="read the quota file, check every rule and list the teams")
    _quota_file_arg(validate, positional=True)
    validate.set_defaults(func=run_quotas_validate)
    rend = quotas.add_parser("render", help="print the quota file as a service's own quota objects")
    _quota_file_arg(rend, positional=True)
    target = rend.add_mutually_exclusive_group(required=True)
    target.add_argument(
        "--batch",
        dest="target",
        action="store_const",
        const="batch",
        help="AWS Batch fair-share scheduling policy (CreateSchedulingPolicy JSON)",
    )
    target.add_argument(
        "--kubernetes",
        dest="target",
        action="store_const",
        const="kubernetes",
        help="a ResourceQuota on requests.nvidia.com/gpu per team namespace (YAML)",
    )
    target.add_argument(
        "--kueue",
        dest="target",
        action="store_const",
        const="kueue",
        help="Kueue ResourceFlavor, ClusterQueue and LocalQueue per team (YAML)",
    )
    rend.add_argument("--policy-name", default="gpu-teams", help="Batch scheduling policy name (default gpu-teams)")
    rend.add_argument("--share-decay-seconds", type=int, default=3600, help="Batch shareDecaySeconds (default 3600)")
    rend.add_argument("--compute-reservation", type=int, default=0, help="Batch computeReservation (default 0)")
    rend.set_defaults(func=run_quotas_render)


def run_check(rest: Sequence[str]) -> int:
    from gpu_provider.testing.check import main as check_main

    return check_main(rest, prog="gpu-provider check")


def _add_check(sub: Any) -> None:
    check = sub.add_parser(
        "check",
        add_help=False,  # its own options (--dag, --interrupt-after, ... -- PROGRAM) pass through: see -h
        help="check a job program (SIGTERM, checkpoint, resume, output) and a DAG's checkpoint URIs offline",
    )
    check.add_argument("rest", nargs=argparse.REMAINDER)  # main() hands everything after "check" to it


def run_emulator(rest: Sequence[str]) -> int:
    try:
        from gpu_provider.testing.emulators.serve import main as emulator_main
    except ImportError as err:  # moto or the kubernetes client missing
        print(
            f"gpu-provider: error: the emulators need the testing extra ({err}): "
            "pip install 'airflow-provider-gpu[testing]'",
            file=sys.stderr,
        )
        return 1
    return emulator_main(rest, prog="gpu-provider emulator")


def _add_emulator(sub: Any) -> None:
    emulator = sub.add_parser(
        "emulator",
        add_help=False,  # its own options pass through: see gpu-provider emulator -h
        help="start a local emulator (batch, sagemaker, kubernetes, ec2) and print the settings to paste",
    )
    emulator.add_argument("rest", nargs=argparse.REMAINDER)


def run_events_render(args: argparse.Namespace) -> int:
    from gpu_provider.backends.aws.events import render

    plan = render(args.backend, queue_arn=args.queue_arn, rule_name=args.rule_name, job_queues=args.job_queue)
    print(json.dumps(plan, indent=2))
    return 0


def _add_events(sub: Any) -> None:
    events = sub.add_parser("events", help="the services' job events (EventBridge to SQS)").add_subparsers(
        dest="action", required=True
    )
    rend = events.add_parser(
        "render",
        help="print (JSON, no AWS call) the EventBridge rule, the SQS queue's attributes and policy, the IAM "
        "statements of the triggerer's role and the [gpu_provider] setting for a backend's events",
    )
    rend.add_argument("--backend", required=True, choices=["batch", "sagemaker"], help="whose job events")
    rend.add_argument(
        "--queue-arn", required=True, metavar="ARN", help="the SQS queue's ARN: arn:aws:sqs:REGION:ACCOUNT:NAME"
    )
    rend.add_argument(
        "--rule-name", default="gpu-provider-job-events", help="the EventBridge rule's name (default %(default)s)"
    )
    rend.add_argument(
        "--job-queue",
        action="append",
        metavar="QUEUE",
        help="batch: a job queue (name or ARN) whose jobs the rule matches; repeat for more (default: the queues "
        "of [gpu_provider] batch_spot_queue, batch_on_demand_queue and batch_queues_by_instance_type)",
    )
    rend.set_defaults(func=run_events_render)


#: (name, adds its parser to the subcommands): one line per command group
COMMANDS: list[tuple[str, Callable[[Any], None]]] = [
    ("pools", _add_pools),
    ("quotas", _add_quotas),
    ("check", _add_check),
    ("emulator", _add_emulator),
    ("events", _add_events),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-provider", description="airflow-provider-gpu command line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _name, add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["check"]:  # the checker parses its own options (argparse would take its --help)
        return run_check(given[1:])
    if given[:1] == ["emulator"]:
        return run_emulator(given[1:])
    args = build_parser().parse_args(given)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("gpu-provider: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # one line for the person at the terminal; no traceback for a user's mistake
        if not _users_mistake(err):
            raise
        print(f"gpu-provider: error: {err}", file=sys.stderr)
        return 1


def _users_mistake(err: Exception) -> bool:
    """A bad file, value or connection, or a server that cannot be reached: said in one line. Anything else
    is a bug of ours and keeps its traceback."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    from gpu_provider.airflow_api import AirflowApiError

    return isinstance(err, (ValueError, OSError, AirflowApiError, AirflowNotFoundException))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
