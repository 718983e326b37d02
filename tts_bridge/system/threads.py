"""The thread, concurrency and memory plan that follows from the hardware.

On a small board the runtimes' defaults are wrong (one thread per logical CPU, cgroup quotas
ignored: two concurrent jobs on a 4-core Pi run eight busy threads). ``plan_threads()`` turns
the detected :class:`~tts_bridge.system.hardware.Hardware` into a :class:`ThreadPlan` with a
reason for every value; engines pass it to their runtimes (onnxruntime's session options,
``torch.set_num_threads``), and ``numpy_blas_on_one_thread()`` keeps numpy's BLAS pool off
the engines' cores.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal, Protocol

from tts_bridge.system.hardware import Hardware, detect_hardware

_LOGGER = logging.getLogger(__name__)

_MIB = 1024 * 1024

# Per job, batch-1 autoregressive decoding stops scaling early. The project's measured advice for
# 4-core ARM boards is two threads per job (the SoC's memory bandwidth, not its cores, is the
# limit); on x86 four threads take most of the gain. More cores are better spent on another job.
_INTRA_OP_CAP_SMALL_BOARD = 2
_INTRA_OP_CAP = 4
# Up to this many usable CPUs a board counts as "small" (Pi 4/5, Rockchip boards up to 8 cores).
_SMALL_BOARD_MAX_CPUS = 8
# One announcement at a time on small machines: splitting 4 cores between two jobs makes the
# first announcement finish later, and a speaker waiting for it is what the user notices.
_SINGLE_JOB_MAX_CPUS = 4
_MAX_CONCURRENCY = 4
# Memory each concurrent job is allowed from the budget. The whole-process peak of the ONNX fast
# tiers was measured at 240-470 MB, so 512 MB keeps a second job from pushing past the budget.
_MB_PER_CONCURRENT_JOB = 512

# Share of the machine's (or cgroup's) RAM the bridge plans to use; the rest stays for the OS,
# the page cache that makes cache hits fast, and whatever else shares a small home server.
_MEMORY_SHARE = 0.6
# Share of what is free right now: other services already hold their memory, and leaving some
# of MemAvailable (which counts reclaimable page cache) avoids evicting everyone else's cache.
_AVAILABLE_SHARE = 0.8
# Used when RAM cannot be read at all: small enough for a 1 GB board.
_UNKNOWN_MEMORY_BUDGET_MB = 512

# Linux CFS weights: nice 10 gets ~10% of a CPU against a nice-0 thread, nice 19 only ~1.5%,
# which on a busy box starves background pre-rendering entirely.
_IDLE_NICE = 10

# onnxruntime's intra-op pool lets idle worker threads busy-wait ("spin") for the next operator.
# Measured on a 2-core x86 machine, ChatTTS GPT decode loop (a thousand small operators per
# token), 2 threads: with the cores to itself spinning gave +37 % tokens/s (INT8: 67 vs 49);
# with one other busy process on the same cores it was a cliff instead, 10 tokens/s spinning
# against 25 without, because every operator waits for a pool thread the kernel has descheduled
# while its sibling burns the time slice spinning. The automatic rule therefore keeps spinning
# only where the plan gives the bridge its cores to itself, and turns it off when the plan itself
# expects to share them:
# - a cgroup CPU quota smaller than the CPUs the kernel shows: spinning threads burn quota, the
#   whole cgroup is throttled for the rest of the period, and the quota's CPUs are shared with
#   everything else in the container;
# - synthesis jobs x threads per job (ONNX or torch, whichever is larger) above the usable CPUs:
#   the jobs' threads compete with each other.
# Other programs on the same machine cannot be foreseen at start-up; where they are busy (a home
# server running much else), set synthesis.onnx_spinning: off.
SpinningMode = Literal["auto", "on", "off"]


@dataclass(frozen=True)
class ThreadPlan:
    """How many threads and jobs to run and how much memory to use, with the reasons."""

    onnx_intra_op_threads: int
    """onnxruntime threads inside one operator, per job (``SessionOptions.intra_op_num_threads``).
    onnxruntime ignores ``OMP_NUM_THREADS``, so engines must pass this explicitly."""
    onnx_inter_op_threads: int
    """onnxruntime threads running independent operators side by side
    (``SessionOptions.inter_op_num_threads``); only used in parallel execution mode."""
    torch_threads: int
    """``torch.set_num_threads`` for the torch quality tier (process-wide in torch)."""
    synthesis_concurrency: int
    """Synthesis jobs running at the same time, live and background work together."""
    idle_nice: int
    """Niceness increment (0-19) a thread doing background work (pre-rendering, quality
    upgrades) applies to itself; on Linux niceness is per thread, so live jobs keep theirs."""
    memory_budget_mb: int
    """MiB that loaded models and running jobs may use together before models are unloaded."""
    onnx_spinning: bool = True
    """Whether onnxruntime's idle intra-op threads busy-wait for work (``allow_spinning``)."""
    onnx_arena: bool = True
    """onnxruntime's CPU memory arena (``enable_cpu_mem_arena``)."""
    reasons: tuple[str, ...] = ()
    """Why each value was chosen (or that it was overridden), one line per value, then warnings."""

    def onnx_session(self) -> OnnxSessionPlan:
        """The onnxruntime session options every ONNX engine gets from this plan."""
        return OnnxSessionPlan(
            intra_op_threads=self.onnx_intra_op_threads,
            inter_op_threads=self.onnx_inter_op_threads,
            spinning=self.onnx_spinning,
            arena=self.onnx_arena,
        )

    def describe(self) -> list[str]:
        """Human-readable lines for logs and ``doctor``: the plan, then the reasons."""
        lines = [
            f"synthesis: {self.synthesis_concurrency} job(s) at a time, "
            f"onnxruntime {self.onnx_intra_op_threads} intra-op / "
            f"{self.onnx_inter_op_threads} inter-op thread(s) per job, "
            f"torch {self.torch_threads} thread(s)",
            self.onnx_session().describe(),
            f"background work: niceness +{self.idle_nice}",
            f"memory budget: {self.memory_budget_mb} MB",
        ]
        lines.extend(f"- {reason}" for reason in self.reasons)
        return lines


