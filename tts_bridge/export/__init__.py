"""Model conversion that runs once, offline, with the heavy toolchain (torch, onnx).

``chattts_onnx.export_chattts`` turns a ChatTTS checkpoint into ONNX graphs plus a few numpy
arrays; ``quantize.quantize_onnx`` makes INT8 variants of the graphs where that pays. The result
is loaded by ``tts_bridge.engines.chattts_onnx`` with onnxruntime alone (no torch).
"""
