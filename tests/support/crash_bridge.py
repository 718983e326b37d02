"""``python -m tests.support.crash_bridge run ...``: the bridge with the test-only crash engine
registered (see crash_engine.py); everything else is ``python -m tts_bridge``."""

from __future__ import annotations

from tests.support import crash_engine
from tts_bridge.cli.main import main

if __name__ == "__main__":
    crash_engine.register()
    raise SystemExit(main())