@dataclass(frozen=True)
class OnnxSessionPlan:
    """onnxruntime ``SessionOptions`` for every ONNX engine, as far as each engine takes them."""

    intra_op_threads: int
    """``intra_op_num_threads``: threads inside one operator."""
    inter_op_threads: int = 1
    """``inter_op_num_threads``: only used by onnxruntime's parallel execution mode."""
    spinning: bool = True
    """``session.intra_op.allow_spinning``: idle pool threads busy-wait for the next operator."""
    arena: bool = True
    """``enable_cpu_mem_arena``: faster allocation, at the price of keeping the peak memory."""
    execution_mode: Literal["sequential"] = "sequential"
    """Always sequential: the speech graphs are chains with nothing to run side by side."""

    def describe(self) -> str:
        return (
            f"onnxruntime sessions: {self.execution_mode} execution, spinning "
            f"{_on_off(self.spinning)}, CPU memory arena {_on_off(self.arena)}"
        )


def _on_off(value: bool) -> str:
    return "on" if value else "off"


# Values an override may take; the upper bounds only catch typos (a thread count of 1000).
_OVERRIDE_RANGES: dict[str, tuple[int, int]] = {
    "onnx_intra_op_threads": (1, 256),
    "onnx_inter_op_threads": (1, 256),
    "torch_threads": (1, 256),
    "synthesis_concurrency": (1, 64),
    "idle_nice": (0, 19),
    "memory_budget_mb": (1, 16 * 1024 * 1024),
}


