"""What a check run found: the named checks, one finding per check, and the report that gathers them."""

from __future__ import annotations

from dataclasses import dataclass, field

#: the named checks, in the order they are reported
CHECKS = {
    "checkpoint": "writes checkpoints to GPU_PROVIDER_CHECKPOINT_URI",
    "sigterm": "honours SIGTERM by saving a checkpoint and stopping",
    "resume": "resumes from GPU_PROVIDER_RESUME_FROM",
    "newest": "resumes from the newest checkpoint on a restart",
    "output": "declares its output",
    "unique_uri": "checkpoint URI unique per run",
    "reaper_scope": "every ladder rung swept by the reaper configured here",
}


@dataclass
class Finding:
    """One check's outcome: ``ok`` is True (passed), False (failed) or None (could not tell)."""

    check: str
    ok: bool | None
    message: str
    subject: str = ""

    def line(self) -> str:
        mark = {True: "PASS", False: "FAIL", None: "????"}[self.ok]
        what = CHECKS.get(self.check, self.check)
        return f"[{mark}] {f'{self.subject}: ' if self.subject else ''}{what}: {self.message}"


@dataclass
class CheckReport:
    """Every finding of one check run, with the logs of the program's runs."""

    findings: list[Finding] = field(default_factory=list)
    logs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """No check failed (a check that could not tell does not fail the report)."""
        return all(f.ok is not False for f in self.findings)

    def __getitem__(self, check: str) -> Finding:
        for finding in self.findings:
            if finding.check == check:
                return finding
        raise KeyError(f"no finding {check!r}; checked: {[f.check for f in self.findings]}")

    def failed(self) -> list[Finding]:
        return [f for f in self.findings if f.ok is False]

    def text(self) -> str:
        lines = [f.line() for f in self.findings]
        verdict = "all checks passed" if self.ok else f"{len(self.failed())} check(s) failed"
        return "\n".join([*lines, verdict])
