"""A capacity ladder across services (and regions): each rung names a backend, a capacity and its overrides.

``Ladder`` is a :class:`~gpu_provider.capacity.CapacityPolicy` whose rungs are not only a capacity type but a
place: spot on AWS Batch, then managed spot on SageMaker, then on-demand on SageMaker (or the same service in
another region, through the rung's own connection, region, queue or role). Every rung reads and writes one
checkpoint location (an ``s3://`` URI), so an attempt on one service resumes from the step the attempt before
reached on another: the checkpoint layout and the runtime helper are the same on every backend.

The decisions:

- the first attempt runs on rung 0;
- every interruption the budget counts (a spot reclaim, a capacity timeout, a restart SageMaker made inside an
  attempt, a job the service lost) moves the next attempt to the rung after the one it ran on; the last rung
  takes every attempt after it reached there;
- composed with ``instances=InstanceFallback(...)``: each rung tries its instance types (the rung's
  ``instance_types``, else the task's ``resources.instance_types``) in order, each with its own capacity wait; a
  capacity timeout on a type that is not the rung's last one moves to the next type *on the same rung*; a timeout
  on the last type, or a spot reclaim, moves to the next rung, at its first type;
- composed with ``spot_return=SpotReturn(...)``: while an attempt runs on an on-demand rung, the wait reads spot
  capacity of the spot rung the job was last on (its instance types, its connection and region); when spot
  returns and pays, the attempt checkpoints and stops (a planned move, no interruption) and the next attempt runs
  on that spot rung; a later reclaim there moves on to the rung after it;
- a GPU hardware fault (``node_fault``) does not move: it is resubmitted on the same rung, on fresh hardware,
  within ``max_node_faults``;
- a job's own failure goes to Airflow's retries, which continue on the rung the run had reached;
- ``max_interruptions`` (default: enough to reach the last rung and be interrupted there once more), ``backoff``
  and ``max_node_faults`` are :class:`~gpu_provider.capacity.CapacityPolicy`'s.

Each rung is validated at parse time with its backend's own validation (:meth:`Ladder.validate_rungs`), and a
checkpoint that a remote rung could not read is refused (:meth:`Ladder.check_checkpoint`). See
``docs/explanations/capacity-policies.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from gpu_provider.capacity.policies import _DEFAULT_SPOT_WAIT_S, CapacityPolicy, Interruption
from gpu_provider.job import safe_repr, to_seconds
from gpu_provider.names import ON_DEMAND, SPOT

if TYPE_CHECKING:
    from gpu_provider.backends.base import Backend
    from gpu_provider.capacity.instances import Rung
    from gpu_provider.job import GpuResources

#: how a rung may write its capacity, and what it means
_CAPACITIES = {"spot": SPOT, "on_demand": ON_DEMAND, "on-demand": ON_DEMAND}
#: the most rungs a ladder may have (each one is at least one attempt)
MAX_RUNGS = 10
#: backends that run jobs on the worker's own machine (they may read a ``file://`` checkpoint)
LOCAL_BACKENDS = frozenset({"local"})


class LadderRung:
    """One rung of a :class:`Ladder`: where an attempt runs (a backend and its options) and on which capacity.

    :param backend: a registered backend name (``"batch"``, ``"sagemaker"``, ``"kubernetes"``, ``"local"``), or a
        mapping ``{"name": "batch", **options}`` as ``GpuJobOperator(backend=...)`` takes.
    :param capacity: ``"spot"`` or ``"on_demand"``.
    :param image: the container image of this rung's attempts (default: the task's ``image=``).
    :param instance_types: the instance types this rung's attempts may run on (default: the task's
        ``resources.instance_types``); services name them differently (``p4d.24xlarge`` on Batch,
        ``ml.p4d.24xlarge`` on SageMaker), so a rung on another service usually gives its own.
    :param options: the backend's options for this rung (``spot_queue=``, ``role_arn=``, ``region_name=``,
        ``aws_conn_id=``, ...): another region is a rung with its own connection, region, queue or role.
    """

    def __init__(
        self,
        backend: str | Mapping[str, Any],
        capacity: str,
        *,
        image: str | None = None,
        instance_types: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        self.backend_name, base = _backend_parts(backend)
        self.options: dict[str, Any] = {**base, **options}
        if not isinstance(capacity, str) or capacity.strip().lower() not in _CAPACITIES:
            raise ValueError(f"capacity={safe_repr(capacity)} is not a rung capacity; allowed: 'spot', 'on_demand'")
        self.capacity = _CAPACITIES[capacity.strip().lower()]
        if image is not None and (not isinstance(image, str) or not image.strip()):
            raise ValueError(f"image={safe_repr(image)} must be a non-empty image name, or None for the task's image")
        self.image = image
        if instance_types is not None:
            if isinstance(instance_types, str) or not all(isinstance(t, str) and t for t in instance_types):
                raise TypeError(
                    f"instance_types={safe_repr(instance_types)} must be a list of instance type names, "
                    "e.g. ['ml.p4d.24xlarge']"
                )
            instance_types = tuple(instance_types)
        self.instance_types: tuple[str, ...] | None = instance_types

    def backend_spec(self) -> dict[str, Any]:
        """The mapping form of this rung's backend (what ``resolve_backend`` takes)."""
        return {"name": self.backend_name, **self.options}

    def build(self) -> Backend:
        """This rung's backend object (cheap: no client, no network)."""
        from gpu_provider.backends.base import resolve_backend

        return resolve_backend(self.backend_spec())

    @property
    def remote(self) -> bool:
        """Whether this rung's jobs run away from the worker (they cannot read its files)."""
        return self.backend_name not in LOCAL_BACKENDS

    def describe(self) -> str:
        where = ", ".join(f"{k}={v!r}" for k, v in self.options.items() if k in _WHERE_OPTIONS)
        return f"{self.backend_name} {self.capacity}" + (f" ({where})" if where else "")

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and vars(self) == vars(other)

    def __hash__(self) -> int:
        return hash((self.backend_name, self.capacity, self.image, self.instance_types))

    def __repr__(self) -> str:
        extra = "".join(
            f", {k}={v!r}" for k, v in (("image", self.image), ("instance_types", self.instance_types)) if v
        )
        opts = "".join(f", {k}={v!r}" for k, v in self.options.items())
        return f"LadderRung({self.backend_name!r}, {self.capacity!r}{extra}{opts})"


