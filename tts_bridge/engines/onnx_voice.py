"""What every ONNX voice engine shares: one model file, a session built lazily from the pool's
thread plan, unload, and an identity that names the model file's hash.

The plan (``OnnxSessionPlan``) is the ARM tuning the bridge promises: intra- and inter-op
threads, spinning and the CPU memory arena. ``session_options`` turns it into onnxruntime's
``SessionOptions`` whole, so no engine takes the thread count and drops the rest.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tts_bridge.text.sentences import drop_chattts_tags

if TYPE_CHECKING:
    from tts_bridge.system.threads import OnnxSessionPlan

_LOGGER = logging.getLogger(__name__)

CPU = ["CPUExecutionProvider"]


def session_options(plan: OnnxSessionPlan) -> Any:
    """onnxruntime ``SessionOptions`` that follow ``plan`` whole."""
    return options_for(
        plan.intra_op_threads,
        inter_op_threads=plan.inter_op_threads,
        spinning=plan.spinning,
        arena=plan.arena,
    )


def options_for(
    threads: int, *, inter_op_threads: int = 1, spinning: bool = True, arena: bool = True
) -> Any:
    """onnxruntime ``SessionOptions``: intra-op ``threads``, sequential execution.

    ``spinning`` lets idle worker threads busy-wait for the next operator (onnxruntime's
    default). A GPT step is a thousand small operators, so on cores of its own spinning makes a
    loop markedly faster. When other processes want the cores it is a cliff instead: the pool
    waits on descheduled threads (docs/benchmarks.md has the figures). The plan turns it off
    where it expects to share the cores.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.intra_op_num_threads = max(1, threads)
    options.inter_op_num_threads = max(1, inter_op_threads)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_cpu_mem_arena = arena
    options.log_severity_level = 3  # warnings about unused initializers are noise here
    return options


def new_session(model: Path | bytes, plan: OnnxSessionPlan) -> Any:
    """An onnxruntime CPU session of ``model`` (a file, or the model's bytes) under ``plan``."""
    import onnxruntime as ort

    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, sess_options=session_options(plan), providers=CPU)


class OnnxVoice:
    """Base of the ONNX voice engines. A subclass sets ``name`` and implements ``_open`` (the
    runtime object around a new session) and ``synthesize``; it may override ``_forget`` to drop
    caches of its own at unload and ``_stem`` to name its model in the identity."""

    name: str

    def __init__(self, model: Path, model_sha256: str, plan: OnnxSessionPlan) -> None:
        self._model = model
        self._sha256 = model_sha256
        self._plan = plan
        self._runtime: Any = None
        self._lock = threading.Lock()

    @property
    def plan(self) -> OnnxSessionPlan:
        return self._plan

    @property
    def _stem(self) -> str:
        return self._model.stem

    @property
    def identity(self) -> str:
        # The hash is part of it: a replaced model file must not answer from the old cache.
        return f"{self.name}:{self._stem}:{self._sha256[:16]}"

    @property
    def loaded(self) -> bool:
        return self._runtime is not None

    @staticmethod
    def prepare_text(text: str) -> str:
        # ChatTTS's control tags reach this voice when a ChatTTS voice's request is routed to
        # it (the fast tier); read out, they are words ("uv break").
        return drop_chattts_tags(text)

    def _open(self) -> Any:
        """The loaded runtime (a session, or a library object holding one), built under the
        plan. Called once per load, holding the lock."""
        raise NotImplementedError

    def _forget(self) -> None:
        """Drop what the subclass keeps besides the runtime (called at unload)."""

    def runtime(self) -> Any:
        """The loaded runtime, loading it first when needed."""
        self.load()
        return self._runtime

    def load(self) -> None:
        with self._lock:
            if self._runtime is not None:
                return
            self._runtime = self._open()
            _LOGGER.info(
                "Loaded %s (%d threads, spinning %s, arena %s)",
                self.identity,
                self._plan.intra_op_threads,
                "on" if self._plan.spinning else "off",
                "on" if self._plan.arena else "off",
            )

    def unload(self) -> None:
        with self._lock:
            self._runtime = None
            self._forget()
