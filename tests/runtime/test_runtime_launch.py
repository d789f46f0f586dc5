"""python -m gpu_provider.runtime.launch: normalises the rendezvous variables, runs the command, marks the end."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

from gpu_provider import names

PRINT_ENV_AND_EXIT_7 = (
    "import json, os, sys; "
    "names = ('NNODES', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'SM_HOSTS'); "
    "print(json.dumps({k: os.environ.get(k) for k in names})); "
    "sys.exit(7)"
)

Runner = Callable[..., subprocess.CompletedProcess[str]]
EnvFactory = Callable[..., dict[str, str]]


def test_writes_the_four_variables_and_passes_the_exit_code(run_python: Runner, child_env: EnvFactory) -> None:
    hosts = json.dumps(["algo-1", "algo-2"])
    env = child_env(SM_HOSTS=hosts, SM_CURRENT_HOST="algo-2")
    result = run_python(
        ["-m", "gpu_provider.runtime.launch", "--", sys.executable, "-c", PRINT_ENV_AND_EXIT_7], env=env
    )
    assert result.returncode == 7, result.stderr
    *output, last = result.stdout.strip().splitlines()
    seen = json.loads(output[-1])
    # the last line marks the end of this node's log, with the command's exit status
    assert last == "gpu_provider: end-of-log node=1 nnodes=2 exit=7"
    assert seen == {
        "NNODES": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "algo-1",
        "MASTER_PORT": "29500",
        "SM_HOSTS": hosts,
    }
    assert "NNODES=2 NODE_RANK=1 MASTER_ADDR=algo-1 MASTER_PORT=29500" in result.stderr


def test_without_a_command_prints_usage(run_python: Runner, child_env: EnvFactory) -> None:
    result = run_python(["-m", "gpu_provider.runtime.launch", "--"], env=child_env())
    assert result.returncode == 2
    assert "usage: python -m gpu_provider.runtime.launch -- <command>" in result.stderr


def test_bad_environment_fails_before_running_the_command(run_python: Runner, child_env: EnvFactory) -> None:
    env = child_env(NODE_RANK="first")
    result = run_python(["-m", "gpu_provider.runtime.launch", "--", sys.executable, "-c", "print('ran')"], env=env)
    assert result.returncode == 2
    assert "NODE_RANK='first' is not an integer" in result.stderr
    assert "ran" not in result.stdout


def test_unknown_command_exits_127(run_python: Runner, child_env: EnvFactory) -> None:
    result = run_python(["-m", "gpu_provider.runtime.launch", "--", "no-such-command-gpu-provider"], env=child_env())
    assert result.returncode == 127
    assert "command not found: 'no-such-command-gpu-provider'" in result.stderr


def test_a_stop_reaches_the_command_and_the_end_is_still_marked(child_env: EnvFactory) -> None:
    code = (
        "import os, signal, time; signal.signal(signal.SIGTERM, lambda *a: os._exit(5)); "
        "print('ready', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_provider.runtime.launch", "--", sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        proc.terminate()  # to the helper alone: it passes the signal on
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 5
    assert out.strip().splitlines()[-1] == "gpu_provider: end-of-log node=0 nnodes=1 exit=5"


XID_AND_FAIL = (
    "import sys; print('step 12', flush=True); "
    "print('NVRM: Xid (PCI:0000:3b:00): 79, pid=2811, GPU has fallen off the bus.', file=sys.stderr, flush=True); "
    "sys.exit(1)"
)


def test_a_gpu_fault_in_the_output_of_a_failed_command_becomes_its_exit_code(
    run_python: Runner, child_env: EnvFactory
) -> None:
    result = run_python(
        ["-m", "gpu_provider.runtime.launch", "--", sys.executable, "-c", XID_AND_FAIL], env=child_env()
    )
    assert result.returncode == names.NODE_FAULT_EXIT_CODES[names.FAULT_GPU_LOST], result.stderr
    # the output still reaches the log, where it was written
    assert "step 12" in result.stdout and "GPU has fallen off the bus" in result.stderr
    assert result.stdout.strip().splitlines()[-1] == "gpu_provider: end-of-log node=0 nnodes=1 exit=1 fault=gpu_lost"


def test_a_command_that_succeeds_despite_a_gpu_message_keeps_its_status(
    run_python: Runner, child_env: EnvFactory
) -> None:
    code = XID_AND_FAIL.replace("sys.exit(1)", "sys.exit(0)")
    result = run_python(["-m", "gpu_provider.runtime.launch", "--", sys.executable, "-c", code], env=child_env())
    assert result.returncode == 0
    assert result.stdout.strip().splitlines()[-1] == "gpu_provider: end-of-log node=0 nnodes=1 exit=0"
