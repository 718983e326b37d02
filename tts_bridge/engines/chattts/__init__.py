"""ChatTTS, one family: shared code, the torch engine, the ONNX engine and its runtime, the
refine pass, and the one-off export and quantization (torch and onnx imported inside)."""
