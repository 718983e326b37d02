"""Model downloads from a Hugging Face-compatible hub: ``tts-bridge models download``.

Only the command line downloads; the bridge never does (a voice whose files are missing is
refused at start with the command that fetches them, see ``layout.fetch_hint``).

* ``fetch`` -- the hub calls (``huggingface_hub``, honouring ``HF_ENDPOINT``), the staging folder
  a download lands in before it is verified, the disk-space check and the one error type.
* ``progress`` -- one progress display for a whole command (a bar on a terminal, lines
  otherwise).
* ``chattts`` -- the ChatTTS checkpoint, verified against ChatTTS's ``sha256_map.json``, then
  exported to ONNX, quantized and given a default voice.
* ``piper`` -- Piper voices from ``rhasspy/piper-voices``, verified against its ``voices.json``.
* ``kokoro`` -- Kokoro v1.0 voices beyond the shipped ones, verified against the digests the
  project ships.
* ``layout`` -- where downloaded models live in ``models.dir`` (cheap: no hub client imported).
"""