def plan_threads(
    hw: Hardware,
    overrides: Mapping[str, int | None] | None = None,
    *,
    spinning: SpinningMode = "auto",
    arena: bool = True,
) -> ThreadPlan:
    """Choose thread counts, concurrency, niceness and a memory budget for ``hw``.

    ``overrides`` maps :class:`ThreadPlan` field names to values; None (or a missing key) means
    "choose automatically". Values that are not overridden adapt to those that are, so that
    concurrency x threads per job stays within the usable CPUs; when the overrides themselves
    exceed them, they are kept and a warning is added to the reasons. ``spinning`` is
    onnxruntime's thread spinning (``auto``: see :func:`choose_spinning`); ``arena`` its CPU
    memory arena.
    """
    if spinning not in ("auto", "on", "off"):
        raise ValueError(f"onnx spinning must be auto, on or off, got {spinning!r}")
    given = _check_overrides(overrides or {})
    cores = hw.usable_cpus

    memory_mb, memory_why = _plan_memory(hw)
    if "memory_budget_mb" in given:
        memory_mb, memory_why = given["memory_budget_mb"], "set by configuration"

    intra_auto, intra_why = _plan_intra_op(hw)

    if "synthesis_concurrency" in given:
        concurrency = given["synthesis_concurrency"]
        concurrency_why = "set by configuration"
        if "onnx_intra_op_threads" not in given and concurrency * intra_auto > cores:
            intra_auto = max(1, cores // concurrency)
            intra_why = f"fewer per job so that {concurrency} jobs fit in {cores} usable CPUs"
    if "onnx_intra_op_threads" in given:
        intra, intra_why = given["onnx_intra_op_threads"], "set by configuration"
    else:
        intra = intra_auto

    if "synthesis_concurrency" not in given:
        concurrency, concurrency_why = _plan_concurrency(cores, intra, memory_mb)

    torch_threads = given.get("torch_threads", intra)
    torch_why = (
        "set by configuration"
        if "torch_threads" in given
        else "same as the ONNX intra-op threads: torch's pool is process-wide and shares the "
        "CPUs with the same jobs"
    )
    inter = given.get("onnx_inter_op_threads", 1)
    inter_why = (
        "set by configuration"
        if "onnx_inter_op_threads" in given
        else "the speech models are chains of operators with nothing to run side by side, "
        "and a second pool only adds idle threads"
    )
    nice = given.get("idle_nice", _IDLE_NICE)
    nice_why = (
        "set by configuration"
        if "idle_nice" in given
        else "background pre-rendering yields to live requests and other "
        "services (about 10% of a CPU against them) without starving as it would at +19"
    )

    spin, spin_why = choose_spinning(
        spinning, hw, threads=max(intra, torch_threads), concurrency=concurrency
    )
    arena_why = (
        "onnxruntime's default: faster allocation, peak memory kept for the next request"
        if arena
        else "set by configuration: memory goes back after each run, allocation is slower"
    )

    reasons = [
        f"onnx_intra_op_threads={intra}: {intra_why}",
        f"onnx_inter_op_threads={inter}: {inter_why}",
        f"onnx_spinning={_on_off(spin)}: {spin_why}",
        f"onnx_arena={_on_off(arena)}: {arena_why}",
        f"torch_threads={torch_threads}: {torch_why}",
        f"synthesis_concurrency={concurrency}: {concurrency_why}",
        f"idle_nice={nice}: {nice_why}",
        f"memory_budget_mb={memory_mb}: {memory_why}",
    ]
    for per_job, name in ((intra, "ONNX intra-op"), (torch_threads, "torch")):
        if concurrency * per_job > cores:
            warning = (
                f"warning: {concurrency} jobs x {per_job} {name} threads = "
                f"{concurrency * per_job} busy threads on {cores} usable CPUs; "
                "expect every job to be slower"
            )
            _LOGGER.warning("Thread plan oversubscribes the CPUs: %s", warning)
            reasons.append(warning)

    return ThreadPlan(
        onnx_intra_op_threads=intra,
        onnx_inter_op_threads=inter,
        torch_threads=torch_threads,
        synthesis_concurrency=concurrency,
        idle_nice=nice,
        memory_budget_mb=memory_mb,
        onnx_spinning=spin,
        onnx_arena=arena,
        reasons=tuple(reasons),
    )


def choose_spinning(
    mode: SpinningMode, hw: Hardware, *, threads: int, concurrency: int
) -> tuple[bool, str]:
    """Whether onnxruntime's pool threads spin, and why (the rule is explained at the top).

    ``threads`` is the busiest job's thread count, ``concurrency`` the jobs at a time.
    """
    if mode != "auto":
        return mode == "on", "set by configuration"
    cores = hw.usable_cpus
    if hw.cpu_quota is not None and hw.cpu_quota < hw.logical_cpus:
        return False, (
            f"the cgroup CPU quota ({hw.cpu_quota:g} CPUs) is smaller than the "
            f"{hw.logical_cpus} CPUs the kernel shows: the cores are shared, and a spinning pool "
            "burns the quota (measured: 10 tokens/s spinning vs 25 without on shared cores)"
        )
    if concurrency * threads > cores:
        return False, (
            f"{concurrency} job(s) x {threads} thread(s) exceed {cores} usable CPUs: the jobs "
            "share cores, where spinning is a cliff (measured: 10 tokens/s vs 25 without)"
        )
    return True, (
        f"{concurrency} job(s) x {threads} thread(s) fit in {cores} usable CPUs without a quota: "
        "the cores are the bridge's, and spinning is faster there (measured: +37 % tokens/s); "
        "set synthesis.onnx_spinning: off if other busy programs share this machine"
    )


class SynthesisChoices(Protocol):
    """The synthesis settings a plan follows (the speech core's synthesis section): this module
    reads them without importing the settings, so the engines that use the plan do not."""

    @property
    def workers(self) -> int | None: ...
    @property
    def onnx_threads(self) -> int | None: ...
    @property
    def onnx_inter_op_threads(self) -> int | None: ...
    @property
    def onnx_spinning(self) -> SpinningMode: ...
    @property
    def onnx_arena(self) -> bool: ...


class WithSynthesis(Protocol):
    """Settings that hold a synthesis section."""

    @property
    def synthesis(self) -> SynthesisChoices: ...


def plan_for_settings(settings: WithSynthesis, hw: Hardware | None = None) -> ThreadPlan:
    """The plan for ``hw`` (default: this machine) with the settings' explicit values."""
    synthesis = settings.synthesis
    return plan_threads(
        hw if hw is not None else detect_hardware(),
        {
            "onnx_intra_op_threads": synthesis.onnx_threads,
            "onnx_inter_op_threads": synthesis.onnx_inter_op_threads,
            "synthesis_concurrency": synthesis.workers,
        },
        spinning=synthesis.onnx_spinning,
        arena=synthesis.onnx_arena,
    )


def numpy_blas_on_one_thread() -> int:
    """Run numpy's own BLAS (the OpenBLAS its wheel carries) on one thread, process-wide;
    returns how many BLAS libraries were limited.

    The bridge's numpy work is small products (the loudness filter's blocks) on a worker that
    an engine's threads have just left: a pool of one thread per CPU cuts each into pieces too
    small to pay for the hand-over, and its threads spin after each one, on the cores the next
    engine run needs. Other libraries' BLAS (torch's) keep their pools."""
    import numpy  # noqa: F401  (its BLAS is found only once it is loaded)
    from threadpoolctl import ThreadpoolController

    controller = ThreadpoolController()
    paths = [
        lib.filepath
        for lib in controller.lib_controllers
        if lib.user_api == "blas" and "numpy" in Path(lib.filepath).parent.name
    ]
    if paths:
        controller.select(filepath=paths).limit(limits=1)
    _LOGGER.debug("numpy's BLAS on one thread: %s", paths or "none found")
    return len(paths)


# --- planning helpers -----------------------------------------------------------------------


def _plan_memory(hw: Hardware) -> tuple[int, str]:
    usable = hw.usable_memory_bytes
    if usable is None:
        return _UNKNOWN_MEMORY_BUDGET_MB, "RAM could not be read; a budget that fits a 1 GB board"
    source = (
        "the cgroup memory limit"
        if hw.memory_limit_bytes is not None and hw.memory_limit_bytes == usable
        else "RAM"
    )
    budget = int(usable * _MEMORY_SHARE / _MIB)
    why = (
        f"{_MEMORY_SHARE:.0%} of {source} ({usable // _MIB} MB), the rest for the OS, "
        "the page cache and other services"
    )
    available = hw.memory_available_bytes
    if available is not None and int(available * _AVAILABLE_SHARE / _MIB) < budget:
        budget = int(available * _AVAILABLE_SHARE / _MIB)
        why = (
            f"{_AVAILABLE_SHARE:.0%} of the {available // _MIB} MB available now, which is less "
            f"than {_MEMORY_SHARE:.0%} of {source}: other programs hold the rest"
        )
    return max(1, budget), why


def _plan_intra_op(hw: Hardware) -> tuple[int, str]:
    cores = hw.usable_cpus
    # ARM and other non-x86 boards up to 8 cores are single-board computers; bigger ARM machines
    # (servers, workstations) have the memory bandwidth to feed x86-like thread counts.
    small_board = not hw.is_x86 and cores <= _SMALL_BOARD_MAX_CPUS
    cap = _INTRA_OP_CAP_SMALL_BOARD if small_board else _INTRA_OP_CAP
    threads = min(cap, cores)
    if threads == cores:
        why = f"all {cores} usable CPU(s) for the job"
    elif small_board:
        why = (
            f"{threads} of {cores} usable CPUs per job: on a small board like a Raspberry Pi "
            "memory bandwidth, not the core count, limits a job beyond 2 threads, and the other "
            "cores stay free for the OS, MQTT and other services"
        )
    else:
        why = (
            f"{threads} of {cores} usable CPUs per job: one request gains little beyond "
            f"{_INTRA_OP_CAP} threads, so the other cores serve more jobs"
        )
    if hw.cpu_quota is not None and cores < hw.logical_cpus:
        why += f" (the cgroup CPU quota of {hw.cpu_quota:g} is rounded down to whole CPUs)"
    return threads, why


def _plan_concurrency(cores: int, intra: int, memory_mb: int) -> tuple[int, str]:
    if cores <= _SINGLE_JOB_MAX_CPUS:
        why = (
            f"one job at a time on {cores} usable CPUs, so the announcement someone is waiting "
            "for gets all of them; later requests wait in arrival order (those routed to the "
            "fast voice take a lane of their own)"
        )
        if cores >= 2 * intra and memory_mb >= 2 * _MB_PER_CONCURRENT_JOB:
            # A 4-core board with 2 GB or more has room for two 2-thread jobs. Whether that
            # beats one job depends on the models and on the board's cooling (a Pi 4 without
            # a heatsink throttles under four busy cores), so it is the user's call after
            # measuring; it is not worth guessing.
            why += (
                "; 2 fit (set synthesis_concurrency: 2) if `tts-bridge bench` shows more "
                "total throughput on this board"
            )
        return 1, why
    by_cpu = max(1, cores // intra)
    by_memory = max(1, memory_mb // _MB_PER_CONCURRENT_JOB)
    concurrency = min(by_cpu, by_memory, _MAX_CONCURRENCY)
    if concurrency == by_memory and by_memory < min(by_cpu, _MAX_CONCURRENCY):
        why = (
            f"{concurrency}: the memory budget allows {_MB_PER_CONCURRENT_JOB} MB per job, "
            f"though the CPUs would allow {min(by_cpu, _MAX_CONCURRENCY)}"
        )
    else:
        why = (
            f"{concurrency} x {intra} threads within {cores} usable CPUs "
            f"(at most {_MAX_CONCURRENCY}: more jobs only lengthen each one)"
        )
    return concurrency, why


def _check_overrides(overrides: Mapping[str, int | None]) -> dict[str, int]:
    given: dict[str, int] = {}
    for name, value in overrides.items():
        if name not in _OVERRIDE_RANGES:
            known = ", ".join(f.name for f in fields(ThreadPlan) if f.name in _OVERRIDE_RANGES)
            raise ValueError(f"unknown tuning override {name!r}; known: {known}")
        if value is None:
            continue
        low, high = _OVERRIDE_RANGES[name]
        # bool is an int subclass; "true" threads is a configuration mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ValueError(
                f"tuning override {name} must be an integer from {low} to {high} "
                f"(or null for automatic), got {value!r}"
            )
        given[name] = value
    return given


# --- detection helpers ----------------------------------------------------------------------