#: the options that say where a rung runs (shown in messages); others (roles, secrets) are left out
_WHERE_OPTIONS = ("region_name", "aws_conn_id", "spot_queue", "on_demand_queue", "namespace")


def _backend_parts(backend: Any) -> tuple[str, dict[str, Any]]:
    """A rung's ``backend``: its registered name (checked now, without importing it) and the options it carries."""
    from gpu_provider.backends.base import check_backend_name

    if isinstance(backend, Mapping):
        options = dict(backend)
        name = options.pop("name", None)
    else:
        name, options = backend, {}
    if not isinstance(name, str) or not name.strip():
        raise TypeError(
            f"backend={safe_repr(backend)} must be a backend name ('batch', 'sagemaker', 'kubernetes', 'local') "
            "or a mapping with a 'name' key"
        )
    check_backend_name(name.strip())
    return name.strip(), options


def _rung(index: int, value: Any) -> LadderRung:
    if isinstance(value, LadderRung):
        return value
    if isinstance(value, Mapping):
        try:
            return LadderRung(**value)
        except (TypeError, ValueError) as err:
            raise type(err)(f"capacity.rungs[{index}]: {err}") from err
    raise TypeError(
        f"capacity.rungs[{index}]={safe_repr(value)} ({type(value).__name__}) must be LadderRung(backend, capacity, "
        "...) or a mapping of its arguments"
    )


