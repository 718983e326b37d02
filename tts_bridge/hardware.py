"""Hardware detection and the thread, concurrency and memory plan that follows from it.

The bridge mostly runs on small home servers (a Raspberry Pi next to Home Assistant, a NAS, a
container with a CPU quota), where the runtimes' defaults are wrong: onnxruntime and torch start
one thread per logical CPU and ignore cgroup quotas, so two concurrent jobs on a 4-core Pi run
eight busy threads, and a container limited to 1.5 CPUs is throttled in every scheduling period.

``detect_hardware()`` reads the facts (everything under a ``root`` so tests can use a fake tree),
``plan_threads()`` turns them into a :class:`ThreadPlan` with a reason for every value, and
``apply_process_limits()`` exports the thread counts to the environment variables that native
runtimes read once, when they are first imported.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from tts_bridge.config import Settings

_LOGGER = logging.getLogger(__name__)

_MIB = 1024 * 1024

# cgroup v1 reports "no limit" as LONG_MAX rounded down to a page (9223372036854771712); some
# kernels and runtimes use other huge sentinels. No home machine has 4 EiB of RAM.
_ABSURD_MEMORY_BYTES = 1 << 62

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


# Variables native libraries read once, at import / first use, to size their thread pools:
# OpenMP (torch's intra-op pool), MKL (torch and numpy on x86), OpenBLAS (numpy, torch on ARM).
_THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")

# ``CPU part`` of ARM Ltd. cores (implementer 0x41) seen on single-board computers and ARM hosts.
_ARM_IMPLEMENTER = "0x41"
_ARM_CORE_NAMES = {
    "0xb76": "ARM1176",  # Pi 1, Pi Zero
    "0xc07": "Cortex-A7",  # Pi 2
    "0xd03": "Cortex-A53",  # Pi 3, Pi Zero 2
    "0xd04": "Cortex-A35",
    "0xd05": "Cortex-A55",
    "0xd07": "Cortex-A57",
    "0xd08": "Cortex-A72",  # Pi 4
    "0xd09": "Cortex-A73",
    "0xd0a": "Cortex-A75",
    "0xd0b": "Cortex-A76",  # Pi 5
    "0xd0c": "Neoverse-N1",
    "0xd0d": "Cortex-A77",
    "0xd40": "Neoverse-V1",
    "0xd41": "Cortex-A78",
    "0xd44": "Cortex-X1",
    "0xd46": "Cortex-A510",
    "0xd47": "Cortex-A710",
    "0xd48": "Cortex-X2",
    "0xd49": "Neoverse-N2",
    "0xd4f": "Neoverse-V2",
}


@dataclass(frozen=True)
class Hardware:
    """What the machine offers this process, as far as tuning is concerned."""

    architecture: str
    """CPU architecture as ``platform.machine()`` says: ``aarch64``, ``armv7l``, ``x86_64``."""
    logical_cpus: int
    """CPUs the kernel has online, hyper-threads included."""
    usable_cpus: int
    """Whole CPUs this process can keep busy: the logical count reduced to the process's CPU
    affinity and to a cgroup CPU quota rounded down; at least 1."""
    cpu_quota: float | None
    """Tightest cgroup CPU quota in CPUs (``1.5`` for ``cpu.max = 150000 100000``); None when
    there is no quota."""
    memory_total_bytes: int | None
    """Physical RAM (``MemTotal`` of ``/proc/meminfo``); None when it cannot be read."""
    memory_limit_bytes: int | None
    """Tightest cgroup memory limit on the way from this process's cgroup to the root; None when
    unlimited (``max``, or a sentinel too large to be real)."""
    memory_available_bytes: int | None
    """Memory that can be had now without swapping: ``MemAvailable``, reduced to the cgroup's
    headroom (limit minus usage that cannot be reclaimed); None when unknown."""
    board_model: str | None
    """Board name from the device tree (or a Raspberry Pi kernel's ``/proc/cpuinfo``), e.g.
    ``Raspberry Pi 4 Model B Rev 1.4``; None on machines without one, such as PCs."""
    cpu_model: str | None
    """CPU name: the ARM core from ``CPU part`` (``Cortex-A72``, ``Cortex-A55 + Cortex-A76`` on
    big.LITTLE), else ``model name`` (x86) or ``Model``; None when nothing says."""

    @property
    def is_x86(self) -> bool:
        """True on 32- and 64-bit x86."""
        return self.architecture.lower() in {"x86_64", "amd64", "i386", "i486", "i586", "i686"}

    @property
    def is_arm(self) -> bool:
        """True on 32- and 64-bit ARM."""
        machine = self.architecture.lower()
        return machine.startswith("arm") or machine == "aarch64"

    @property
    def is_raspberry_pi(self) -> bool:
        """True when the board says it is a Raspberry Pi."""
        return self.board_model is not None and self.board_model.startswith("Raspberry Pi")

    @property
    def usable_memory_bytes(self) -> int | None:
        """RAM this process can ever use: the smaller of physical RAM and the cgroup limit."""
        known = [b for b in (self.memory_total_bytes, self.memory_limit_bytes) if b is not None]
        return min(known) if known else None

    def describe(self) -> list[str]:
        """Human-readable lines for logs and ``doctor``."""
        lines = []
        if self.board_model:
            lines.append(f"board: {self.board_model}")
        cpu = self.cpu_model or "unknown CPU"
        lines.append(
            f"cpu: {cpu} ({self.architecture}), {self.logical_cpus} logical, "
            f"{self.usable_cpus} usable"
        )
        if self.cpu_quota is not None:
            lines.append(f"cgroup cpu quota: {self.cpu_quota:g} CPUs")
        lines.append(
            f"memory: {_mb_text(self.memory_total_bytes)} total, "
            f"{_mb_text(self.memory_available_bytes)} available, "
            f"cgroup limit {_mb_text(self.memory_limit_bytes, none='none')}"
        )
        return lines


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


def detect_hardware(root: Path = Path("/"), *, architecture: str | None = None) -> Hardware:
    """Read CPU, memory, cgroup and board facts from ``/proc`` and ``/sys`` under ``root``.

    ``architecture`` replaces ``platform.machine()`` (tests use it with a fake tree). The
    process's CPU affinity is only consulted when ``root`` is the real ``/``: a fake tree says
    nothing about the process running the test.
    """
    is_real_root = root.resolve() == Path("/").resolve()
    cpuinfo = _parse_colon_pairs(_read_text(root / "proc/cpuinfo") or "")
    cgroups = _process_cgroups(root)

    logical = _logical_cpus(root, cpuinfo, is_real_root)
    usable = logical
    if is_real_root and hasattr(os, "sched_getaffinity"):
        # Docker's --cpuset-cpus and taskset both show up here; the kernel already applied them.
        usable = min(usable, len(os.sched_getaffinity(0)))
    quota = _cpu_quota(root, cgroups)
    if quota is not None:
        # Rounded down: with a 1.5-CPU quota two busy threads use it up 75 ms into every 100 ms
        # period and both stall for the rest, adding jitter to every operator; one never stalls.
        usable = min(usable, max(1, math.floor(quota)))

    meminfo = _parse_meminfo(_read_text(root / "proc/meminfo") or "")
    limit, headroom = _memory_limit(root, cgroups)
    available = meminfo.get("MemAvailable")
    if headroom is not None:
        available = headroom if available is None else min(available, headroom)

    hardware = Hardware(
        architecture=architecture if architecture is not None else platform.machine(),
        logical_cpus=logical,
        usable_cpus=max(1, usable),
        cpu_quota=quota,
        memory_total_bytes=meminfo.get("MemTotal"),
        memory_limit_bytes=limit,
        memory_available_bytes=available,
        board_model=_board_model(root, cpuinfo),
        cpu_model=_cpu_model(cpuinfo),
    )
    _LOGGER.debug("Detected hardware: %s", hardware)
    return hardware


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


def plan_for_settings(settings: Settings, hw: Hardware | None = None) -> ThreadPlan:
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


def apply_process_limits(
    plan: ThreadPlan, environ: MutableMapping[str, str] | None = None
) -> dict[str, str]:
    """Export the plan's per-job thread count to OMP/MKL/OpenBLAS variables not already set.

    Call this at start-up, before torch or numpy is imported: OpenMP, MKL and OpenBLAS size their
    thread pools from these variables once, when the library loads, and default to every logical
    CPU (ignoring cgroup quotas). A variable that is already set is left alone: whoever set it
    (a compose file, a systemd unit) chose deliberately. onnxruntime does not read them; engines
    pass the plan to ``SessionOptions``, and torch engines still call ``torch.set_num_threads``.

    Returns the variables that were set. ``environ`` defaults to ``os.environ``.
    """
    target = os.environ if environ is None else environ
    value = str(plan.torch_threads)
    applied = {}
    for name in _THREAD_ENV_VARS:
        if name not in target:
            target[name] = value
            applied[name] = value
    if environ is None and applied:
        too_late = [module for module in ("torch", "numpy") if module in sys.modules]
        if too_late:
            _LOGGER.warning(
                "%s already imported: %s may not apply to its thread pool",
                ", ".join(too_late),
                ", ".join(applied),
            )
    _LOGGER.debug("Thread environment set: %s", applied)
    return applied


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


def _read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except OSError:
        return None


def _parse_colon_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs


def _parse_meminfo(text: str) -> dict[str, int]:
    values = {}
    for key, value in _parse_colon_pairs(text):
        number, _, unit = value.partition(" ")
        if not number.isdigit():
            continue
        values[key] = int(number) * (1024 if unit.strip() == "kB" else 1)
    return values


def _count_cpu_list(text: str) -> int | None:
    """Count the CPUs in a kernel CPU list such as ``0-3,6,8-9``."""
    total = 0
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            return None
        total += (int(last) - int(first) + 1) if last else 1
    return total or None


def _logical_cpus(root: Path, cpuinfo: list[tuple[str, str]], is_real_root: bool) -> int:
    online = _count_cpu_list(_read_text(root / "sys/devices/system/cpu/online") or "")
    if online:
        return online
    # Old 32-bit ARM kernels also print "Processor : ARMv7 ..." (capital P): not a CPU entry.
    listed = sum(1 for key, value in cpuinfo if key == "processor" and value.isdigit())
    if listed:
        return listed
    return (os.cpu_count() or 1) if is_real_root else 1


def _board_model(root: Path, cpuinfo: list[tuple[str, str]]) -> str | None:
    for path in ("proc/device-tree/model", "sys/firmware/devicetree/base/model"):
        text = _read_text(root / path)
        if text is not None:
            model = text.split("\x00", 1)[0].strip()
            if model:
                return model
    # Docker masks /sys/firmware, but Raspberry Pi kernels repeat the board in /proc/cpuinfo.
    return next((value for key, value in cpuinfo if key == "Model" and value), None)


def _cpu_model(cpuinfo: list[tuple[str, str]]) -> str | None:
    cores: list[str] = []
    implementer = None
    for key, value in cpuinfo:
        if key == "CPU implementer":
            implementer = value.lower()
        elif key == "CPU part" and implementer == _ARM_IMPLEMENTER:
            name = _ARM_CORE_NAMES.get(value.lower())
            if name and name not in cores:
                cores.append(name)
    if cores:
        # big.LITTLE chips (RK3588: 4x A55 + 4x A76) list each kind of core once.
        return " + ".join(cores)
    for wanted in ("model name", "Model", "CPU part"):
        for key, value in cpuinfo:
            if key == wanted and value:
                return f"ARM CPU part {value}" if wanted == "CPU part" else value
    return None


def _process_cgroups(root: Path) -> dict[str, str]:
    """Map each cgroup controller (``""`` for the v2 hierarchy) to this process's cgroup path."""
    paths: dict[str, str] = {}
    for line in (_read_text(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _cgroup_dirs(mount: Path, path: str | None) -> list[Path]:
    """The mount's root and every existing directory down to the process's own cgroup.

    Limits nest, so the tightest one anywhere on the way applies: a systemd unit's
    ``MemoryMax=`` sits in ``system.slice/<unit>``, a container's in the namespace root.
    """
    dirs = [mount]
    parts = [part for part in (path or "").split("/") if part]
    # "/../.." means the process sits outside this cgroup namespace; its own limits are not
    # visible from here, so only the mount's root is read.
    if ".." not in parts:
        for depth in range(1, len(parts) + 1):
            directory = mount.joinpath(*parts[:depth])
            if directory.is_dir():
                dirs.append(directory)
    return dirs


def _v1_mounts(root: Path, controller: str) -> list[Path]:
    # Distributions mount cpu and cpuacct together under either order, plus "cpu" symlinks.
    names = ("cpu", "cpu,cpuacct", "cpuacct,cpu") if controller == "cpu" else (controller,)
    return [root / "sys/fs/cgroup" / name for name in names]


def _read_int(path: Path) -> int | None:
    text = (_read_text(path) or "").strip()
    try:
        return int(text)
    except ValueError:
        return None


def _cpu_quota(root: Path, cgroups: Mapping[str, str]) -> float | None:
    quotas = []
    for directory in _cgroup_dirs(root / "sys/fs/cgroup", cgroups.get("")):
        fields_ = (_read_text(directory / "cpu.max") or "").split()
        if len(fields_) == 2 and fields_[0].isdigit() and fields_[1].isdigit():
            quota, period = int(fields_[0]), int(fields_[1])
            if quota > 0 and period > 0:
                quotas.append(quota / period)
    for mount in _v1_mounts(root, "cpu"):
        for directory in _cgroup_dirs(mount, cgroups.get("cpu")):
            quota_us = _read_int(directory / "cpu.cfs_quota_us")
            period_us = _read_int(directory / "cpu.cfs_period_us")
            # -1 is v1's "no quota".
            if quota_us is not None and period_us and quota_us > 0 and period_us > 0:
                quotas.append(quota_us / period_us)
    return min(quotas) if quotas else None


def _memory_limit(root: Path, cgroups: Mapping[str, str]) -> tuple[int | None, int | None]:
    """The tightest cgroup memory limit and the headroom left under it (both None if none)."""
    limits: list[int] = []
    headrooms: list[int] = []
    candidates = [
        (directory, "memory.max", "memory.current", "inactive_file")
        for directory in _cgroup_dirs(root / "sys/fs/cgroup", cgroups.get(""))
    ]
    candidates += [
        (directory, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file")
        for mount in _v1_mounts(root, "memory")
        for directory in _cgroup_dirs(mount, cgroups.get("memory"))
    ]
    for directory, limit_file, usage_file, inactive_key in candidates:
        limit = _read_int(directory / limit_file)  # "max" does not parse: no limit
        if limit is None or not 0 < limit < _ABSURD_MEMORY_BYTES:
            continue
        limits.append(limit)
        usage = _read_int(directory / usage_file)
        if usage is not None:
            # Usage counts the page cache, which the kernel reclaims before it hits the limit;
            # `docker stats` subtracts the inactive file pages for the same reason.
            stat = dict(_parse_stat(_read_text(directory / "memory.stat") or ""))
            usage = max(0, usage - stat.get(inactive_key, 0))
            headrooms.append(max(0, limit - usage))
    return (min(limits) if limits else None, min(headrooms) if headrooms else None)


def _parse_stat(text: str) -> list[tuple[str, int]]:
    pairs = []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            pairs.append((key, int(value)))
    return pairs


def _mb_text(value: int | None, none: str = "unknown") -> str:
    return none if value is None else f"{value // _MIB} MB"
