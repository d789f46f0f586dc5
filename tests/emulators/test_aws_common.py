"""What the AWS emulators share (gpu_provider/testing/emulators/aws_common.py): the one-per-process lifecycle."""

from __future__ import annotations

import pytest

from gpu_provider.testing.emulators.aws_batch import BatchEmulator
from gpu_provider.testing.emulators.aws_common import OnePerProcess
from gpu_provider.testing.emulators.aws_ec2 import Ec2SpotEmulator
from gpu_provider.testing.emulators.aws_sagemaker import SageMakerEmulator


def test_an_emulator_must_say_how_it_starts_and_stops() -> None:
    class HalfDone(OnePerProcess):
        _one_of = "half-done"

        def _start(self) -> None:
            pass

    # caught when the class is used, not when start() or stop() is first called on a running emulator
    with pytest.raises(TypeError, match=r"abstract method '?_stop"):
        HalfDone()  # type: ignore[abstract]


@pytest.mark.parametrize("emulator", [BatchEmulator, SageMakerEmulator, Ec2SpotEmulator], ids=lambda c: c.__name__)
def test_every_aws_emulator_implements_the_lifecycle(emulator: type[OnePerProcess]) -> None:
    assert issubclass(emulator, OnePerProcess)
    assert not getattr(emulator, "__abstractmethods__", frozenset()), emulator.__abstractmethods__
