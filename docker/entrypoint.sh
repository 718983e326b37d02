#!/bin/sh
# Container entry point: run the bridge, with the mounted configuration file when there is one.
# Thin on purpose: settings come from that file and from TTS_BRIDGE_* variables, which
# tts-bridge reads itself; arguments (`docker run IMAGE --debug`) go to `tts-bridge run`.
# A TTS_BRIDGE_CONFIG naming a missing file is left for tts-bridge to report, not ignored.
set -eu
config="${TTS_BRIDGE_CONFIG:-/config/config.yaml}"
if [ -f "$config" ]; then
    exec tts-bridge run --config "$config" "$@"
fi
exec tts-bridge run "$@"
