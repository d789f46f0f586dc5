"""declare_output(): the output file and the log line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_provider.runtime import declare_output


def test_writes_the_file_and_prints_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "meta" / "output"
    monkeypatch.setenv("GPU_PROVIDER_OUTPUT_FILE", str(target))
    declare_output("s3://bucket/models/run-1/")
    declare_output("s3://bucket/models/run-2/")  # the last declaration wins
    assert target.read_text() == "s3://bucket/models/run-2/"
    assert sorted(p.name for p in target.parent.iterdir()) == ["output"]  # no temporary files left
    assert capsys.readouterr().out.splitlines() == [
        "gpu_provider: output_uri=s3://bucket/models/run-1/",
        "gpu_provider: output_uri=s3://bucket/models/run-2/",
    ]


def test_without_output_file_only_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPU_PROVIDER_OUTPUT_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    declare_output("file:///data/out")
    assert capsys.readouterr().out == "gpu_provider: output_uri=file:///data/out\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("uri", ["", "   ", "s3://a\ns3://b"])
def test_rejects_empty_or_multiline(uri: str) -> None:
    with pytest.raises(ValueError, match="output URI must be"):
        declare_output(uri)