def _check_spot_return_rungs(rungs: Sequence[LadderRung]) -> None:
    """``Ladder(spot_return=...)`` moves an attempt on an on-demand rung back to a spot rung: it needs both."""
    capacities = [r.capacity for r in rungs]
    if SPOT not in capacities or ON_DEMAND not in capacities:
        described = ", ".join(r.describe() for r in rungs)
        missing = "spot" if SPOT not in capacities else "on_demand"
        raise ValueError(
            f"capacity.spot_return=SpotReturn(...) on a Ladder whose rungs are [{described}]: it moves an attempt on "
            f"an on-demand rung back to a spot rung, and this ladder has no {missing} rung; allowed: a ladder with "
            "at least one 'spot' and one 'on_demand' rung, or spot_return=None"
        )


class Ladder(CapacityPolicy):
    """Rungs on several backends (or regions), tried in order, one checkpoint for all of them.

    Example: spot on Batch, then managed spot on SageMaker, then on-demand on SageMaker::

        Ladder(
            LadderRung("batch", "spot", instance_types=["p4d.24xlarge"]),
            LadderRung("sagemaker", "spot", instance_types=["ml.p4d.24xlarge"]),
            LadderRung("sagemaker", "on_demand", instance_types=["ml.p4d.24xlarge"]),
        )

    :param rungs: :class:`LadderRung` objects (or mappings of their arguments), 1 to 10 (``MAX_RUNGS``).
    :param spot_wait_timeout: how long an attempt on a spot rung may wait for capacity before it is given up and
        the next rung runs (a timedelta or seconds; default 30 minutes; ``None`` waits forever).
    :param max_interruptions: default ``len(rungs)``: every rung is reached, and the last one may be interrupted
        once more; with ``instances=``, one more for each further instance type a rung names (a rung that uses the
        task's types counts one: raise it yourself then). Also ``backoff`` and ``max_node_faults``
        (:class:`~gpu_provider.CapacityPolicy`).
    :param instances: an :class:`~gpu_provider.InstanceFallback`: each rung tries its instance types in order, the
        next type on the same rung when capacity for one does not come; then the next rung.
    :param spot_return: a :class:`~gpu_provider.SpotReturn`: an attempt on an on-demand rung moves back to the spot
        rung the job was last on when spot returns there and saves enough. Needs a spot and an on-demand rung.
    """

    name = "ladder"

    def __init__(
        self,
        *rungs: LadderRung | Mapping[str, Any],
        spot_wait_timeout: Any = timedelta(seconds=_DEFAULT_SPOT_WAIT_S),
        **kwargs: Any,
    ) -> None:
        if len(rungs) == 1 and isinstance(rungs[0], (list, tuple)):
            rungs = tuple(rungs[0])
        if not rungs:
            raise ValueError("Ladder() needs at least one rung, e.g. Ladder(LadderRung('batch', 'spot'), ...)")
        if len(rungs) > MAX_RUNGS:
            raise ValueError(f"Ladder(...) has {len(rungs)} rungs; at most {MAX_RUNGS} are allowed")
        spot_return = kwargs.pop("spot_return", None)
        parsed = tuple(_rung(i, r) for i, r in enumerate(rungs))
        if kwargs.get("instances") is not None and "max_interruptions" not in kwargs:
            # each instance type a rung names may take its own capacity timeout before the rung moves on
            kwargs["max_interruptions"] = sum(max(1, len(r.instance_types or ())) for r in parsed)
        kwargs.setdefault("max_interruptions", len(rungs))
        super().__init__(**kwargs)
        self.rungs: tuple[LadderRung, ...] = parsed
        from gpu_provider.capacity.spot_return import check_spot_return

        self.spot_return = check_spot_return(spot_return)
        if self.spot_return is not None:
            _check_spot_return_rungs(self.rungs)
        self._spot_wait_s = to_seconds("capacity.spot_wait_timeout", spot_wait_timeout)

    # --- the policy's decisions ----------------------------------------------------------------
    def types_for(self, index: int | None, instance_types: Sequence[str] = ()) -> tuple[str, ...]:
        """The instance types of rung ``index``: its own ``instance_types``, else the task's."""
        rung = self.rung(index)
        if rung is not None and rung.instance_types is not None:
            return rung.instance_types
        return tuple(instance_types)

    def rung_index(self, interruptions: Sequence[Interruption]) -> int:
        """The rung of the next attempt (:meth:`rung_after`'s)."""
        index = self.rung_after(interruptions).rung
        return 0 if index is None else index

    def first_capacity(self) -> str:
        return self.rungs[0].capacity

    def capacity_after(self, interruptions: Sequence[Interruption]) -> str:
        return self.rung_after(interruptions).capacity

    def rung_after(self, interruptions: Sequence[Interruption], instance_types: Sequence[str] = ()) -> Rung:
        """The rung (and, under ``instances=``, the instance type) of the next attempt.

        Walked interruption by interruption, oldest first, from rung 0 and its first type:

        - a capacity timeout on a type of a rung that has a next type is the instance fallback's to absorb:
          the same rung, its next type;
        - any other interruption (a spot reclaim, a timeout on the rung's last type, a job the service lost)
          moves to the rung *after the one the attempt ran on* (its ``rung``), at its first type; a restart the
          service made inside an attempt counts once more (an attempt restarted twice on rung 1 leads to
          rung 3); the last rung takes every attempt after it reached there. So after a move back to spot
          (which is no interruption), a reclaim on that spot rung leads to the rung after it, not to the rung
          the number of interruptions would name;
        - an interruption without a rung (a record older than the ladder) moves one rung down from where the
          walk is.
        """
        from gpu_provider.capacity.instances import Rung

        last = len(self.rungs) - 1
        index, kind = 0, 0
        per_attempt: dict[int, int] = {}
        for i in interruptions:
            at = i.rung if i.rung is not None and 0 <= i.rung <= last else None
            types = self.types_for(index if at is None else at, instance_types)
            if self.instances is not None and types and self.instances.absorbs(i, types):
                index, kind = index if at is None else at, types.index(str(i.instance_type)) + 1
                continue
            per_attempt[i.attempt] = per_attempt.get(i.attempt, 0) + 1
            index = min((index + 1) if at is None else at + per_attempt[i.attempt], last)
            kind = 0
        types = self.types_for(index, instance_types)
        chosen = types[kind] if self.instances is not None and types else None
        return Rung(self.rungs[index].capacity, chosen, rung=index)

    def move_target(self, rungs_run: Sequence[int | None]) -> int:
        """The rung a move back to spot goes to: the spot rung the job was last on in this run (``rungs_run``: the
        rungs of the run's attempts, oldest first), else the ladder's first spot rung.

        The last spot rung, not the first: the ladder left every spot rung above it because of reclaims or
        capacity gaps there, and the one it was on last is the place (service, region, instance types) whose spot
        capacity the move reads, so the readings and the move are about the same place."""
        for index in reversed(rungs_run):
            rung = self.rung(index)
            if rung is not None and rung.capacity == SPOT:
                return int(index)  # type: ignore[arg-type]
        return next(k for k, r in enumerate(self.rungs) if r.capacity == SPOT)

    def rung_after_move(self, rungs_run: Sequence[int | None], instance_types: Sequence[str] = ()) -> Rung:
        """The next attempt after a move back to spot: :meth:`move_target`, at its first type (``instances=``)."""
        from gpu_provider.capacity.instances import Rung

        index = self.move_target(rungs_run)
        types = self.types_for(index, instance_types)
        return Rung(SPOT, types[0] if self.instances is not None and types else None, rung=index)

    def spot_watch(self, record: Any, run: Sequence[Any], instance_types: Sequence[str] = ()) -> dict[str, Any] | None:
        """What ``record``'s wait reads to move the job back to spot (:meth:`SpotReturn.watch_for`), for the spot
        rung the move would go to (:meth:`move_target`): that rung's instance types (``ml.`` removed) and, where
        the rung names them, its AWS connection and region (a ``SpotReturn(regions=...)`` given keeps its regions).
        ``None``: nothing to read."""
        if self.spot_return is None:
            return None
        target = self.move_target([r.rung for r in run])
        types = self.types_for(target, instance_types)
        watch = self.spot_return.watch_for(record, run, types)
        if watch is None:
            return None
        watch["instance_types"] = list(self.spot_return.watched_types(types))
        options = self.rungs[target].options
        policy = dict(watch["policy"])
        if options.get("aws_conn_id"):
            policy["aws_conn_id"] = options["aws_conn_id"]
        if not policy.get("regions") and options.get("region_name"):
            policy["regions"] = [options["region_name"]]
        watch["policy"], watch["rung"] = policy, target
        return watch

    @property
    def spot_wait_timeout_s(self) -> float | None:
        return self._spot_wait_s

    @property
    def may_use(self) -> frozenset[str]:
        return frozenset(r.capacity for r in self.rungs)

    def rung(self, index: int | None) -> LadderRung | None:
        """Rung ``index`` (``None`` when the index is not one of this ladder's: an old record, or no rung)."""
        if index is None or not 0 <= index < len(self.rungs):
            return None
        return self.rungs[index]

    # --- parse-time checks -----------------------------------------------------------------------
    def validate_rungs(
        self,
        resources: GpuResources,
        *,
        image: str | None,
        image_known: bool = True,
        priority: int | None = None,
        max_runtime_s: float | None = None,
    ) -> list[Backend]:
        """Check every rung with its own backend's validation (resources with the rung's instance types, its
        capacity, the image it runs); the first error names the rung. Returns the rungs' backends.

        :param image_known: ``False`` when the task's image is a template (checked after rendering)
        """
        import dataclasses

        from gpu_provider.capacity.instances import validate_instance_fallback

        backends = []
        for index, rung in enumerate(self.rungs):
            where = f"capacity.rungs[{index}] ({rung.backend_name}, {rung.capacity})"
            try:
                backend = rung.build()
                rung_resources = resources
                if rung.instance_types is not None:
                    rung_resources = dataclasses.replace(resources, instance_types=rung.instance_types)
                if self.spot_return is not None and rung.capacity == SPOT:  # a move back to spot reads its types
                    self.spot_return.validate(rung_resources.instance_types)
                if self.instances is not None:  # an ordered preference, one type per attempt, type by type
                    validate_instance_fallback(rung_resources.instance_types, backend=backend)
                    rung_resources = dataclasses.replace(rung_resources, instance_types=())
                backend.validate(
                    rung_resources,
                    rung.capacity,
                    multi_capacity=False,
                    priority=priority,
                    max_runtime_s=max_runtime_s,
                )
                if rung.image is not None or image_known:
                    backend.validate_image(rung.image or image)
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}: {err}") from err
            backends.append(backend)
        return backends

    def check_checkpoint(self, uri: str | None) -> None:
        """One checkpoint every rung reads and writes: a remote rung cannot read a ``file://`` path on the worker."""
        if not uri or uri.startswith("s3://"):
            return
        for index, rung in enumerate(self.rungs):
            if rung.remote:
                raise ValueError(
                    f"checkpoint={uri!r} with capacity.rungs[{index}] ({rung.backend_name}, {rung.capacity}): a "
                    f"{rung.backend_name} job cannot read a checkpoint on the worker's disk; every rung of a Ladder "
                    "reads and writes one checkpoint location, so give an s3:// URI (allowed: s3://bucket/prefix, or "
                    "file:// only when every rung is 'local')"
                )

    def __hash__(self) -> int:
        return hash(
            (type(self), self.rungs, self.max_interruptions, self._spot_wait_s, self.instances, self.spot_return)
        )

    def __repr__(self) -> str:
        rungs = ", ".join(map(repr, self.rungs))
        composed = "".join(
            f", {k}={v!r}" for k, v in (("instances", self.instances), ("spot_return", self.spot_return)) if v
        )
        return (
            f"Ladder({rungs}, spot_wait_timeout={self._spot_wait_s!r}, max_interruptions={self.max_interruptions!r}, "
            f"backoff={self.backoff_s!r}, max_node_faults={self.max_node_faults!r}{composed})"
        )
